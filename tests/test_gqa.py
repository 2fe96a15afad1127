"""Grouped-query / multi-query attention (Ainslie et al. 2023; Shazeer 2019): ``num_kv_heads`` in the dot-product
core, multi-head attention, the NNX module and the Transformer (its key/value cache shrinks by ``H / G``).

Odd, distinct sizes (B=3, H=6 query heads, G=2 or 1 key/value heads, T=5, S=7, K=4, Kv=3) so that a swapped axis or
a wrong head-to-group assignment (``h % G`` instead of ``h // (H / G)``) cannot pass.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_jax.attention._dot_product import dot_product_attention, dot_product_implementation
from attn_jax.attention._multihead import init_multi_head_params, multi_head_attention
from attn_jax.models.transformer import Transformer, TransformerConfig
from attn_jax.nn import MultiHeadAttention
from tests.reference.chunked import gqa_attention_grads_ref
from tests.reference.masks_dot import gqa_attention_ref, multi_head_gqa_ref
from tests.reference.transformer import transformer_ref
from tests.tolerance import assert_close_f32

B, H, T, S, K, KV = 3, 6, 5, 7, 4, 3
# Two float32 programs: logits over K, then a softmax and a context over S; a key's gradient also sums over the
# T queries of each of the H / G heads that share it (at most H of them, with MQA).
REDUCTION = K + 2 * S + T * H


def _normal(rng, shape):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32)


def _inputs(rng, groups, kv_width=KV):
    return _normal(rng, (B, H, T, K)), _normal(rng, (B, groups, S, K)), _normal(rng, (B, groups, S, kv_width))


def _mask(rng, shape):
    """A random boolean mask in which every query row keeps at least one key (peers average empty rows)."""
    m = rng.random(shape) < 0.6
    m[..., 0] |= ~m.any(-1)
    return jnp.asarray(m)


def _close_to_ref(actual, desired, what):
    """float32 against the float64 reference: 1e-5 relative to each entry and to the array's scale."""
    desired = np.asarray(desired)
    np.testing.assert_allclose(
        np.asarray(actual, np.float64), desired, rtol=1e-5, atol=1e-5 * np.max(np.abs(desired)), err_msg=what
    )


