"""Corpus readers: plain text, Moses prefix, TSV, TFDS (WMT'14 under mock data), and their errors."""

import numpy as np
import pytest

from attn_jax.data import (
    BatchConfig,
    CorpusError,
    CorpusSpec,
    WordVocabulary,
    corpus_from_pairs,
    encode_corpus,
    load_tfds_corpus,
    make_batch_iterator,
    read_moses_corpus,
    read_plain_corpus,
    read_tsv_corpus,
)


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_plain_corpus_reads_pairs_and_skips_empty_lines(tmp_path):
    src = _write(tmp_path / "c.en", "\ufeffthe cat .\r\n\n  a dog  \nhello\n   \n".encode())
    tgt = _write(tmp_path / "c.fr", b"le chat .\r\nvide\nun chien\n\nx\n")
    c = read_plain_corpus(src, tgt)
    # Line 2 (empty source), line 4 (empty target), line 5 (blank source) are skipped; BOM and CR removed.
    assert c.sources == ("the cat .", "a dog")
    assert c.targets == ("le chat .", "un chien")
    assert c.skipped_empty == 3
    assert c.alignments is None and len(c) == 2
    assert read_moses_corpus(tmp_path / "c", "en", "fr") == c


def test_plain_corpus_without_trailing_newline(tmp_path):
    c = read_plain_corpus(_write(tmp_path / "s", b"a\nb"), _write(tmp_path / "t", b"x\ny\n"))
    assert c.sources == ("a", "b") and c.targets == ("x", "y")


def test_different_line_counts_name_file_and_line(tmp_path):
    src = _write(tmp_path / "s.txt", b"a\nb\nc\n")
    tgt = _write(tmp_path / "t.txt", b"x\ny\n")
    with pytest.raises(
        CorpusError, match=rf"^{tmp_path}/s.txt:3: line has no partner: .*has 3 lines but .*has 2$"
    ):
        read_plain_corpus(src, tgt)
    with pytest.raises(CorpusError, match=rf"^{tmp_path}/s.txt:3: "):
        read_plain_corpus(tgt, src)


def test_invalid_utf8_names_file_and_line(tmp_path):
    src = _write(tmp_path / "s.txt", b"ok\nfine\ncaf\xe9 latin-1\n")
    tgt = _write(tmp_path / "t.txt", b"a\nb\nc\n")
    with pytest.raises(CorpusError, match=rf"^{tmp_path}/s.txt:3: invalid UTF-8 \(byte 0xe9 at column 4\)$"):
        read_plain_corpus(src, tgt)


def test_missing_file(tmp_path):
    tgt = _write(tmp_path / "t.txt", b"a\n")
    with pytest.raises(CorpusError, match=rf"^{tmp_path}/nope.txt: no such file$"):
        read_plain_corpus(tmp_path / "nope.txt", tgt)
    with pytest.raises(CorpusError, match="is a directory"):
        read_plain_corpus(tmp_path, tgt)


def test_empty_corpus_after_skipping(tmp_path):
    src = _write(tmp_path / "s.txt", b"\n  \nx\n")
    tgt = _write(tmp_path / "t.txt", b"a\nb\n\n")
    with pytest.raises(CorpusError, match=r"no sentence pairs \(skipped 3 pairs with an empty side\)"):
        read_plain_corpus(src, tgt)
    empty = _write(tmp_path / "e.txt", b"")
    with pytest.raises(CorpusError, match="no sentence pairs"):
        read_plain_corpus(empty, empty)


def test_tsv_corpus(tmp_path):
    path = _write(tmp_path / "p.tsv", b"a b\tx y\textra\n\n\tonly target\nc\td\n")
    c = read_tsv_corpus(path)
    assert c.sources == ("a b", "c") and c.targets == ("x y", "d") and c.skipped_empty == 2
    c = read_tsv_corpus(path, source_column=1, target_column=0)
    assert c.sources == ("x y", "d") and c.targets == ("a b", "c") and c.skipped_empty == 2
    bad = _write(tmp_path / "bad.tsv", b"a\tb\nno tab here\n")
    with pytest.raises(
        CorpusError, match=rf"^{tmp_path}/bad.tsv:2: expected 2 tab-separated columns, found 1$"
    ):
        read_tsv_corpus(bad)
    with pytest.raises(CorpusError, match=r"bad.tsv:1: invalid UTF-8"):
        read_tsv_corpus(_write(tmp_path / "bad.tsv", b"\xff\tb\n"))


