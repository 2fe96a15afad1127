"""Masks: padding, causal (with cache offsets), combination, and PyTorch-convention conversion."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_jax.attention._dot_product import dot_product_attention
from attn_jax.attention._masks import (
    combine_masks,
    from_torch_attn_mask,
    from_torch_key_padding_mask,
    key_padding_mask,
    make_attention_mask,
    make_causal_mask,
    make_padding_mask,
    padding_mask_from_tokens,
)
from tests.reference.masks_dot import causal_mask_ref, padding_mask_ref


def test_padding_mask_matches_reference():
    lengths = np.array([[0, 3, 7], [1, 5, 2]])
    np.testing.assert_array_equal(make_padding_mask(lengths, 7), padding_mask_ref(lengths, 7))
    # traced lengths (e.g. inside a jitted train step)
    np.testing.assert_array_equal(
        jax.jit(make_padding_mask, static_argnums=1)(lengths, 7), padding_mask_ref(lengths, 7)
    )


def test_padding_mask_from_tokens():
    tokens = np.array([[4, 9, 0, 0, 0], [3, 0, 8, 1, 0]])
    np.testing.assert_array_equal(padding_mask_from_tokens(tokens), tokens != 0)
    np.testing.assert_array_equal(padding_mask_from_tokens(tokens, pad_id=1), tokens != 1)


@given(st.integers(1, 6), st.integers(1, 9), st.integers(0, 5))
@settings(max_examples=12)
def test_causal_mask_matches_reference(t, s, offset):
    np.testing.assert_array_equal(make_causal_mask(t, s, offset=offset), causal_mask_ref(t, s, offset))


def test_causal_mask_defaults_and_traced_offset():
    np.testing.assert_array_equal(make_causal_mask(5), causal_mask_ref(5, 5))
    # default key_length = offset + T: a block of 2 new queries after 3 cached positions sees 5 keys
    np.testing.assert_array_equal(make_causal_mask(2, offset=3), causal_mask_ref(2, 5, 3))
    step = jax.jit(lambda i: make_causal_mask(1, 6, offset=i))
    for i in range(6):
        np.testing.assert_array_equal(step(i), causal_mask_ref(1, 6, i))
    with pytest.raises(ValueError, match="key_length is required"):
        jax.jit(lambda i: make_causal_mask(1, offset=i))(2)


def test_attention_and_key_padding_masks():
    q_valid = make_padding_mask(np.array([2, 5, 1]), 5)  # [3, 5]
    k_valid = make_padding_mask(np.array([7, 3, 4]), 7)  # [3, 7]
    m = make_attention_mask(q_valid, k_valid)
    assert m.shape == (3, 5, 7)
    for b in range(3):
        for i in range(5):
            for j in range(7):
                assert bool(m[b, i, j]) == bool(q_valid[b, i] and k_valid[b, j])
    kp = key_padding_mask(k_valid)
    assert kp.shape == (3, 1, 7)
    np.testing.assert_array_equal(
        np.broadcast_to(kp, (3, 5, 7)), np.broadcast_to(k_valid[:, None], (3, 5, 7))
    )


def test_combine_masks():
    causal = make_causal_mask(5, 7, offset=2)  # [5, 7]
    kp = key_padding_mask(make_padding_mask(np.array([7, 4, 2]), 7))  # [3, 1, 7]
    combined = combine_masks(None, causal, kp, None)
    np.testing.assert_array_equal(combined, np.asarray(causal)[None] & np.asarray(kp))
    assert combine_masks(None, None) is None
    assert combine_masks() is None
    np.testing.assert_array_equal(combine_masks(causal), causal)


def test_combine_masks_errors_name_shapes():
    with pytest.raises(ValueError, match=r"mask 0 \[5, 7\], mask 2 \[3, 1, 6\]"):
        combine_masks(jnp.ones((5, 7), bool), None, jnp.ones((3, 1, 6), bool))
    with pytest.raises(ValueError, match=r"mask 1 must be boolean.*float32"):
        combine_masks(jnp.ones((5, 7), bool), jnp.ones((5, 7)))


def test_mask_input_errors():
    with pytest.raises(ValueError, match="lengths must be integers"):
        make_padding_mask(jnp.array([1.0, 2.0]), 4)
    with pytest.raises(ValueError, match="max_len must be a non-negative int"):
        make_padding_mask(jnp.array([1, 2]), -1)
    with pytest.raises(ValueError, match=r"query_valid batch axes \[2\], key_valid batch axes \[3\]"):
        make_attention_mask(jnp.ones((2, 5), bool), jnp.ones((3, 7), bool))
    with pytest.raises(ValueError, match=r"key_valid must be boolean.*shape \[3, 7\]"):
        key_padding_mask(jnp.ones((3, 7), jnp.int32))


def test_from_torch_key_padding_mask_inverts_convention(rng):
    # PyTorch: True = padding to ignore. Ours: True = may attend.
    lengths = np.array([7, 3, 5])
    torch_kpm = np.arange(7)[None, :] >= lengths[:, None]  # [3, 7], True at padding
    ours = from_torch_key_padding_mask(torch_kpm)
    assert ours.shape == (3, 1, 7)
    np.testing.assert_array_equal(ours[:, 0], padding_mask_ref(lengths, 7))
    # float (additive) PyTorch mask: 0 = keep, -inf = ignore
    np.testing.assert_array_equal(from_torch_key_padding_mask(np.where(torch_kpm, -np.inf, 0.0)), ours)
    # end to end: attention with the converted mask == attention with our own padding mask (equal masks of one
    # shape: the same program on the same values, so bitwise)
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in [(3, 5, 4), (3, 7, 4), (3, 7, 2)])
    np.testing.assert_array_equal(
        dot_product_attention(q, k, v, ours),
        dot_product_attention(q, k, v, key_padding_mask(make_padding_mask(lengths, 7))),
    )


def test_from_torch_attn_mask():
    # nn.MultiheadAttention's boolean attn_mask: True = NOT allowed, e.g. its causal mask is the strict upper triangle
    torch_causal = np.triu(np.ones((5, 5), bool), k=1)
    np.testing.assert_array_equal(from_torch_attn_mask(torch_causal), causal_mask_ref(5, 5))
    # float additive form: nn.Transformer.generate_square_subsequent_mask gives -inf above the diagonal, 0 elsewhere
    float_causal = np.where(torch_causal, -np.inf, 0.0).astype(np.float32)
    np.testing.assert_array_equal(from_torch_attn_mask(float_causal), causal_mask_ref(5, 5))
    with pytest.raises(ValueError, match="attn_mask must be boolean or floating"):
        from_torch_attn_mask(np.zeros((5, 5), np.int32))
    with pytest.raises(ValueError, match=r"attn_mask must have at least 2 axes, got shape \[5\]"):
        from_torch_attn_mask(np.zeros((5,), bool))
