"""Masks are never reinterpreted: float/int masks are refused by every public mask-taking function, PyTorch
masks convert by a stated rule (0 attends, <= -1000 blocks, anything else is a bias and refused), and
multi-head masks broadcast over missing batch axes like the pure dot-product function's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attn_jax
from attn_jax.nn import (
    AdditiveAttention,
    DotProductAttention,
    GRUCell,
    LuongAttention,
    MultiHeadAttention,
)
from attn_jax.nn._params import unwrap
from attn_jax.nn.intra import init_intra_params, intra_gru_scan
from attn_jax.nn.lstm import init_lstm_params, lstm_input_projection, lstm_scan
from attn_jax.nn.recurrent import gru_input_projection, gru_scan, init_gru_params
from tests.reference.core import softmax_ref
from tests.reference.masks_dot import dot_attention_ref, multi_head_ref
from tests.tolerance import assert_close_f32

B, T, S, D, H = 3, 5, 7, 11, 2

# PyTorch's additive form of "attend to keys 0 and 2 only"; as a boolean it is all True except the zero entries.
ADDITIVE = np.array([[0.0, -np.inf, 0.0]], np.float32)


def _normal(rng, shape):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32)


def test_masked_softmax_refuses_the_additive_mask_it_used_to_invert():
    logits = jnp.array([[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match=r"mask must be boolean.*float32.*from_torch_attn_mask"):
        attn_jax.masked_softmax(logits, ADDITIVE)
    with pytest.raises(ValueError, match=r"mask must be boolean.*int32.*from_torch_attn_mask"):
        attn_jax.masked_softmax(logits, np.array([[1, 0, 1]], np.int32))
    # The converted mask gives what PyTorch's softmax(logits + mask) means, computed by hand: keys 0 and 2 only.
    got = attn_jax.masked_softmax(logits, attn_jax.from_torch_attn_mask(ADDITIVE))
    e1, e3 = np.exp(1.0), np.exp(3.0)
    np.testing.assert_allclose(got, [[e1 / (e1 + e3), 0.0, e3 / (e1 + e3)]], rtol=1e-6)


def _mask_takers(rng):
    """``(name, call(mask))`` for every public function and module that takes an attention or padding mask."""
    q, k, v = _normal(rng, (B, T, D)), _normal(rng, (B, S, D)), _normal(rng, (B, S, 4))
    scores = _normal(rng, (B, T, S))
    add = attn_jax.init_additive_params(jax.random.key(0), D, D, 6)
    pk = attn_jax.project_keys(add, k)
    mha = attn_jax.init_multi_head_params(jax.random.key(1), H, D, qkv_features=6)
    centers = attn_jax.monotonic_centers(T, jnp.full((B,), S))
    rel_index = attn_jax.relative_position_index(jnp.arange(T), jnp.arange(S), 2)  # [T, S], rows 0..4
    rngs = nnx.Rngs(0)
    add_mod = AdditiveAttention(D, D, 6, rngs=rngs)
    luong_global = LuongAttention(D, D, score="general", rngs=rngs)
    luong_local = LuongAttention(D, D, score="general", local="p", window=2, rngs=rngs)
    mha_mod = MultiHeadAttention(H, D, qkv_features=6, rngs=rngs)
    gru = init_gru_params(jax.random.key(2), D, 4)
    lstm = init_lstm_params(jax.random.key(3), D, 4)
    intra = init_intra_params(jax.random.key(4), D, 4, 3)
    x_gru, x_lstm = gru_input_projection(gru, q), lstm_input_projection(lstm, q)
    gru_mod = GRUCell(D, 4, rngs=rngs)
    src_ids = jnp.arange(S) % 3 + D  # [S]: extended ids of three out-of-vocabulary words (vocabulary D)
    pair = lambda m: m  # noqa: E731  [B, T, S]-broadcastable masks
    keys_only = lambda m: m[..., 0, :]  # noqa: E731  [B, S] masks (one decoder step)
    steps = lambda m: m[..., 0, :T]  # noqa: E731  [B, T] padding masks of the recurrences
    return [
        ("masked_softmax", pair, lambda m: attn_jax.masked_softmax(scores, m)),
        ("masked_normalize", pair, lambda m: attn_jax.masked_normalize(scores, m, normalizer="sparsemax")),
        ("attend", pair, lambda m: attn_jax.attend(scores, v, m)),
        (
            "assert_valid_attention_weights",
            pair,
            lambda m: attn_jax.assert_valid_attention_weights(
                attn_jax.masked_softmax(scores, m if m.dtype == jnp.bool_ else None), m
            ),
        ),
        ("dot_product_attention", pair, lambda m: attn_jax.dot_product_attention(q, k, v, m)),
        (
            "dot_product_attention[chunked]",
            pair,
            lambda m: attn_jax.dot_product_attention(q, k, v, m, implementation="chunked"),
        ),
        ("chunked_dot_product_attention", pair, lambda m: attn_jax.chunked_dot_product_attention(q, k, v, m)),
        ("additive_attention", pair, lambda m: attn_jax.additive_attention(add, q, k, v, m)),
        (
            "additive_attention_step",
            keys_only,
            lambda m: attn_jax.additive_attention_step(add, q[:, 0], pk, v, m),
        ),
        ("luong_attention", pair, lambda m: attn_jax.luong_attention(scores, v, m)),
        ("copy_mass", pair, lambda m: attn_jax.copy_mass(jax.nn.softmax(scores), src_ids, D + 3, m)),
        (
            "pointer_generator_log_probs",
            pair,
            lambda m: attn_jax.pointer_generator_log_probs(
                q, jax.nn.softmax(scores), src_ids, scores[..., 0], D + 3, m
            ),
        ),
        (
            "local_attention",
            pair,
            lambda m: attn_jax.local_attention(scores, v, centers, window=2, mask=m, gaussian=False),
        ),
        ("multi_head_attention", pair, lambda m: attn_jax.multi_head_attention(mha, q, k, m)),
        (
            "relative_attention",  # one head: [B, 1, T, *]; values of the keys' width D, as its tables
            pair,
            lambda m: attn_jax.relative_attention(
                q[:, None],
                k[:, None],
                k[:, None],
                m[:, None],
                jnp.zeros((5, D)),
                jnp.zeros((5, D)),
                rel_index,
            ),
        ),
        ("dot_product_implementation", pair, lambda m: attn_jax.dot_product_implementation(q, k, v, m)),
        ("combine_masks", pair, lambda m: attn_jax.combine_masks(m, None)),
        ("padding_lengths", pair, lambda m: attn_jax.padding_lengths(m)),
        ("make_attention_mask", steps, lambda m: attn_jax.make_attention_mask(m, m)),
        ("key_padding_mask", keys_only, lambda m: attn_jax.key_padding_mask(m)),
        ("nn.AdditiveAttention", pair, lambda m: add_mod(q, k, v, m)),
        (
            "nn.AdditiveAttention.step",
            keys_only,
            lambda m: add_mod.step(q[:, 0], add_mod.project_keys(k), v, m),
        ),
        ("nn.DotProductAttention", pair, lambda m: DotProductAttention()(q, k, v, m)),
        ("nn.LuongAttention[global]", pair, lambda m: luong_global(q, k, v, m)),
        ("nn.LuongAttention[local-p]", pair, lambda m: luong_local(q, k, v, m)),
        ("nn.MultiHeadAttention", pair, lambda m: mha_mod(q, k, m)),
        ("gru_scan", steps, lambda m: gru_scan(gru, x_gru, m)),
        ("nn.GRUCell.scan", steps, lambda m: gru_mod.scan(gru_mod.project_inputs(q), m)),
        ("lstm_scan", steps, lambda m: lstm_scan(lstm, x_lstm, m)),
        ("intra_gru_scan", steps, lambda m: intra_gru_scan(gru, intra, q, m)),
    ] + [  # padding helpers added alongside this test; listed once they are public
        (name, pair, lambda m, name=name, x=x: getattr(attn_jax, name)(x, m))
        for name, x in (("zero_masked_keys", k), ("zero_masked_queries", q))
        if name in attn_jax.__all__
    ]


def test_every_public_mask_taker_refuses_float_and_int_masks(rng):
    # Each mask blocks the last key/step of every row, as boolean, PyTorch-additive float and 0/1 int.
    allowed = np.ones((B, T, S), bool)
    allowed[..., -1] = False
    allowed[..., T - 1] = False  # the recurrences read [B, T] = allowed[..., 0, :T]
    additive = np.where(allowed, 0.0, -np.inf).astype(np.float32)
    for name, shape, call in _mask_takers(rng):
        call(jnp.asarray(shape(allowed)))  # the boolean mask is accepted
        for bad in (additive, allowed.astype(np.float32), allowed.astype(np.int32)):
            with pytest.raises(
                ValueError, match=r"must be boolean.*(from_torch_attn_mask|from_torch_key_padding)"
            ):
                call(jnp.asarray(shape(bad)))
                pytest.fail(f"{name} accepted a {bad.dtype} mask")


def test_the_refusal_list_covers_every_public_mask_parameter():
    # A new public function with a `mask` parameter must join _mask_takers (or `converters`, if it takes a
    # PyTorch mask on purpose).
    import inspect

    covered = {name for name, _, _ in _mask_takers(np.random.default_rng(0)) if "." not in name}
    covered = {name.split("[")[0] for name in covered}
    converters = {"from_torch_attn_mask", "from_torch_key_padding_mask"}  # take PyTorch masks on purpose
    takers = set()
    for name in attn_jax.__all__:
        if not callable(getattr(attn_jax, name)):  # constants such as NORMALIZERS
            continue
        params = inspect.signature(getattr(attn_jax, name)).parameters
        if any("mask" in p or p in ("query_valid", "key_valid", "masks") for p in params):
            takers.add(name)
    assert takers - converters - covered == set()
    assert len(takers - converters) >= 13  # the check above saw the mask parameters at all


# --- from_torch_attn_mask: the float rule -------------------------------------------------------------------


@pytest.mark.parametrize(
    "blocked",
    [-np.inf, -1e9, float(np.finfo(np.float32).min), -1e4, -1000.0],
    ids=["-inf", "-1e9", "finfo.min", "-1e4", "-1000"],
)
def test_large_negative_float_entries_block_like_pytorch(rng, blocked):
    allowed = np.ones((B, T, S), bool)
    allowed[0, :, 2:] = False
    allowed[1, 3, :4] = False
    allowed[2, :, ::2] = False
    additive = np.where(allowed, 0.0, blocked).astype(np.float32)
    ours = attn_jax.from_torch_attn_mask(additive)
    assert ours.dtype == jnp.bool_
    np.testing.assert_array_equal(ours, allowed)
    np.testing.assert_array_equal(attn_jax.from_torch_key_padding_mask(additive[:, 0])[:, 0], allowed[:, 0])
    # PyTorch's meaning, in float64: softmax(q·k/√K + mask) v. With the converted mask our attention equals it.
    q, k, v = (_normal(rng, s) for s in [(B, T, D), (B, S, D), (B, S, 4)])
    bias = np.where(
        allowed, 0.0, max(blocked, -1e300)
    )  # -inf as a huge finite bias keeps the float64 path NaN-free
    want_ctx, want_w = dot_attention_ref(q, k, v, bias=bias)
    got_ctx, got_w = attn_jax.dot_product_attention(q, k, v, ours, return_weights=True)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_ctx, want_ctx, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got_w)[~allowed] == 0.0)


def test_bfloat16_bert_mask_still_blocks():
    # (1 - m) * -10000 in bfloat16 is -9984: still far below the -1000 threshold.
    m = jnp.array([[0.0, -10000.0]], jnp.bfloat16)
    assert float(m[0, 1]) == -9984.0
    np.testing.assert_array_equal(attn_jax.from_torch_attn_mask(m), [[True, False]])


@pytest.mark.parametrize("value", [-0.5, -100.0, -999.0, 1.0, np.inf, np.nan])
def test_bias_values_are_refused_with_a_pointer_to_bias(value):
    additive = np.array([[0.0, -np.inf, value]], np.float32)
    with pytest.raises(
        ValueError, match=r"attn_mask \[1, 3\] holds 1 value\(s\) .* an additive bias, not a mask.*bias="
    ):
        attn_jax.from_torch_attn_mask(additive)
    with pytest.raises(ValueError, match=r"key_padding_mask \[1, 3\] holds 1 value.*bias="):
        attn_jax.from_torch_key_padding_mask(additive)


def test_float_masks_convert_outside_jit_only():
    with pytest.raises(ValueError, match=r"float attn_mask .* unknown inside jit"):
        jax.jit(attn_jax.from_torch_attn_mask)(np.zeros((2, 3), np.float32))
    torch_bool = np.triu(np.ones((3, 3), bool), k=1)  # True = blocked
    np.testing.assert_array_equal(jax.jit(attn_jax.from_torch_attn_mask)(torch_bool), ~torch_bool)


# --- multi-head masks broadcast like the dot-product function's ---------------------------------------------


def test_multi_head_module_takes_the_library_causal_mask(rng):
    mod = MultiHeadAttention(H, D, qkv_features=6, rngs=nnx.Rngs(3))
    params = unwrap(mod.params)
    x = _normal(rng, (B, T, D))
    causal = attn_jax.make_causal_mask(T, T)  # [T, T]: used to raise "must have rank 3"
    got_out, got_w = mod(x, mask=causal, return_weights=True)
    want_out, want_w = multi_head_ref(params, x, mask=np.broadcast_to(causal, (B, T, T)))
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-5)
    # the pure function with the mask written out in full, the form it always accepted
    full = attn_jax.multi_head_attention(params, x, mask=jnp.broadcast_to(causal, (B, T, T)))
    # two float32 programs: D-term projections, T-term context, H·K-term output projection chained
    assert_close_f32(got_out, full, reduction=D + T + 6)
    # causality, checked with a gradient: no output at t depends on inputs after t
    jac = jax.jacrev(lambda x: mod(x, mask=causal)[0, 1].sum())(x)  # output row t=1 of batch 0
    assert np.all(np.asarray(jac)[0, 2:] == 0.0) and np.any(np.asarray(jac)[0, :2] != 0.0)


def test_multi_head_padding_mask_broadcasts_over_an_extra_leading_axis(rng):
    mod = MultiHeadAttention(H, D, qkv_features=6, rngs=nnx.Rngs(4))
    params = unwrap(mod.params)
    E = 2
    xq, xkv = _normal(rng, (E, B, T, D)), _normal(rng, (E, B, S, D))
    lengths = np.array([7, 4, 1])
    mask = attn_jax.key_padding_mask(attn_jax.make_padding_mask(lengths, S))  # [B, 1, S]
    got_out, got_w = mod(xq, xkv, mask, return_weights=True)
    want_out, want_w = multi_head_ref(params, xq, xkv, mask=np.broadcast_to(mask, (E, B, T, S)))
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-5)
    for b, n in enumerate(lengths):
        assert np.all(np.asarray(got_w)[:, b, ..., n:] == 0.0)
    # a per-head mask is still recognised at rank n + 1 = 5
    per_head = np.ones((E, B, H, T, S), bool)
    per_head[:, :, 1, :, 0] = False
    _, w = mod(xq, xkv, per_head, return_weights=True)
    assert np.all(np.asarray(w)[:, :, 1, :, 0] == 0.0) and np.all(np.asarray(w)[:, :, 0, :, 0] > 0.0)


def test_softmax_reference_agrees_with_the_hand_computed_row():
    # the float64 reference the tests above lean on, checked once by hand
    np.testing.assert_allclose(
        softmax_ref(np.array([[1.0, 2.0, 3.0]]), np.array([[True, False, True]])),
        [[1 / (1 + np.e**2), 0.0, np.e**2 / (1 + np.e**2)]],
    )
