"""``one_shape`` batching (``length_batches``, ``translate_sentences``, ``reference_attention``,
``evaluate_workdir``): every batch at one padded shape, so one program is compiled, and the answers are those of
the per-width batches up to float32 rounding.

The run is ``tests/test_cli_translate.make_run``'s (the smoke config's data and vocabularies, one untrained
checkpoint)."""

import jax
import pytest

from attn_jax.decoding import length_batches, padded_width
from attn_jax.pipeline import load_model, reference_attention, translate_sentences
from tests.test_cli_translate import make_run
from tests.tolerance import assert_close_f32

# Widths 16, 32 and 64 apart; with batches of 2 the per-width batching compiles four shapes.
SOURCES = [
    "the dog slept .",
    "every monk stood , because the torch bit fragile lazy bananas .",
    " ".join(["the dog slept , and"] * 4) + " the cat ate .",
    "a cat ate .",
    " ".join(["the monk stood , and"] * 8) + " the dog slept .",
]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_model(make_run(tmp_path_factory.mktemp("run")))


def test_one_shape_batches_keep_length_order_at_one_width_and_row_count():
    lengths = [5, 40, 17, 3, 70, 9]
    batches = length_batches(lengths, 4, one_shape=True)
    assert {(w, r) for _, w, r in batches} == {(padded_width(70), 4)}
    assert [i for chunk, _, _ in batches for i in chunk] == sorted(range(6), key=lambda i: lengths[i])
    assert length_batches(lengths[:3], 32, one_shape=True) == [([0, 2, 1], 64, 4)]  # rows: next power of two
    assert len({(w, r) for _, w, r in length_batches(lengths, 4)}) > 1  # the default: one shape per width


def test_one_shape_translations_and_attention_equal_the_per_width_ones(loaded):
    from attn_jax.decoding import _beam

    jax.clear_caches()  # another test may have compiled this shape already: count from an empty cache
    traces = _beam._TRACE_COUNT[0]
    one = translate_sentences(loaded, SOURCES, beam_size=2, batch_size=2, one_shape=True)
    assert _beam._TRACE_COUNT[0] - traces == 1  # one program for the three batches
    per_width = translate_sentences(loaded, SOURCES, beam_size=2, batch_size=2)
    for a, b in zip(one, per_width, strict=True):
        assert a[0].text == b[0].text
        # Wider padding: more masked terms in the attention's sums, float32 rounding apart.
        assert_close_f32(a[0].log_prob, b[0].log_prob, reduction=128 * 3, scale=abs(b[0].log_prob) + 1.0)
        assert_close_f32(a[0].attention, b[0].attention, reduction=128 * 3)

    references = [s.upper() for s in SOURCES]  # unknown target words: <unk>, still a teacher-forced pass
    wide = reference_attention(loaded, SOURCES, references, batch_size=2, one_shape=True)
    narrow = reference_attention(loaded, SOURCES, references, batch_size=2)
    for a, b in zip(wide, narrow, strict=True):
        assert a.shape == b.shape
        assert_close_f32(a, b, reduction=128 * 3)
    assert jax.tree.structure(wide) == jax.tree.structure(narrow)
