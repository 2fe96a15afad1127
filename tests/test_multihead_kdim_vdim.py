"""Multi-head attention with separate key and value inputs of different widths (``torch.nn.MultiheadAttention``'s
``kdim``/``vdim``): ``multi_head_attention(..., inputs_v=...)`` and ``init_multi_head_params(value_features=...)``.

Odd, distinct sizes: B=3, T=5, S=7, Dq=12 (= PyTorch's embed_dim), Dk=9, Dv=11, H=4, K=3.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_jax.attention._multihead import init_multi_head_params, multi_head_attention
from attn_jax.nn import MultiHeadAttention
from tests.reference.masks_dot import multi_head_gqa_ref
from tests.tolerance import assert_close_f32

B, T, S, DQ, DK, DV, H = 3, 5, 7, 12, 9, 11, 4
K = DQ // H
# Two float32 programs: the input projections over max(Dq, Dk, Dv), logits over K, softmax and context over S, the
# output projection over H·K.
REDUCTION = DV + K + 2 * S + DQ


def _normal(rng, shape, scale=1.0):
    return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32)


def _params(rng):
    """Random kernels ~ N(0, 1/fan_in) and visibly non-zero biases, so every term is checked."""
    shapes = {"query": (DQ, H, K), "key": (DK, H, K), "value": (DV, H, K), "out": (H, K, DQ)}
    return {
        name: {
            "kernel": _normal(rng, shape, 1 / np.sqrt(shape[0] if name != "out" else DQ)),
            "bias": _normal(rng, shape[1:] if name != "out" else (DQ,), 0.5),
        }
        for name, shape in shapes.items()
    }


def _inputs(rng):
    return _normal(rng, (B, T, DQ)), _normal(rng, (B, S, DK)), _normal(rng, (B, S, DV))


def _padding_mask(lengths=(7, 4, 2)):
    return jnp.arange(S)[None, None, :] < jnp.asarray(lengths)[:, None, None]  # [B, 1, S]


def test_matches_float64_reference(rng):
    params = _params(rng)
    xq, xk, xv = _inputs(rng)
    mask = _padding_mask()
    out, weights = multi_head_attention(params, xq, xk, mask, inputs_v=xv, return_weights=True)
    ref, ref_weights = multi_head_gqa_ref(params, xq, xk, xv, mask)
    for actual, desired in ((out, ref), (weights, ref_weights)):
        np.testing.assert_allclose(actual, desired, rtol=1e-5, atol=1e-5 * np.max(np.abs(desired)))
    # the values really come from inputs_v: the keys' input in their place is another function
    assert float(jnp.max(jnp.abs(out - multi_head_attention(params, xq, xk, mask, inputs_v=xv * 2.0)))) > 0.1


@pytest.mark.numerics
def test_matches_torch_multihead_attention_kdim_vdim(rng):
    torch = pytest.importorskip("torch")
    params = _params(rng)
    xq, xk, xv = _inputs(rng)
    lengths = (7, 4, 2)
    m = torch.nn.MultiheadAttention(DQ, H, kdim=DK, vdim=DV, batch_first=True)
    f = lambda x: torch.from_numpy(np.array(x, np.float32))  # noqa: E731  (a writable copy)
    with torch.no_grad():
        # ours: kernel [D, H, K], y[h, k] = Σ_d x[d] W[d, h, k]; torch: y[h·K + k] = Σ_d W[h·K + k, d] x[d]
        for name in ("query", "key", "value"):
            w = params[name]["kernel"]
            getattr(m, f"{name[0]}_proj_weight").copy_(f(np.asarray(w).reshape(w.shape[0], -1).T))
        m.in_proj_bias.copy_(
            f(np.concatenate([np.asarray(params[n]["bias"]).reshape(-1) for n in ("query", "key", "value")]))
        )
        m.out_proj.weight.copy_(f(np.asarray(params["out"]["kernel"]).reshape(H * K, DQ).T))
        m.out_proj.bias.copy_(f(params["out"]["bias"]))
        pad = torch.from_numpy(~np.asarray(_padding_mask(lengths))[:, 0])  # [B, S], True = ignore
        out_t, w_t = m(
            f(xq), f(xk), f(xv), key_padding_mask=pad, need_weights=True, average_attn_weights=False
        )
    out, weights = multi_head_attention(
        params, xq, xk, _padding_mask(lengths), inputs_v=xv, return_weights=True
    )
    assert_close_f32((out, weights), (out_t.numpy(), w_t.numpy()), reduction=REDUCTION)


def test_without_inputs_v_nothing_changes(rng):
    """``inputs_v=None`` reads the values from ``inputs_kv``: the same program as before, bit for bit."""
    params = init_multi_head_params(jax.random.key(0), H, DQ, key_features=DK)
    same = init_multi_head_params(jax.random.key(0), H, DQ, key_features=DK, value_features=DK)
    jax.tree.map(np.testing.assert_array_equal, same, params)
    xq, xk, _ = _inputs(rng)
    np.testing.assert_array_equal(
        multi_head_attention(params, xq, xk, inputs_v=xk), multi_head_attention(params, xq, xk)
    )


def test_init_value_features(key):
    p = init_multi_head_params(key, H, DQ, key_features=DK, value_features=DV)
    assert p["key"]["kernel"].shape == (DK, H, K) and p["value"]["kernel"].shape == (DV, H, K)
    # LeCun normal over each kernel's own fan-in
    std = float(jnp.std(p["value"]["kernel"]))
    assert abs(std * np.sqrt(DV) - 1.0) < 0.35
    with pytest.raises(ValueError, match="value_features must be a positive int"):
        init_multi_head_params(key, H, DQ, value_features=0)


def test_padding_content_of_inputs_v_cannot_leak(rng):
    params = _params(rng)
    xq, xk, xv = _inputs(rng)
    mask = _padding_mask()
    pad = ~mask[:, 0, :, None]  # [B, S, 1]
    xv_nan = jnp.where(pad, jnp.nan, xv)

    def loss(params, xv):
        return jnp.sum(multi_head_attention(params, xq, xk, mask, inputs_v=xv) ** 2)

    value, grads = jax.value_and_grad(loss, argnums=(0, 1))(params, xv_nan)
    assert np.isfinite(float(value)) and all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
    assert float(value) == float(loss(params, jnp.where(pad, 0.0, xv)))


@pytest.mark.numerics
def test_nnx_module_value_features(rng):
    m = MultiHeadAttention(H, DQ, kv_features=DK, value_features=DV, rngs=nnx.Rngs(0))
    assert m.params["value"]["kernel"].shape == (DV, H, K)
    xq, xk, xv = _inputs(rng)
    mask = _padding_mask()
    out = m(xq, xk, mask, inputs_v=xv)
    p = nnx.to_pure_dict(nnx.state(m, nnx.Param))["params"]
    ref, _ = multi_head_gqa_ref(p, xq, xk, xv, mask)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.max(np.abs(ref)))
    assert_close_f32(out, multi_head_attention(p, xq, xk, mask, inputs_v=xv), reduction=REDUCTION)


def test_errors_name_the_inputs(rng):
    params = _params(rng)
    xq, xk, xv = _inputs(rng)
    with pytest.raises(ValueError, match="pass the values' input as inputs_v"):
        multi_head_attention(params, xq, xk)  # value kernel expects Dv = 11, keys' input is 9 wide
    with pytest.raises(ValueError, match="inputs_v .* needs inputs_kv"):
        multi_head_attention(params, xq, None, inputs_v=xv)
    with pytest.raises(
        ValueError, match=r"inputs_v \[3, 7, 9\] has width 9 but the value kernel \[11, 4, 3\]"
    ):
        multi_head_attention(params, xq, xk, inputs_v=xk)
    with pytest.raises(
        ValueError, match=r"inputs_v \[3, 6, 11\] and inputs_kv \[3, 7, 9\] must have the same length"
    ):
        multi_head_attention(params, xq, xk, inputs_v=xv[:, :6])
    with pytest.raises(ValueError, match="shapes do not broadcast.*inputs_v batch axes"):
        multi_head_attention(params, xq, xk, inputs_v=xv[:2])
