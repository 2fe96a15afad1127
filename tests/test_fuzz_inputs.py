"""Fuzzed inputs: random and mutated bytes end in a result or one error line, never in another exception.

Each reader gets files of random bytes, of text pieces chosen to hurt (invalid and truncated UTF-8, NUL bytes,
``\\r``, ``\\v``, ``\\x1c``, U+2028, a byte-order mark, tabs, huge lines) and of valid text cut at a random byte:
the corpus readers (plain, TSV, ``{split}`` files through the trainer's ``load_corpus``), the vocabulary loader,
the config override parser and ``translate``'s readers (a file, and a pipe as it arrives). A result must keep
the line count: ``\\n`` ends a line and nothing else does, so a corpus' pairs plus the pairs it counts as
skipped are the file's lines, and ``translate`` returns one line per input line. An error must be the
project's own type with a one-line message. ``CASES`` counts the examples run (see ``tests/README.md``).
"""

import json
import os
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_jax.cli._translate import LineStream
from attn_jax.cli._translate import _read_lines as read_translate_input
from attn_jax.data import CorpusError, WordVocabulary, load_vocabulary, read_plain_corpus, read_tsv_corpus
from attn_jax.pipeline import TranslateError
from attn_jax.train import ConfigError, apply_overrides, default_config, flatten_config, load_corpus

EXAMPLES = 60
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
CASES = {"count": 0, "calls": 0, "errors": 0}

PIECES = [
    b"a",
    b"word",
    b"0-1",
    b" ",
    b"\t",
    b"\n",
    b"\r",
    b"\r\n",
    b"\x0b",
    b"\x0c",
    b"\x1c",
    b"\x1e",
    "\u2028".encode(),
    "\x85".encode(),
    b"\x00",
    b"\xff",
    b"\xc3",  # the first byte of a two-byte character, cut
    "€".encode()[:2],
    "é".encode(),
    b"\xef\xbb\xbf",  # a byte-order mark, anywhere
    b"=",
    b",",
    b"'",
    b"(",
    b"[1, 2]",
    b"w" * 70_000,  # one huge token, longer than a pipe's buffer
    b"w " * 20_000,
]
VALID = b"the cat sat\nle chat\n\nsur le tapis\r\nend"

fuzz_bytes = st.one_of(
    st.binary(max_size=300),
    st.lists(st.sampled_from(PIECES), max_size=40).map(b"".join),
    st.integers(0, len(VALID)).map(lambda n: VALID[:n]),  # a truncated file
    st.tuples(st.integers(0, len(VALID)), st.binary(min_size=1, max_size=3)).map(  # one mutated byte run
        lambda t: VALID[: t[0]] + t[1] + VALID[t[0] + len(t[1]) :]
    ),
)


