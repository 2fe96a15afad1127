"""Vocabularies: the word shortlist and SentencePiece, special ids, encode/decode, save/load round trips."""

import json

import pytest

from attn_jax.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    SentencePieceVocabulary,
    SyntheticSpec,
    Vocabulary,
    WordVocabulary,
    generate_synthetic,
    load_vocabularies,
    load_vocabulary,
    save_vocabularies,
)


@pytest.fixture(scope="module")
def synthetic():
    return generate_synthetic(SyntheticSpec(train_size=300, validation_size=30, test_per_bucket=2))


def test_special_ids():
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert SPECIAL_TOKENS == ("<pad>", "<s>", "</s>", "<unk>")


def test_word_shortlist_keeps_the_most_frequent_words():
    sentences = ["c c c b b a", "d d d e", "<unk> e"]
    v = WordVocabulary.build(sentences, max_size=3)
    # c and d: 3 each (tie broken alphabetically), then b and e: 2 each -> b. "<unk>" in the text is not a word.
    assert v.tokens == SPECIAL_TOKENS + ("c", "d", "b")
    assert v.size == 7
    assert v.encode("a b c d e  <unk>") == [UNK_ID, 6, 4, 5, UNK_ID, UNK_ID]
    assert WordVocabulary.build(sentences).size == 4 + 5
    assert WordVocabulary.build(sentences, min_count=3).tokens[4:] == ("c", "d")
    assert WordVocabulary.build(sentences, max_size=0).size == 4


def test_word_decode_stops_at_eos_and_drops_specials():
    v = WordVocabulary(SPECIAL_TOKENS + ("x", "y"))
    assert v.decode([BOS_ID, 4, PAD_ID, 5, UNK_ID, EOS_ID, 4, 4]) == "x y <unk>"
    assert v.decode([]) == ""
    assert v.decode(v.encode("y x y")) == "y x y"


def test_word_vocabulary_lowercase():
    v = WordVocabulary.build(["The the THE cat"], lowercase=True)
    assert v.tokens[4:] == ("the", "cat") and v.encode("The CAT") == [4, 5]


def test_word_vocabulary_rejects_bad_tokens():
    with pytest.raises(ValueError, match="must start with"):
        WordVocabulary(("a", "b", "c", "d"))
    with pytest.raises(ValueError, match="repeat"):
        WordVocabulary(SPECIAL_TOKENS + ("a", "a"))


def test_word_vocabulary_round_trip(tmp_path, synthetic):
    sources = [p.source for p in synthetic["train"]]
    v = WordVocabulary.build(sources, max_size=200, lowercase=True)
    v.save(tmp_path / "v")
    w = load_vocabulary(tmp_path / "v")
    assert w == v and isinstance(w, WordVocabulary)
    for s in [p.source for p in synthetic["test"]]:
        assert w.encode(s) == v.encode(s)
    meta = json.loads((tmp_path / "v" / "vocab.json").read_text())
    assert meta["kind"] == "word" and meta["tokens"][:4] == list(SPECIAL_TOKENS)


def test_word_vocabulary_on_the_synthetic_corpus(synthetic):
    """The full synthetic vocabulary encodes every held-out sentence without <unk> and decodes it back exactly."""
    from attn_jax.data._lexicon import LEXICON

    v = WordVocabulary(SPECIAL_TOKENS + LEXICON.target_vocabulary())
    for p in synthetic["test"]:
        ids = v.encode(p.target)
        assert UNK_ID not in ids and v.decode([BOS_ID, *ids, EOS_ID, PAD_ID]) == p.target


@pytest.fixture(scope="module")
def spm_vocab(synthetic):
    return SentencePieceVocabulary.train([p.target for p in synthetic["train"]], vocab_size=250)


def test_sentencepiece_special_ids_and_round_trip(spm_vocab, synthetic):
    v = spm_vocab
    assert v.size == 250 and (v.pad_id, v.bos_id, v.eos_id, v.unk_id) == (0, 1, 2, 3)
    assert [v._sp.id_to_piece(i) for i in range(4)] == list(SPECIAL_TOKENS)
    for p in synthetic["test"]:
        ids = v.encode(p.target)
        assert min(ids) > UNK_ID  # every character was seen in training: no <unk>, no specials
        assert v.decode([BOS_ID, *ids, EOS_ID, PAD_ID, 7]) == p.target
    # Subwords: fewer pieces than characters, more than words.
    text = synthetic["test"][-1].target
    assert len(text.split()) < len(v.encode(text)) < len(text)


def test_sentencepiece_unknown_characters_become_unk(spm_vocab):
    assert UNK_ID in spm_vocab.encode("Ωmega")


def test_sentencepiece_training_is_deterministic(spm_vocab, synthetic):
    again = SentencePieceVocabulary.train([p.target for p in synthetic["train"]], vocab_size=250)
    assert again == spm_vocab


def test_sentencepiece_round_trip(tmp_path, spm_vocab, synthetic):
    spm_vocab.save(tmp_path / "sp")
    w = load_vocabulary(tmp_path / "sp")
    assert isinstance(w, SentencePieceVocabulary) and w == spm_vocab
    for p in synthetic["validation"]:
        assert w.encode(p.target) == spm_vocab.encode(p.target)


def test_sentencepiece_bpe_and_small_corpus():
    v = SentencePieceVocabulary.train(["ab ab abc", "abc d"], vocab_size=1000, model_type="bpe")
    assert v.size < 1000  # hard_vocab_limit=False: as many pieces as the data supports
    assert v.decode(v.encode("abc ab")) == "abc ab"
    with pytest.raises(ValueError, match="no sentences"):
        SentencePieceVocabulary.train(["", "  "], vocab_size=10)


def test_vocabulary_pair_round_trip(tmp_path, spm_vocab, synthetic):
    src = WordVocabulary.build([p.source for p in synthetic["train"]], max_size=100)
    save_vocabularies(tmp_path / "ckpt" / "vocab", src, spm_vocab)
    got_src, got_tgt = load_vocabularies(tmp_path / "ckpt" / "vocab")
    assert got_src == src and got_tgt == spm_vocab


def test_protocol_and_load_errors(tmp_path, spm_vocab):
    assert isinstance(WordVocabulary(SPECIAL_TOKENS), Vocabulary)
    assert isinstance(spm_vocab, Vocabulary)
    assert WordVocabulary.word_level and not SentencePieceVocabulary.word_level
    with pytest.raises(ValueError, match="not a saved vocabulary"):
        load_vocabulary(tmp_path)
    (tmp_path / "vocab.json").write_text('{"kind": "bytes"}')
    with pytest.raises(ValueError, match="unknown vocabulary kind 'bytes'"):
        load_vocabulary(tmp_path)
