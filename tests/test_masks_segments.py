"""Packed sequences: the segment mask (Flax parity, loops, composition with causal) and per-segment positions."""

import flax.linen
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_jax.attention import (
    combine_masks,
    dot_product_attention,
    make_attention_mask,
    make_causal_mask,
    make_segment_mask,
    segment_positions,
)
from tests.reference.segments import segment_mask_ref, segment_positions_ref


def _packed_ids(rng, batch, length, max_segments):
    """Rows of contiguous runs 1, 2, ..., k followed by padding 0."""
    out = np.zeros((batch, length), np.int32)
    for b in range(batch):
        pos = 0
        for s in range(1, rng.integers(0, max_segments + 1) + 1):
            n = int(rng.integers(1, 4))
            out[b, pos : pos + n] = s
            pos += n
            if pos >= length:
                break
    return out


def test_segment_mask_by_hand():
    q = jnp.array([[1, 1, 2, 0]])
    k = jnp.array([[1, 2, 2, 2, 0]])
    expected = np.array(
        [
            [1, 0, 0, 0, 0],
            [1, 0, 0, 0, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0],  # padding attends nothing
        ],
        bool,
    )
    np.testing.assert_array_equal(make_segment_mask(q, k)[0], expected)


def test_segment_mask_matches_flax_and_loop():
    rng = np.random.default_rng(0)
    q = _packed_ids(rng, 3, 7, 3)
    k = _packed_ids(rng, 3, 9, 3)
    ours = np.asarray(make_segment_mask(q, k))
    assert ours.shape == (3, 7, 9)
    flax_mask = flax.linen.make_attention_mask(q, k, jnp.equal) * flax.linen.make_attention_mask(q > 0, k > 0)
    np.testing.assert_array_equal(ours[:, None], np.asarray(flax_mask, bool))  # Flax: [B, 1, T, S]
    np.testing.assert_array_equal(ours, segment_mask_ref(q, k))
    # traced (inside a jitted step)
    np.testing.assert_array_equal(jax.jit(make_segment_mask)(q, k), ours)


def test_segment_mask_composes_with_causal_and_padding():
    rng = np.random.default_rng(1)
    seg = _packed_ids(rng, 3, 8, 3)
    mask = combine_masks(make_causal_mask(8), make_segment_mask(seg, seg))
    ref = segment_mask_ref(seg, seg) & np.tril(np.ones((8, 8), bool))
    np.testing.assert_array_equal(mask, ref)
    # padding of the segment mask agrees with the padding masks (segment 0 neither attends nor is attended)
    valid = seg > 0
    both = combine_masks(make_segment_mask(seg, seg), make_attention_mask(valid, valid))
    np.testing.assert_array_equal(both, make_segment_mask(seg, seg))


def test_segment_mask_blocks_cross_segment_influence():
    """Changing a token of segment 2 leaves segment 1's attention output unchanged (gradient exactly 0)."""
    seg = jnp.array([[1, 1, 1, 2, 2, 0]])
    x = jax.random.normal(jax.random.key(0), (1, 6, 4))
    mask = make_segment_mask(seg, seg)

    def out_seg1(x):
        return jnp.sum(dot_product_attention(x, x, x, mask)[0, :3])

    g = jax.grad(out_seg1)(x)
    assert np.all(np.asarray(g[0, 3:]) == 0.0)
    assert np.any(np.asarray(g[0, :3]) != 0.0)
    out = dot_product_attention(x, x, x, mask)
    np.testing.assert_array_equal(out[0, 5], 0.0)  # a padding query: zero output, no NaN


@settings(max_examples=40)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=4))
def test_segment_positions_match_loop(rows):
    # one shape [4, 12] for every example (trailing zeros: padding), so jax compiles once
    seg = np.zeros((4, 12), np.int32)
    for b, r in enumerate(rows):
        seg[b, : len(r)] = r
    got = np.asarray(segment_positions(seg))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, segment_positions_ref(seg))


def test_segment_positions_by_hand_and_jit():
    seg = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    expected = [[0, 1, 2, 0, 1, 0, 0, 0], list(range(8))]
    np.testing.assert_array_equal(segment_positions(seg), expected)
    np.testing.assert_array_equal(jax.jit(segment_positions)(seg), expected)


@pytest.mark.parametrize("fn", [lambda s: make_segment_mask(s, s), segment_positions])
def test_segment_ids_must_be_integers(fn):
    with pytest.raises(ValueError, match="integer segment ids"):
        fn(jnp.array([[1.0, 2.0]]))
    with pytest.raises(ValueError):
        fn(jnp.array(1))


def test_segment_mask_batch_axes_must_broadcast():
    with pytest.raises(ValueError, match="broadcast"):
        make_segment_mask(jnp.ones((2, 3), jnp.int32), jnp.ones((3, 4), jnp.int32))