def _repeat_kv(x, groups):
    """Each key/value head repeated for its H / G query heads: the materialised form GQA avoids."""
    return jnp.repeat(x, H // groups, axis=-3)


# ------------------------------------------------------------------------------------------- dot-product core


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
@pytest.mark.parametrize("groups", [2, 1])
@pytest.mark.parametrize("mask_kind", ["per_head", "shared"])
def test_matches_float64_reference_forward_and_gradients(rng, implementation, groups, mask_kind):
    q, k, v = _inputs(rng, groups)
    mask = _mask(rng, (B, H, T, S) if mask_kind == "per_head" else (B, 1, T, S))
    d_out = _normal(rng, (B, H, T, KV))

    def attend(q, k, v):
        return dot_product_attention(q, k, v, mask, num_kv_heads=groups, implementation=implementation)

    out, vjp = jax.vjp(attend, q, k, v)
    ref, ref_weights = gqa_attention_ref(q, k, v, groups, mask)
    assert out.shape == (B, H, T, KV) and out.dtype == jnp.float32
    _close_to_ref(out, ref, "context")
    for name, grad, grad_ref in zip(
        ("dq", "dk", "dv"), vjp(d_out), gqa_attention_grads_ref(q, k, v, d_out, groups, mask), strict=True
    ):
        assert grad.shape == grad_ref.shape, name
        _close_to_ref(grad, grad_ref, name)
    if implementation == "xla":
        _, weights = dot_product_attention(q, k, v, mask, num_kv_heads=groups, return_weights=True)
        _close_to_ref(weights, ref_weights, "weights")


def test_reference_is_not_fooled_by_a_wrong_group_assignment(rng):
    """The reference (and so the test above) tells ``h // (H / G)`` from ``h % G``: the two differ by O(1)."""
    q, k, v = _inputs(rng, 2)
    ours = dot_product_attention(q, k, v, num_kv_heads=2)
    interleaved = dot_product_attention(
        q, jnp.tile(k, (1, 3, 1, 1)), jnp.tile(v, (1, 3, 1, 1))
    )  # head h -> h % 2
    assert float(jnp.max(jnp.abs(ours - interleaved))) > 0.1


@pytest.mark.numerics
@pytest.mark.parametrize("groups", [2, 1])
def test_matches_jax_nn_grouped_query_attention(rng, groups):
    """jax.nn.dot_product_attention's native GQA ([B, T, N, H] queries, [B, S, K, H] keys), forward and gradients."""
    q, k, v = _inputs(rng, groups, kv_width=K)  # jax.nn needs value width == key width
    mask = _mask(rng, (B, H, T, S))
    d_out = _normal(rng, (B, H, T, K))

    def peer(q, k, v):  # our [B, H, L, K] layout in and out
        t = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731
        return t(jax.nn.dot_product_attention(t(q), t(k), t(v), mask=mask, implementation="xla"))

    def ours(q, k, v):
        return dot_product_attention(q, k, v, mask, num_kv_heads=groups)

    out, vjp = jax.vjp(ours, q, k, v)
    out_peer, vjp_peer = jax.vjp(peer, q, k, v)
    assert_close_f32(out, out_peer, reduction=REDUCTION)
    assert_close_f32(vjp(d_out), vjp_peer(d_out), reduction=REDUCTION)


@pytest.mark.numerics
@pytest.mark.parametrize("implementation", ["xla", "chunked"])
def test_lengths_causal_window_equal_repeated_keys(rng, implementation):
    """Padding lengths, causal masking and a sliding window act per query head exactly as with repeated K/V."""
    q, k, v = _inputs(rng, 2)
    options = dict(
        query_lengths=jnp.array([[5], [3], [1]]),
        key_lengths=jnp.array([[7], [2], [4]]),
        causal=True,
        local_window=(2, 1),
        implementation=implementation,
    )
    grouped = dot_product_attention(q, k, v, num_kv_heads=2, **options)
    repeated = dot_product_attention(q, _repeat_kv(k, 2), _repeat_kv(v, 2), **options)
    assert_close_f32(grouped, repeated, reduction=REDUCTION)


def test_padded_keys_cannot_leak(rng):
    """NaN in keys/values past the key lengths reaches no output and no gradient (zeroed before any product)."""
    q, k, v = _inputs(rng, 2)
    lengths = jnp.array([[7], [4], [2]])
    pad = jnp.arange(S)[None, None, :, None] >= lengths[:, :, None, None]  # [B, 1, S, 1]
    k_nan, v_nan = jnp.where(pad, jnp.nan, k), jnp.where(pad, jnp.nan, v)

    def loss(k, v):
        return jnp.sum(dot_product_attention(q, k, v, num_kv_heads=2, key_lengths=lengths) ** 2)

    value, grads = jax.value_and_grad(loss, argnums=(0, 1))(k_nan, v_nan)
    assert np.isfinite(float(value)) and all(np.isfinite(g).all() for g in grads)
    for grad in grads:  # exactly no gradient on padding
        assert not np.any(np.where(pad, grad, 0.0))
    assert float(value) == float(loss(jnp.where(pad, 0.0, k), jnp.where(pad, 0.0, v)))


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
def test_grouped_keys_are_never_repeated(rng, implementation):
    """Neither pass holds a [B, H, S, K] key or value: each key/value head broadcasts over its group."""
    q, k, v = _inputs(rng, 2, kv_width=K)

    def loss(q, k, v):
        return jnp.sum(dot_product_attention(q, k, v, num_kv_heads=2, implementation=implementation) ** 2)

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).as_text()
    assert f"{B}x{H}x{S}x{K}xf32" not in hlo
    assert f"{B}x2x3x{T}x{K}xf32" in hlo  # the queries, viewed as [B, G, H/G, T, K]


