"""``data.vocab=sentencepiece``: the trainer trains one SentencePiece model per language on the kept training
pairs, says how many pieces each got, counts the length limits in pieces, and a resumed run reloads the same
models; the word path is unchanged."""

import pathlib

import pytest

from attn_jax import data
from attn_jax.train import ConfigError, apply_overrides, check_config, load_config, make_inputs
from attn_jax.train._loop import _data_lines

_ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = _ROOT / "tests" / "data" / "own_corpus"


def _config(*extra: str):
    overrides = [
        "data.corpus=plain",
        f"data.source_path={CORPUS}/{{split}}.en",
        f"data.target_path={CORPUS}/{{split}}.fr",
        "data.prefetch=0",
        *extra,
    ]
    return apply_overrides(load_config(str(_ROOT / "configs" / "rnnsearch_cpu.py")), overrides)


def test_sentencepiece_vocabularies_are_trained_reported_and_reloaded(tmp_path):
    config = _config(
        "data.vocab=sentencepiece",
        "data.src_vocab_size=8000",
        "data.tgt_vocab_size=100",
        "data.max_source_length=12",
    )
    check_config(config)
    inputs = make_inputs(config, str(tmp_path / "vocab"), reuse_vocab=False)
    src, tgt = inputs.src_vocab, inputs.tgt_vocab
    assert isinstance(src, data.SentencePieceVocabulary) and isinstance(tgt, data.SentencePieceVocabulary)
    assert not src.word_level
    train = data.read_plain_corpus(CORPUS / "train.en", CORPUS / "train.fr")
    # Trained on the 399 pairs with both sides (one has an empty French side) of at most 12 / 30 words.
    within = [i for i in range(len(train)) if len(train.sources[i].split()) <= 12]
    assert len(within) == 399
    want = data.SentencePieceVocabulary.train([train.sources[i] for i in within], 8004)
    assert src == want  # deterministic: the same sentences give the same model
    assert tgt.size == 104  # 100 pieces and the four specials: the corpus supports that many
    assert src.size < 8004  # ... but not 8,000 English pieces
    lines = _data_lines(config, inputs)
    assert lines[0] == (
        "data: SentencePiece unigram vocabularies trained on the 399 training pairs of at most 12 source and 30 "
        f"target words: source {src.size} pieces (of 8,004 asked: the corpus supports no more), target 104 "
        "pieces, the four specials included"
    )
    # The length limits count pieces: the kept pairs are those of at most 12 source and 30 target pieces.
    src_len = [len(src.encode(s)) for s in train.sources]
    tgt_len = [len(tgt.encode(t)) for t in train.targets]
    kept = sum(a <= 12 and b <= 30 for a, b in zip(src_len, tgt_len, strict=True))
    assert 0 < kept < sum(b <= 30 for b in tgt_len)  # the piece limit on the source drops pairs
    assert inputs.train_report.kept == kept and inputs.train_report.empty == 1
    assert "data.max_source_length=12 tokens" in lines[1]
    # A resumed run reloads the saved models instead of training new ones.
    again = make_inputs(config, str(tmp_path / "vocab"), reuse_vocab=True)
    assert (again.src_vocab, again.tgt_vocab) == (src, tgt) and again.vocab_line == ""


def test_bpe_and_the_word_default():
    bpe = make_inputs(
        _config("data.vocab=sentencepiece", "data.sentencepiece_type=bpe"),
        "",
        reuse_vocab=False,
        save_vocab=False,
    )
    assert "SentencePiece bpe vocabularies" in bpe.vocab_line
    word = make_inputs(_config(), "", reuse_vocab=False, save_vocab=False)
    assert isinstance(word.src_vocab, data.WordVocabulary) and word.vocab_line == ""


def test_bad_vocabulary_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match="data.vocab must be one of word, sentencepiece; got 'spm'"):
        check_config(_config("data.vocab=spm"))
    with pytest.raises(ConfigError, match="data.sentencepiece_type must be one of unigram, bpe; got 'char'"):
        check_config(_config("data.sentencepiece_type=char"))
    # Fewer pieces than the corpus has characters: SentencePiece's refusal, as one line.
    config = _config("data.vocab=sentencepiece", "data.src_vocab_size=5")
    want = r"^cannot train the source SentencePiece unigram model of 9 pieces \(data.src_vocab_size=5 plus 4 "
    with pytest.raises(data.CorpusError, match=want + r"specials\): .*Vocabulary size is smaller than"):
        make_inputs(config, "", reuse_vocab=False, save_vocab=False)


def test_sentencepiece_past_its_sentence_cap_trains_on_the_first_ones_and_says_so(monkeypatch):
    from attn_jax.train import _inputs

    monkeypatch.setattr(_inputs, "SENTENCEPIECE_MAX_SENTENCES", 100)
    inputs = make_inputs(_config("data.vocab=sentencepiece"), "", reuse_vocab=False, save_vocab=False)
    assert "trained on the first 100 of the 399 training pairs" in inputs.vocab_line
    train = data.read_plain_corpus(CORPUS / "train.en", CORPUS / "train.fr")
    assert inputs.src_vocab == data.SentencePieceVocabulary.train(train.sources[:100], 30_004)