def test_corpus_spec(tmp_path):
    _write(tmp_path / "train.en", b"a\n")
    _write(tmp_path / "train.fr", b"b\n")
    _write(tmp_path / "valid.tsv", b"c\td\n")
    assert CorpusSpec(plain=(f"{tmp_path}/{{split}}.en", f"{tmp_path}/{{split}}.fr")).load(
        "train"
    ).sources == ("a",)
    assert CorpusSpec(tsv=f"{tmp_path}/{{split}}.tsv").load("valid").targets == ("d",)
    with pytest.raises(ValueError, match="exactly one"):
        CorpusSpec(tsv="a", tfds="b")
    with pytest.raises(ValueError, match="exactly one"):
        CorpusSpec()


def test_corpus_from_pairs():
    c = corpus_from_pairs([("a", "b", "0-0"), (" ", "c", ""), ("d e", "f", "1-0")])
    assert c.sources == ("a", "d e") and c.alignments == ("0-0", "1-0") and c.skipped_empty == 1


# ---------------------------------------------------------------------------------------------------------------
# TFDS: WMT'14 through the real loading code, with tfds.testing.mock_data (no download).


def test_wmt14_under_mock_data_into_padded_batches(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=40):
        corpus = load_tfds_corpus(
            "wmt14_translate/fr-en", "train", source_key="en", target_key="fr", data_dir=str(tmp_path)
        )
        raw = [
            (ex["en"].decode(), ex["fr"].decode())
            for ex in tfds.as_numpy(
                tfds.builder("wmt14_translate/fr-en", data_dir=str(tmp_path)).as_dataset(split="train")
            )
        ]
        default_keys = load_tfds_corpus("wmt14_translate/fr-en", "train", data_dir=str(tmp_path))
    # Mock text is random but fixed; pairs with an empty side (after strip) are skipped and counted.
    kept = [(s.strip(), t.strip()) for s, t in raw if s.strip() and t.strip()]
    assert list(zip(corpus.sources, corpus.targets, strict=True)) == kept
    assert corpus.skipped_empty == len(raw) - len(kept) and len(corpus) > 20
    # Without keys, the dataset's supervised keys (fr, en) decide the direction.
    assert default_keys.sources == corpus.targets

    src_vocab, tgt_vocab = WordVocabulary.build(corpus.sources), WordVocabulary.build(corpus.targets)
    config = BatchConfig(
        batch_size=4, bucket_boundaries=(8, 16), shuffle=False, num_epochs=1, drop_remainder=False
    )
    batches = list(make_batch_iterator(encode_corpus(corpus, src_vocab, tgt_vocab), config))
    seen = []
    for b in batches:
        assert b.src.shape[0] == 4 and b.src.shape[1] in (8, 16) and b.tgt_in.shape == b.src.shape
        for row in range(4):
            if b.example_id[row] >= 0:
                seen.append(int(b.example_id[row]))
                assert src_vocab.decode(b.src[row]) == " ".join(corpus.sources[b.example_id[row]].split())
                assert tgt_vocab.decode(b.tgt_out[row]) == " ".join(corpus.targets[b.example_id[row]].split())
    assert sorted(seen) == list(range(len(corpus)))


def test_tfds_errors(tmp_path):
    with pytest.raises(
        CorpusError, match=r"^wmt14_translate/fr-en: not prepared in .*tfds build wmt14_translate"
    ):
        load_tfds_corpus(
            "wmt14_translate/fr-en", "train", source_key="en", target_key="fr", data_dir=str(tmp_path)
        )
    with pytest.raises(CorpusError, match=r"^no_such_dataset_xyz: unknown TFDS dataset"):
        load_tfds_corpus("no_such_dataset_xyz", "train", data_dir=str(tmp_path))
    with pytest.raises(
        CorpusError, match=r"^wmt14_translate/fr-en: no feature 'de'; features are \['fr', 'en'\]$"
    ):
        load_tfds_corpus(
            "wmt14_translate/fr-en", "train", source_key="de", target_key="fr", data_dir=str(tmp_path)
        )


def test_readers_give_identical_corpora(tmp_path):
    pairs = [("a b", "x"), ("c", "y z"), ("d e f", "w")]
    _write(tmp_path / "s", "\n".join(p[0] for p in pairs).encode())
    _write(tmp_path / "t", "\n".join(p[1] for p in pairs).encode())
    _write(tmp_path / "p.tsv", "\n".join("\t".join(p) for p in pairs).encode())
    a, b, c = (
        read_plain_corpus(tmp_path / "s", tmp_path / "t"),
        read_tsv_corpus(tmp_path / "p.tsv"),
        corpus_from_pairs(pairs),
    )
    assert a.sources == b.sources == c.sources and a.targets == b.targets == c.targets
    assert np.array_equal(
        encode_corpus(a, WordVocabulary.build(a.sources), WordVocabulary.build(a.targets)).src_tokens,
        encode_corpus(b, WordVocabulary.build(b.sources), WordVocabulary.build(b.targets)).src_tokens,
    )