def _lines(data: bytes) -> int:
    """Lines in ``data`` by the one rule: ``\\n`` ends a line; an unterminated last line counts."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _one_line(error: Exception) -> None:
    message = str(error)
    assert message and len(message.splitlines()) == 1, repr(message)
    CASES["errors"] += 1


def _write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


@pytest.fixture(scope="module", autouse=True)
def _report_cases():
    yield
    print(
        f"\nfuzzed inputs: {CASES['count']} cases, {CASES['calls']} reader calls, "
        f"{CASES['calls'] - CASES['errors']} results and {CASES['errors']} one-line errors"
    )


@FUZZ
@given(source=fuzz_bytes, target=fuzz_bytes, same_lines=st.booleans())
def test_plain_and_split_corpora(tmp_path_factory, source, target, same_lines):
    CASES["count"] += 1
    if same_lines:  # line-aligned files, so that a result (not only the count error) is reached
        target = target.replace(b"\n", b" ") + b"\n" * source.count(b"\n")
    d = tmp_path_factory.mktemp("plain")
    src, tgt = _write(d / "valid.src", source), _write(d / "valid.tgt", target)
    _write(d / "train.src", b"a\n")
    _write(d / "train.tgt", b"b\n")
    config = default_config().data
    config.corpus, config.source_path, config.target_path = (
        "plain",
        str(d / "{split}.src"),
        str(d / "{split}.tgt"),
    )
    for read in (lambda: read_plain_corpus(src, tgt), lambda: load_corpus(config, "validation")):
        CASES["calls"] += 1
        try:
            corpus = read()
        except CorpusError as e:
            _one_line(e)
            continue
        assert _lines(source) == _lines(target)
        assert len(corpus) + corpus.skipped_empty == _lines(source)
        assert all(s and t for s, t in zip(corpus.sources, corpus.targets, strict=True))


@FUZZ
@given(data=fuzz_bytes, tabs=st.integers(0, 3))
def test_tsv_corpus(tmp_path_factory, data, tabs):
    CASES["count"] += 1
    data = data.replace(b"\n", b"\t" * tabs + b"\n") if tabs else data
    path = _write(tmp_path_factory.mktemp("tsv") / "pairs.tsv", data)
    CASES["calls"] += 1
    try:
        corpus = read_tsv_corpus(path)
    except CorpusError as e:
        _one_line(e)
        return
    assert len(corpus) + corpus.skipped_empty == _lines(data)


_SAVED = json.dumps({"kind": "word", "tokens": ["<pad>", "<s>", "</s>", "<unk>", "a"], "lowercase": False})


@FUZZ
@given(
    data=st.one_of(
        fuzz_bytes,
        st.integers(0, len(_SAVED)).map(lambda n: _SAVED[:n].encode()),
        st.tuples(st.integers(0, len(_SAVED)), st.sampled_from(PIECES[:25])).map(
            lambda t: _SAVED[: t[0]].encode() + t[1] + _SAVED[t[0] + 1 :].encode()
        ),
        st.sampled_from(
            [
                b"[]",
                b"null",
                b'{"kind": "word"}',
                b'{"kind": "word", "tokens": 5, "lowercase": false}',
                b'{"kind": "word", "tokens": [[1], 2], "lowercase": false}',
                b'{"kind": "sentencepiece"}',
                b'{"kind": "sentencepiece", "model": 7}',
                b'{"kind": "sentencepiece", "model": "spm.model"}',
                b'{"kind": "sentencepiece", "model": "../../x"}',
            ]
        ),
    ),
    model=st.binary(max_size=100),
)
def test_vocabulary_loader(tmp_path_factory, data, model):
    CASES["count"] += 1
    d = tmp_path_factory.mktemp("vocab")
    _write(d / "vocab.json", data)
    _write(d / "spm.model", model)
    CASES["calls"] += 1
    try:
        vocab = load_vocabulary(d)
    except ValueError as e:  # what the loaders of a run catch (CorpusError is one)
        _one_line(e)
        return
    assert isinstance(vocab, WordVocabulary) or vocab.size > 4


_KEYS = sorted(flatten_config(default_config()))


@FUZZ
@given(
    key=st.one_of(st.sampled_from(_KEYS), st.text(max_size=20)),
    value=st.one_of(
        st.text(max_size=50),
        fuzz_bytes.map(
            lambda b: b[:2000].decode("utf-8", "surrogateescape")
        ),  # as argv holds undecodable bytes
    ),
    sep=st.sampled_from(["=", "", " = ", "=="]),
)
def test_config_overrides(key, value, sep):
    CASES["count"] += 1
    CASES["calls"] += 1
    try:
        config = apply_overrides(default_config(), [f"{key}{sep}{value}"])
    except ConfigError as e:
        _one_line(e)
        return
    assert flatten_config(config).keys() == set(_KEYS)


def _pipe_lines(data: bytes) -> list[str]:
    """``translate``'s reader of a pipe, fed ``data`` by a writer thread (a pipe holds only 64 KiB)."""
    read_fd, write_fd = os.pipe()

    def feed():
        with os.fdopen(write_fd, "wb") as f:
            try:
                f.write(data)
            except BrokenPipeError:  # the reader stopped at invalid UTF-8
                pass

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        return [line for batch in LineStream(read_fd).batches(7) for line in batch]
    finally:
        os.close(read_fd)
        writer.join()


@FUZZ
@given(data=fuzz_bytes)
def test_translate_input(tmp_path_factory, data):
    CASES["count"] += 1
    path = _write(tmp_path_factory.mktemp("input") / "in.txt", data)
    CASES["calls"] += 2
    try:
        lines = read_translate_input(path)
    except TranslateError as e:
        _one_line(e)
        lines = None
    else:
        assert len(lines) == _lines(data)
    try:
        streamed = _pipe_lines(data)
    except TranslateError as e:
        _one_line(e)
        assert lines is None  # only invalid UTF-8 stops a stream, and it stops the file reader too
        return
    assert len(streamed) == _lines(data)
    if lines is not None:
        assert streamed == lines