@pytest.mark.numerics
def test_xla_uses_the_hand_written_derivative_and_forward_mode_works(rng):
    """The grouped "xla" path runs the FlashAttention-style custom_jvp (as ungrouped attention does), whose
    forward-mode derivative equals that of repeated keys/values."""
    q, k, v = _inputs(rng, 2)
    mask = _mask(rng, (B, H, T, S))

    def grouped(q, k, v):
        return dot_product_attention(q, k, v, mask, num_kv_heads=2, implementation="xla")

    def repeated(q, k, v):
        return dot_product_attention(q, _repeat_kv(k, 2), _repeat_kv(v, 2), mask, implementation="xla")

    assert "custom_jvp_call" in {e.primitive.name for e in jax.make_jaxpr(grouped)(q, k, v).eqns}
    tangents = _inputs(rng, 2)
    assert_close_f32(
        jax.jvp(grouped, (q, k, v), tangents), jax.jvp(repeated, (q, k, v), tangents), reduction=REDUCTION
    )


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
def test_num_kv_heads_equal_to_heads_is_the_same_program(rng, implementation):
    """``num_kv_heads=H`` is ordinary multi-head attention: bit for bit the results (and gradients) of ``None``."""
    q, k, v = _inputs(rng, H)
    mask = _mask(rng, (B, H, T, S))
    d_out = _normal(rng, (B, H, T, KV))

    def attend(q, k, v, num_kv_heads=None):
        return dot_product_attention(q, k, v, mask, num_kv_heads=num_kv_heads, implementation=implementation)

    plain_out, plain_vjp = jax.vjp(attend, q, k, v)
    same_out, same_vjp = jax.vjp(lambda *a: attend(*a, num_kv_heads=H), q, k, v)
    np.testing.assert_array_equal(same_out, plain_out)
    for a, b in zip(same_vjp(d_out), plain_vjp(d_out), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.numerics
def test_multi_query_equals_a_key_broadcast_over_heads(rng):
    """``num_kv_heads=1`` (MQA) is the same function as a ``[B, 1, S, K]`` key broadcast against the heads."""
    q, k, v = _inputs(rng, 1)
    mask = _mask(rng, (B, H, T, S))
    assert_close_f32(
        dot_product_attention(q, k, v, mask, num_kv_heads=1),
        dot_product_attention(q, k, v, mask),
        reduction=REDUCTION,
    )


def test_implementation_choice_never_cudnn_and_says_why(rng):
    q, k, v = _inputs(rng, 2)
    choice, reason = dot_product_implementation(q, k, v, num_kv_heads=2)
    assert choice == "xla" and "num_kv_heads" in reason
    with pytest.raises(ValueError, match="cudnn.*num_kv_heads"):
        dot_product_attention(q, k, v, num_kv_heads=2, implementation="cudnn")


@pytest.mark.parametrize(
    ("num_kv_heads", "key_heads", "message"),
    [
        (4, 4, r"num_kv_heads \(4\) must divide the query's heads H \(6, "),
        (0, 2, "num_kv_heads must be a positive int"),
        (-2, 2, "num_kv_heads must be a positive int"),
        (True, 1, "num_kv_heads must be a positive int"),
        (2.0, 2, "num_kv_heads must be a positive int"),
        (3, 2, "num_kv_heads=3 but key .* has 2 heads"),
    ],
)
def test_bad_num_kv_heads_raise_naming_it(rng, num_kv_heads, key_heads, message):
    q, k, v = _inputs(rng, key_heads)
    with pytest.raises(ValueError, match=message):
        dot_product_attention(q, k, v, num_kv_heads=num_kv_heads)


def test_bad_grouped_shapes_raise_with_shapes(rng):
    q, k, v = _inputs(rng, 2)
    with pytest.raises(ValueError, match="num_kv_heads=2 needs a head axis: query"):
        dot_product_attention(q[0, 0], k, v, num_kv_heads=2)
    with pytest.raises(ValueError, match=r"mask of shape \[3, 2, 5, 7\] does not broadcast .*\[3, 6, 5, 7\]"):
        dot_product_attention(q, k, v, jnp.ones((B, 2, T, S), bool), num_kv_heads=2)  # a mask over G, not H
    with pytest.raises(ValueError, match="num_kv_heads=2 but value"):
        dot_product_attention(q, k, v[:, :1], num_kv_heads=2)


# ------------------------------------------------------------------------------------------ multi-head attention


def _mha_params(rng, groups, *, dq=11, dk=9, dv=8, do=13):
    """Params in the init_multi_head_params layout with G key/value heads, drawn with NumPy, random biases."""
    shapes = {"query": (dq, H, K), "key": (dk, groups, K), "value": (dv, groups, KV), "out": (H, KV, do)}
    p = {}
    for name, shape in shapes.items():
        fan_in = shape[0] if name != "out" else H * KV
        p[name] = {
            "kernel": _normal(rng, shape) / np.sqrt(fan_in),
            "bias": 0.5 * _normal(rng, shape[1:] if name != "out" else (do,)),
        }
    return p


@pytest.mark.parametrize("groups", [2, 1])
def test_multi_head_matches_float64_reference(rng, groups):
    params = _mha_params(rng, groups)
    xq, xk, xv = _normal(rng, (B, T, 11)), _normal(rng, (B, S, 9)), _normal(rng, (B, S, 8))
    mask = _mask(rng, (B, T, S))
    out, weights = multi_head_attention(params, xq, xk, mask, inputs_v=xv, return_weights=True)
    ref, ref_weights = multi_head_gqa_ref(params, xq, xk, xv, mask)
    assert out.shape == (B, T, 13) and weights.shape == (B, H, T, S)
    _close_to_ref(out, ref, "out")
    _close_to_ref(weights, ref_weights, "weights")


def test_init_shapes_and_default_draw_unchanged(key):
    p = init_multi_head_params(key, H, 12, num_kv_heads=2)
    assert p["query"]["kernel"].shape == (12, H, 2) and p["out"]["kernel"].shape == (H, 2, 12)
    assert p["key"]["kernel"].shape == p["value"]["kernel"].shape == (12, 2, 2)
    assert p["key"]["bias"].shape == p["value"]["bias"].shape == (2, 2)
    # num_kv_heads=H (or None) is the very draw of ordinary multi-head attention
    same = init_multi_head_params(key, H, 12, num_kv_heads=H)
    jax.tree.map(np.testing.assert_array_equal, same, init_multi_head_params(key, H, 12))
    for bad in (4, 0, -1):
        with pytest.raises(ValueError, match="num_kv_heads"):
            init_multi_head_params(key, H, 12, num_kv_heads=bad)


def test_inconsistent_grouped_kernels_raise(rng):
    params = _mha_params(rng, 2)
    params["key"]["kernel"] = _normal(rng, (9, 4, K))  # 4 key heads do not divide 6
    params["value"]["kernel"] = _normal(rng, (8, 4, KV))
    with pytest.raises(ValueError, match=r"num_kv_heads 4.* must divide the query kernel's heads H \(6"):
        multi_head_attention(
            params, _normal(rng, (B, T, 11)), _normal(rng, (B, S, 9)), inputs_v=_normal(rng, (B, S, 8))
        )


@pytest.mark.numerics
def test_nnx_module_grouped_query(rng):
    m = MultiHeadAttention(H, 12, num_kv_heads=2, rngs=nnx.Rngs(0))
    assert m.params["key"]["kernel"].shape == (12, 2, 2)
    x = _normal(rng, (B, T, 12))
    mask = _mask(rng, (B, T, T))
    out = m(x, mask=mask)
    p = jax.tree.map(lambda v: v[...], nnx.to_pure_dict(nnx.state(m, nnx.Param)))
    ref, _ = multi_head_gqa_ref(p["params"], x, x, x, mask)
    _close_to_ref(out, ref, "module out")
    assert_close_f32(out, multi_head_attention(p["params"], x, None, mask), reduction=12 + 2 + 2 * T + 12)


# ------------------------------------------------------------------------------------------------- Transformer

TSIZES = dict(src_vocab=17, tgt_vocab=19, d_model=24, heads=H, d_ff=13, encoder_layers=1, decoder_layers=2)
TSIZES.update(max_length=9, dropout=0.0, norm="pre", positions="rope", share_embeddings="none")
SRC_LENGTHS = (7, 4, 1)
# Cached vs teacher-forced decoding: the same float32 arithmetic but for the masked key axis (T vs the cache's C);
# the longest chains as in tests/test_transformer.py: attention D + K + 2·max(S, C) + D, a layer adds the FFN and
# two layer norms, a decoder layer a cross-attention and a third norm, the output projection D.
D = TSIZES["d_model"]
_ATTENTION = D + D // H + 2 * 9 + D
_LAYER = _ATTENTION + D + TSIZES["d_ff"] + 4 * D
MODEL_REDUCTION = _LAYER + 2 * (_LAYER + _ATTENTION + 2 * D) + D


def _batch(t=6):
    r = np.random.default_rng(1)
    src = r.integers(3, 17, (B, S)).astype(np.int32)
    src_mask = np.arange(S)[None, :] < np.asarray(SRC_LENGTHS)[:, None]
    tgt = r.integers(3, 19, (B, t)).astype(np.int32)
    tgt[:, 0] = 1
    return jnp.asarray(np.where(src_mask, src, 0)), jnp.asarray(src_mask), jnp.asarray(tgt)


def _model(cfg, seed=0):
    """``(graphdef, state)`` of ``cfg``'s model with every parameter redrawn with NumPy (biases too, so the grouped
    key/value projections all matter), built abstractly: no eager initialisers."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    r = np.random.default_rng(seed)
    pure = nnx.to_pure_dict(state)
    nnx.replace_by_pure_dict(
        state, jax.tree.map(lambda a: jnp.asarray(0.3 * r.standard_normal(a.shape), a.dtype), pure)
    )
    return graphdef, state


@pytest.mark.parametrize("groups", [2, 1])
def test_transformer_cached_decode_equals_teacher_forcing(groups):
    graphdef, state = _model(TransformerConfig(**TSIZES, num_kv_heads=groups))
    assert nnx.to_pure_dict(state)["decoder"]["self_attention"]["key"]["kernel"].shape == (
        2,
        D,
        groups,
        D // H,
    )
    src, src_mask, tgt = _batch()

    @jax.jit
    def teacher(state):
        return nnx.merge(graphdef, state)(src, src_mask, tgt)

    @jax.jit
    def cached(state):
        m = nnx.merge(graphdef, state)
        enc = m.encode(src, src_mask)
        dec = m.init_decoder_state(enc)
        logits, attn = [], []
        for i in range(tgt.shape[1]):  # unrolled: six steps, one compilation
            lo, dec, a = m.decode_step(enc, dec, tgt[:, i])
            logits.append(lo)
            attn.append(a)
        return jnp.stack(logits, 1), jnp.stack(attn, 1), dec

    logits, attn = teacher(state)
    step_logits, step_attn, dec = cached(state)
    assert dec.keys.shape == (B, 2, groups, 9, D // H)
    assert_close_f32((step_logits, step_attn), (logits, attn), reduction=MODEL_REDUCTION)
    assert float(jnp.std(logits)) > 0.1  # a model whose logits carry its parameters' signal


def test_transformer_cache_bytes_shrink_by_heads_over_kv_heads():
    src, src_mask, _ = _batch()
    sizes = {}
    for groups in (0, 2, 1):  # 0: ordinary multi-head attention (6 key/value heads)
        cfg = TransformerConfig(**TSIZES, num_kv_heads=groups)
        graphdef, state = nnx.split(nnx.eval_shape(lambda cfg=cfg: Transformer(cfg, rngs=nnx.Rngs(0))))

        def start(state, graphdef=graphdef):
            m = nnx.merge(graphdef, state)
            enc = m.encode(src, src_mask)
            return enc, m.init_decoder_state(enc)

        enc, dec = jax.eval_shape(start, state)  # shapes only: nothing is computed
        sizes[groups] = (dec.keys.size + dec.values.size) * dec.keys.dtype.itemsize, enc.keys.size
    full_cache, full_cross = sizes[0]
    assert full_cache == B * 2 * 2 * H * 9 * (D // H) * 4  # [B, L_dec, H, C, K] keys and values, float32
    for groups in (2, 1):
        cache, cross = sizes[groups]
        assert full_cache == cache * (H // groups)
        assert full_cross == cross * (H // groups)


def test_transformer_num_kv_heads_equal_heads_is_the_default_model():
    """``num_kv_heads=heads`` is the default model: the same parameters and bit-identical logits."""
    src, src_mask, tgt = _batch()
    outs = []
    for groups in (0, H):
        cfg = TransformerConfig(**TSIZES, num_kv_heads=groups)
        graphdef, state = nnx.split(jax.jit(lambda cfg=cfg: Transformer(cfg, rngs=nnx.Rngs(0)))())
        logits = jax.jit(lambda st, g=graphdef: nnx.merge(g, st)(src, src_mask, tgt))(state)
        outs.append((nnx.to_pure_dict(state), logits))
    jax.tree.map(np.testing.assert_array_equal, outs[0], outs[1])


@pytest.mark.parametrize("bad", [4, -1, 5, 2.0, True])
def test_transformer_config_rejects_bad_num_kv_heads_in_one_line(bad):
    with pytest.raises(
        ValueError, match=r"^transformer config: num_kv_heads must be 0 \(= heads\) or a positive"
    ) as e:
        TransformerConfig(**TSIZES, num_kv_heads=bad)
    assert "\n" not in str(e.value)
    assert TransformerConfig(**TSIZES).kv_heads == H
    assert TransformerConfig(**TSIZES, num_kv_heads=3).kv_heads == 3


def test_transformer_matches_float64_reference_with_repeated_kv_heads():
    """A grouped model is the ordinary model whose key/value kernels and biases are repeated per group: checked
    against the float64 loop reference of tests/reference/transformer.py (which knows nothing of grouping)."""
    graphdef, state = _model(TransformerConfig(**TSIZES, num_kv_heads=2))
    src, src_mask, tgt = _batch()
    logits, attn = jax.jit(lambda st: nnx.merge(graphdef, st)(src, src_mask, tgt))(state)
    params = nnx.to_pure_dict(state)
    for stack, names in (("encoder", ("attention",)), ("decoder", ("self_attention", "cross_attention"))):
        for name in names:
            p = params[stack][name]
            for proj in ("key", "value"):  # kernel [L, D, G, K] -> [L, D, H, K]; bias [L, G, K] -> [L, H, K]
                p[proj]["kernel"] = jnp.repeat(p[proj]["kernel"], H // 2, axis=2)
                p[proj]["bias"] = jnp.repeat(p[proj]["bias"], H // 2, axis=1)
    options = {k: TSIZES[k] for k in ("norm", "positions", "share_embeddings")}
    ref = transformer_ref(params, src, src_mask, tgt, **options)
    # float32 vs float64 through 1 + 2 layers: 1e-5 of the reference's scale (as tests/test_transformer.py)
    scale = np.max(np.abs(ref["logits"]))
    assert np.max(np.abs(np.asarray(logits, np.float64) - ref["logits"])) < 1e-5 * scale
    np.testing.assert_allclose(attn, ref["cross"][:, -1].mean(axis=1), rtol=0, atol=1e-5)
