"""NNX modules: each owns its parameters, carries logical axis names, and computes what the float64 references say."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_jax.nn import AdditiveAttention, DotProductAttention, LuongAttention, MultiHeadAttention
from attn_jax.nn._params import unwrap
from tests.reference.core import softmax_ref
from tests.reference.masks_dot import dot_attention_ref, multi_head_ref
from tests.reference.scorers import additive_ref, general_scores_ref, local_ref, predictive_centers_ref
from tests.tolerance import assert_close_f32

B, T, S, DQ, DK, A = 3, 5, 7, 11, 6, 9


def _inputs(rng):
    q = rng.normal(size=(B, T, DQ)).astype(np.float32)
    k = rng.normal(size=(B, S, DK)).astype(np.float32)
    lengths = np.array([7, 4, 1])
    key_valid = np.arange(S)[None, :] < lengths[:, None]  # [B, S]
    return q, k, lengths, key_valid


@pytest.mark.parametrize("normalize", [False, True])
def test_additive_module_matches_reference_and_step(rng, normalize):
    q, k, _, key_valid = _inputs(rng)
    mod = AdditiveAttention(DQ, DK, A, normalize=normalize, rngs=nnx.Rngs(0))
    params = unwrap(mod.params)
    assert ("g" in params) == normalize
    ctx, w = mod(q, k, mask=key_valid[:, None, :], return_weights=True)
    ref_ctx, ref_w = additive_ref(params, q, k, mask=key_valid[:, None, :])
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ctx, ref_ctx, rtol=1e-5, atol=1e-5)
    # The split form: keys projected once, then one query per step inside a scan.
    pk = mod.project_keys(k)

    def body(_, q_t):
        return None, mod.step(q_t, pk, k, key_valid)

    _, (ctx_steps, w_steps) = jax.lax.scan(body, None, jnp.swapaxes(q, 0, 1))
    np.testing.assert_allclose(jnp.swapaxes(w_steps, 0, 1), ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jnp.swapaxes(ctx_steps, 0, 1), ref_ctx, rtol=1e-5, atol=1e-5)


def test_additive_module_trains_through_nnx_grad(rng):
    q, k, _, key_valid = _inputs(rng)
    mod = AdditiveAttention(DQ, DK, A, rngs=nnx.Rngs(1))
    target = jnp.zeros((B, T, S)).at[:, :, 0].set(1.0)

    def loss(m):
        _, w = m(q, k, mask=key_valid[:, None, :], return_weights=True)
        return -(target * jnp.log(w + 1e-9)).sum()

    before = float(loss(mod))
    for _ in range(30):
        grads = nnx.grad(loss)(mod)
        nnx.update(mod, jax.tree.map(lambda p, g: p - 0.05 * g, nnx.state(mod, nnx.Param), grads))
    assert float(loss(mod)) < 0.5 * before


def test_luong_general_global_matches_reference(rng):
    q, _, _, key_valid = _inputs(rng)
    k = rng.normal(size=(B, S, DK)).astype(np.float32)
    mod = LuongAttention(DQ, DK, score="general", rngs=nnx.Rngs(0))
    ctx, w = mod(q, k, mask=key_valid[:, None, :], return_weights=True)
    e = general_scores_ref(q, k, unwrap(mod.params)["score"]["w"])
    ref_w = softmax_ref(e, key_valid[:, None, :])
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)


def test_luong_local_p_matches_reference(rng):
    q, _, lengths, key_valid = _inputs(rng)
    k = rng.normal(size=(B, S, DK)).astype(np.float32)
    mod = LuongAttention(DQ, DK, score="general", local="p", window=2, attention_dim=A, rngs=nnx.Rngs(0))
    p = unwrap(mod.params)
    ctx, w = mod(q, k, mask=key_valid[:, None, :], source_lengths=jnp.asarray(lengths), return_weights=True)
    e = general_scores_ref(q, k, p["score"]["w"])
    centers = predictive_centers_ref(q, p["position"]["w_p"], p["position"]["v_p"], lengths)
    ref_ctx, ref_w = local_ref(e, k, centers, 2, mask=key_valid[:, None, :], gaussian=True)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ctx, ref_ctx, rtol=1e-5, atol=1e-5)


def test_dot_product_module_matches_reference(rng):
    q = rng.normal(size=(B, 2, T, 4)).astype(np.float32)
    k = rng.normal(size=(B, 2, S, 4)).astype(np.float32)
    v = rng.normal(size=(B, 2, S, 3)).astype(np.float32)
    ctx = DotProductAttention()(q, k, v)
    np.testing.assert_allclose(ctx, dot_attention_ref(q, k, v)[0], rtol=1e-5, atol=1e-5)


def test_multi_head_module_matches_reference_and_flax(rng):
    x = rng.normal(size=(B, T, 12)).astype(np.float32)
    mem = rng.normal(size=(B, S, 10)).astype(np.float32)
    _, _, _, key_valid = _inputs(rng)
    mod = MultiHeadAttention(3, 12, kv_features=10, qkv_features=6, out_features=8, rngs=nnx.Rngs(0))
    out, w = mod(x, mem, key_valid[:, None, :], return_weights=True)
    ref_out, ref_w = multi_head_ref(unwrap(mod.params), x, mem, key_valid[:, None, :])
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)


def test_multi_head_rejects_heads_not_dividing_width():
    with pytest.raises(ValueError, match="5"):
        MultiHeadAttention(5, 12, rngs=nnx.Rngs(0))


def test_kernels_carry_logical_axis_names():
    add = AdditiveAttention(DQ, DK, A, rngs=nnx.Rngs(0))
    mha = MultiHeadAttention(2, 8, rngs=nnx.Rngs(0))
    add_specs = nnx.get_partition_spec(nnx.state(add, nnx.Param))
    mha_specs = nnx.get_partition_spec(nnx.state(mha, nnx.Param))
    assert tuple(add_specs["params"]["w_q"].get_value()) == ("hidden", "align")
    assert tuple(add_specs["params"]["v"].get_value()) == ("align",)
    assert tuple(mha_specs["params"]["query"]["kernel"].get_value()) == ("embed", "heads", "kv")
    assert tuple(mha_specs["params"]["out"]["kernel"].get_value()) == ("heads", "kv", "embed")
    # The names must match the rank of every kernel so a rule table can shard them without a rewrite.
    for var in jax.tree.leaves(nnx.state(mha, nnx.Param), is_leaf=lambda v: isinstance(v, nnx.Variable)):
        assert len(var.get_metadata()["out_sharding"]) == var[...].ndim


@pytest.mark.numerics
def test_modules_run_under_nnx_jit(rng):
    q, k, _, key_valid = _inputs(rng)
    mod = AdditiveAttention(DQ, DK, A, rngs=nnx.Rngs(0))
    eager = mod(q, k, mask=key_valid[:, None, :])
    jitted = nnx.jit(lambda m, a, b, c: m(a, b, mask=c))(mod, q, k, key_valid[:, None, :])
    # two programs (fused vs op by op): projections over Dk, v·tanh and |v| over A, softmax and context over S
    assert_close_f32(jitted, eager, reduction=DK + 2 * A + 2 * S)
