"""``normalizer=`` (sparsemax, 1.5-entmax) on scaled dot-product attention, multi-head attention and the
Transformer (``model.normalizer``), against float64 references; masks and fully masked rows keep their policy;
the softmax default stays the same program.

References: ``tests/reference/normalizers.py`` (sparsemax by sort and threshold, 1.5-entmax by bisection, row
Jacobians by float64 central differences), ``masks_dot.dot_scores_ref`` for the logits and
``transformer.transformer_ref`` / ``mha_ref`` with ``normalizer=``. Gradients are checked against the chain rule
written out in float64 around those finite-difference Jacobians. Sizes are odd and distinct (B=3, H=2, T=5,
S=7, K=4, Kv=3) so a swapped axis cannot pass.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_jax import nn as attn_nn
from attn_jax.attention import (
    dot_product_attention,
    dot_product_implementation,
    init_multi_head_params,
    make_causal_mask,
    multi_head_attention,
)
from attn_jax.attention._softmax import assert_valid_attention_weights
from attn_jax.models.transformer import Transformer, TransformerConfig
from tests.reference.masks_dot import dot_scores_ref
from tests.reference.normalizers import ROW_REFS, attention_ref, vjp_ref
from tests.reference.scorers import rel_err
from tests.reference.transformer import f64, mha_ref, transformer_ref
from tests.tolerance import assert_close_f32

B, H, T, S, K, KV = 3, 2, 5, 7, 4, 3
SPARSE = ("sparsemax", "entmax15")
REDUCTION = K + 2 * S  # logits over K, then the normaliser's sums and the context over S


def _operands(rng, spread=2.5):
    """Queries scaled so the logits spread over a few units: the sparse normalisers drop keys."""
    q = spread * rng.normal(size=(B, H, T, K))
    k = rng.normal(size=(B, H, S, K))
    v = rng.normal(size=(B, H, S, KV))
    return tuple(x.astype(np.float32) for x in (q, k, v))


def _mask(rng):
    """``[B, 1, T, S]`` (broadcast over heads) with a query that sees nothing and a sentence with no key."""
    mask = rng.random((B, 1, T, S)) < 0.75
    mask[0, 0, 1] = False
    mask[2] = False
    return mask


def _bias(rng, mask_shape=(B, H, T, S)):
    """A finite bias with a few ``-inf`` entries (forbidden pairs)."""
    bias = (0.5 * rng.normal(size=mask_shape)).astype(np.float32)
    bias[rng.random(mask_shape) < 0.1] = -np.inf
    return bias


def _reference(q, k, v, mask, bias, name):
    """float64 ``(context, weights, logits, allowed)``; a ``-inf`` bias entry is a masked pair."""
    logits = dot_scores_ref(q, k)
    allowed = np.broadcast_to(np.ones((), bool) if mask is None else mask, logits.shape)
    if bias is not None:
        allowed = allowed & (bias != -np.inf)
        logits = logits + np.where(bias == -np.inf, 0.0, bias)
    context, weights = attention_ref(logits, v, allowed, name)
    return context, weights, logits, allowed


@functools.cache
def _attend(name, **options):
    return jax.jit(
        lambda q, k, v, m, b: dot_product_attention(
            q, k, v, m, bias=b, return_weights=True, normalizer=name, **options
        )
    )


# --- dot-product attention against float64 ---------------------------------------------------------------------


@pytest.mark.parametrize("name", SPARSE)
def test_dot_product_matches_float64_reference_with_masks_and_bias(name, rng):
    q, k, v = _operands(rng)
    mask, bias = _mask(rng), _bias(rng)
    ctx, w = _attend(name)(q, k, v, mask, bias)
    ctx_ref, w_ref, _, allowed = _reference(q, k, v, mask, bias, name)
    assert rel_err(w, w_ref) < 1e-5 and rel_err(ctx, ctx_ref) < 1e-5
    w = np.asarray(w)
    np.testing.assert_array_equal(w == 0, w_ref == 0)  # the same support, entry by entry
    assert np.all(w[~allowed] == 0.0)
    assert np.any(w[allowed] == 0.0)  # allowed keys given exactly zero weight: the point of the option
    assert np.all(np.asarray(ctx)[~allowed.any(-1)] == 0.0)  # no allowed key: a zero context, not NaN
    assert_valid_attention_weights(w, allowed)


@pytest.mark.parametrize("name", SPARSE)
def test_gradients_match_float64_reference_jacobian(name, rng):
    """d/dq, d/dk, d/dv, d/dbias of ⟨g, context⟩ against the chain rule in float64 around the FD row Jacobians."""
    q, k, v = _operands(rng)
    mask, bias = _mask(rng), _bias(rng)
    g = rng.normal(size=(B, H, T, KV)).astype(np.float32)

    def loss(q, k, v, b):
        return jnp.sum(g * dot_product_attention(q, k, v, mask, bias=b, normalizer=name))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, bias)
    _, w_ref, logits, allowed = _reference(q, k, v, mask, bias, name)
    g64, q64, k64, v64 = (np.asarray(x, np.float64) for x in (g, q, k, v))
    d_weights = np.einsum("bhtd,bhsd->bhts", g64, v64)
    d_logits = vjp_ref(ROW_REFS[name], np.where(allowed, logits, 0.0), d_weights, allowed)
    scale = 1.0 / np.sqrt(K)
    want = (
        scale * np.einsum("bhts,bhsk->bhtk", d_logits, k64),
        scale * np.einsum("bhts,bhtk->bhsk", d_logits, q64),
        np.einsum("bhts,bhtd->bhsd", w_ref, g64),
        d_logits,
    )
    for got, ref, what in zip(grads, want, ("query", "key", "value", "bias"), strict=True):
        got = np.asarray(got)
        assert np.all(np.isfinite(got)), what
        assert rel_err(got, ref) < 1e-5, what
    assert np.all(np.asarray(grads[3])[~allowed] == 0.0)  # forbidden pairs get exactly zero gradient
    assert np.all(np.asarray(grads[0])[2] == 0.0)  # the sentence with no key: zero, finite query gradients


@pytest.mark.numerics
@pytest.mark.parametrize("name", SPARSE)
def test_grouped_query_heads_match_the_repeated_reference(name, rng):
    q, _, _ = _operands(rng)
    k1 = rng.normal(size=(B, 1, S, K)).astype(np.float32)  # one key/value head shared by both query heads
    v1 = rng.normal(size=(B, 1, S, KV)).astype(np.float32)
    mask = _mask(rng)
    ctx, w = jax.jit(
        lambda q, k, v, m: dot_product_attention(
            q, k, v, m, num_kv_heads=1, return_weights=True, normalizer=name
        )
    )(q, k1, v1, mask)
    k_rep, v_rep = np.repeat(k1, H, axis=1), np.repeat(v1, H, axis=1)
    ctx_ref, w_ref, _, _ = _reference(q, k_rep, v_rep, mask, None, name)
    assert rel_err(w, w_ref) < 1e-5 and rel_err(ctx, ctx_ref) < 1e-5
    # and without return_weights (the path multi-head and the Transformer's cache take when they skip weights)
    ctx_only = dot_product_attention(q, k1, v1, mask, num_kv_heads=1, normalizer=name)
    assert_close_f32(ctx_only, ctx, reduction=REDUCTION)


# --- the mask policy, as properties ------------------------------------------------------------------------------


@pytest.mark.numerics
@pytest.mark.parametrize("name", SPARSE)
def test_nan_in_padding_changes_nothing_and_gradients_stay_finite(name, rng):
    q, k, v = _operands(rng)
    key_len = np.array([7, 4, 0])
    query_len = np.array([5, 3, 2])
    mask = (np.arange(T)[:, None] < query_len[:, None, None, None]) & (
        np.arange(S) < key_len[:, None, None, None]
    )
    pad_q = ~(np.arange(T) < query_len[:, None])[:, None, :, None]  # [B, 1, T, 1]
    pad_k = ~(np.arange(S) < key_len[:, None])[:, None, :, None]
    dirty = (np.where(pad_q, np.nan, q), np.where(pad_k, np.inf, k), np.where(pad_k, np.nan, v))
    clean_out = _attend(name)(q, k, v, mask, None)
    dirty_out = _attend(name)(*dirty, mask, None)
    for a, b in zip(dirty_out, clean_out, strict=True):  # the same program: bit for bit
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    grads = jax.grad(lambda *x: jnp.sum(dot_product_attention(*x, mask, normalizer=name) ** 2), (0, 1, 2))(
        *dirty
    )
    for grad, pad in zip(grads, (pad_q, pad_k, pad_k), strict=True):
        grad = np.asarray(grad)
        assert np.all(np.isfinite(grad))
        assert np.all(grad[np.broadcast_to(pad, grad.shape)] == 0.0)  # padded rows: exactly zero
    # lengths are the same pairs as the mask: another program, the same numbers
    by_lengths = dot_product_attention(
        q, k, v, query_lengths=query_len[:, None], key_lengths=key_len[:, None], normalizer=name
    )
    assert_close_f32(by_lengths, clean_out[0], reduction=REDUCTION)


@pytest.mark.numerics
@pytest.mark.parametrize("name", SPARSE)
def test_padded_equals_truncated_and_the_future_never_reaches_the_past(name, rng):
    q, k, v = _operands(rng)
    extra = 3  # keys padded with junk beyond S, masked
    k_pad = np.concatenate([k, 50.0 * np.ones((B, H, extra, K), np.float32)], axis=2)
    v_pad = np.concatenate([v, np.full((B, H, extra, KV), 7.0, np.float32)], axis=2)
    keep = np.arange(S + extra) < S
    padded = dot_product_attention(q, k_pad, v_pad, np.broadcast_to(keep, (T, S + extra)), normalizer=name)
    assert_close_f32(padded, dot_product_attention(q, k, v, normalizer=name), reduction=REDUCTION)
    # causal: the output at position t has exactly zero gradient w.r.t. every key and value after t
    t = 2
    jac_k, jac_v = jax.jacrev(
        lambda k, v: dot_product_attention(q, k, v, causal=True, normalizer=name)[:, :, t], (0, 1)
    )(k, v)  # [B, H, Kv, B, H, S, K|Kv]
    assert np.all(np.asarray(jac_k)[..., t + 1 :, :] == 0.0) and np.all(
        np.asarray(jac_v)[..., t + 1 :, :] == 0.0
    )
    assert np.any(np.asarray(jac_v)[..., : t + 1, :] != 0.0)
    # causal=True is the causal mask
    assert_close_f32(
        dot_product_attention(q, k, v, causal=True, normalizer=name),
        dot_product_attention(q, k, v, make_causal_mask(T, S), normalizer=name),
        reduction=REDUCTION,
    )


_property_attend = {
    name: jax.jit(
        lambda q, k, v, m, name=name: dot_product_attention(q, k, v, m, return_weights=True, normalizer=name)
    )
    for name in SPARSE
}


@settings(max_examples=12)
@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(SPARSE), spread=st.sampled_from([0.1, 1.0, 30.0]))
def test_weights_are_a_masked_distribution_for_any_mask(seed, name, spread):
    """Any mask, any logit scale: allowed rows sum to 1, forbidden keys get exactly 0, nothing is NaN."""
    rng = np.random.default_rng(seed)
    q, k, v = _operands(rng, spread)
    mask = rng.random((B, H, T, S)) < rng.uniform(0.0, 1.0)
    ctx, w = _property_attend[name](q, k, v, mask)
    assert np.all(np.isfinite(np.asarray(ctx)))
    assert_valid_attention_weights(np.asarray(w), mask)
    assert np.all(np.asarray(ctx)[~mask.any(-1)] == 0.0)


# --- implementations, errors, the default ----------------------------------------------------------------------


def test_only_xla_forms_sparse_weights_and_none_picks_it(rng):
    q, k, v = _operands(rng)
    for impl in ("chunked", "cudnn"):
        with pytest.raises(
            ValueError, match=f"normalizer='sparsemax' needs implementation='xla'.*{impl!r}"
        ) as e:
            dot_product_attention(q, k, v, implementation=impl, normalizer="sparsemax")
        assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match="needs implementation='xla'"):
            dot_product_attention(
                q, k[:, :1], v[:, :1], implementation=impl, num_kv_heads=1, normalizer="entmax15"
            )
    big = jnp.zeros((4096, 8), jnp.float32)  # one head's 4096 x 4096 logits: None would pick "chunked"
    assert dot_product_implementation(big, big, big)[0] == "chunked"
    choice, why = dot_product_implementation(big, big, big, normalizer="entmax15")
    assert choice == "xla" and "entmax15" in why
    assert (
        dot_product_implementation(q, k[:, :1], v[:, :1], num_kv_heads=1, normalizer="sparsemax")[0] == "xla"
    )


def test_unknown_normalizer_is_refused_everywhere(rng):
    q, k, v = _operands(rng)
    params = init_multi_head_params(jax.random.key(0), H, 6)
    x = jnp.ones((B, T, 6))
    calls = [
        lambda: dot_product_attention(q, k, v, normalizer="softmax2"),
        lambda: dot_product_attention(q, k[:, :1], v[:, :1], num_kv_heads=1, normalizer="softmax2"),
        lambda: dot_product_implementation(q, k, v, normalizer="softmax2"),
        lambda: multi_head_attention(params, x, normalizer="softmax2"),
        lambda: attn_nn.DotProductAttention(normalizer="softmax2"),
        lambda: attn_nn.MultiHeadAttention(H, 6, normalizer="softmax2", rngs=nnx.Rngs(0)),
    ]
    for call in calls:
        with pytest.raises(
            ValueError, match="normalizer must be one of 'softmax', 'sparsemax', 'entmax15'; got"
        ):
            call()
    with pytest.raises(ValueError, match="transformer config: normalizer must be one of softmax, sparsemax"):
        TransformerConfig(normalizer="sparse")


def test_softmax_default_is_the_same_program(rng):
    """``normalizer="softmax"`` traces exactly the program of the call without it (forward and gradient)."""
    q, k, v = _operands(rng)
    mask = _mask(rng)

    def jaxpr(f, *args):
        return str(jax.make_jaxpr(f)(*args))

    for options in ({}, {"return_weights": True}, {"causal": True}):
        plain = functools.partial(dot_product_attention, **options)
        named = functools.partial(dot_product_attention, normalizer="softmax", **options)
        assert jaxpr(plain, q, k, v, mask) == jaxpr(named, q, k, v, mask)
    assert jaxpr(jax.grad(lambda q: dot_product_attention(q, k, v, mask).sum()), q) == jaxpr(
        jax.grad(lambda q: dot_product_attention(q, k, v, mask, normalizer="softmax").sum()), q
    )
    grouped = functools.partial(dot_product_attention, num_kv_heads=1)
    assert jaxpr(grouped, q, k[:, :1], v[:, :1]) == jaxpr(
        functools.partial(grouped, normalizer="softmax"), q, k[:, :1], v[:, :1]
    )
    params = init_multi_head_params(jax.random.key(0), H, 6)
    x = jnp.asarray(rng.normal(size=(B, T, 6)), jnp.float32)
    assert jaxpr(lambda x: multi_head_attention(params, x), x) == jaxpr(
        lambda x: multi_head_attention(params, x, normalizer="softmax"), x
    )


# --- multi-head attention and the NNX modules --------------------------------------------------------------------

DQ, DKV = 6, 5  # query and key/value input widths; qkv_features = H·K = 8


@functools.cache
def _mha(name):
    return jax.jit(
        lambda p, xq, xkv, m: multi_head_attention(p, xq, xkv, m, return_weights=True, normalizer=name)
    )


def _mha_params(rng):
    params = init_multi_head_params(jax.random.key(1), H, DQ, key_features=DKV, qkv_features=H * K)
    params = jax.tree.map(
        lambda x: jnp.asarray(2.0 * rng.normal(size=x.shape) / np.sqrt(4), jnp.float32), params
    )
    return params


@pytest.mark.numerics
@pytest.mark.parametrize("name", SPARSE)
def test_multi_head_attention_matches_float64_reference(name, rng):
    params = _mha_params(rng)
    xq = rng.normal(size=(B, T, DQ)).astype(np.float32)
    xkv = rng.normal(size=(B, S, DKV)).astype(np.float32)
    lengths = np.array([7, 4, 1])
    mask = np.broadcast_to(np.arange(S) < lengths[:, None, None], (B, T, S))
    out, w = _mha(name)(params, xq, xkv, mask)
    p = f64(jax.tree.map(np.asarray, params))
    for b in range(B):
        out_ref, w_ref = mha_ref(
            p,
            xq[b].astype(np.float64),
            xkv[b].astype(np.float64),
            lambda i, j, b=b: j < lengths[b],
            normalizer=name,
        )
        assert rel_err(out[b], out_ref) < 1e-5 and rel_err(w[b], w_ref) < 1e-5
    assert np.any(np.asarray(w)[0] == 0.0)  # real keys with exactly zero weight in the full sentence
    assert np.all(np.asarray(w)[1][..., 4:] == 0.0)  # padded keys
    # the NNX module passes its normalizer through: the same numbers as the function
    module = attn_nn.MultiHeadAttention(
        H, DQ, kv_features=DKV, qkv_features=H * K, normalizer=name, rngs=nnx.Rngs(0)
    )
    nnx.update(module, nnx.State({"params": jax.tree.map(nnx.Param, params)}))
    got_out, got_w = module(xq, xkv, mask, return_weights=True)
    assert_close_f32(got_out, out, reduction=DQ + REDUCTION + H * K)
    np.testing.assert_array_equal(np.asarray(got_w) == 0, np.asarray(w) == 0)
    dpa = attn_nn.DotProductAttention(normalizer=name)
    q, k, v = _operands(rng)
    assert_close_f32(dpa(q, k, v), dot_product_attention(q, k, v, normalizer=name), reduction=REDUCTION)


# --- the Transformer through model.normalizer ---------------------------------------------------------------------

TB, TS, TT, TV = 3, 6, 4, 11
T_SIZES = dict(d_model=8, heads=2, d_ff=7, encoder_layers=1, decoder_layers=2, max_length=6, dropout=0.1)
# Longest float32 chain (as tests/test_transformer.py counts it): an attention sub-layer projects over D, takes logits
# over K, normalises and mixes over S, projects back over D; a layer adds the FFN (D, d_ff) and two norms (2·D each);
# a decoder layer adds cross-attention and a third norm; the output projects over D.
_TD, _TK = T_SIZES["d_model"], T_SIZES["d_model"] // T_SIZES["heads"]
_T_ATTENTION = _TD + _TK + 2 * TS + _TD
_T_LAYER = _T_ATTENTION + _TD + T_SIZES["d_ff"] + 2 * 2 * _TD
T_REDUCTION = _T_LAYER + T_SIZES["decoder_layers"] * (_T_LAYER + _T_ATTENTION + 2 * _TD) + _TD


def _transformer(name, seed=0, spread=1.2):
    """A small Transformer with N(0, spread²) parameters (large enough for sparse weights) and a padded batch."""
    cfg = TransformerConfig(src_vocab=TV, tgt_vocab=TV, normalizer=name, norm="pre", **T_SIZES)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)
    pure = jax.tree.map(
        lambda s: jnp.asarray(spread * rng.normal(size=s.shape), jnp.float32), nnx.to_pure_dict(state)
    )
    nnx.replace_by_pure_dict(state, pure)
    lengths = np.array([6, 3, 1])
    src_mask = np.arange(TS) < lengths[:, None]
    src = np.where(src_mask, rng.integers(3, TV, (TB, TS)), 0).astype(np.int32)
    tgt_in = rng.integers(3, TV, (TB, TT)).astype(np.int32)
    tgt_in[:, 0] = 1
    return (
        nnx.merge(graphdef, state),
        cfg,
        pure,
        (jnp.asarray(src), jnp.asarray(src_mask), jnp.asarray(tgt_in)),
    )


@pytest.mark.parametrize("name", SPARSE)
def test_transformer_matches_float64_reference_and_cached_decoding(name):
    model, cfg, pure, (src, src_mask, tgt_in) = _transformer(name)
    inter = nnx.jit(lambda m, *a: m.intermediates(*a))(model, src, src_mask, tgt_in)
    ref = transformer_ref(
        pure,
        src,
        src_mask,
        tgt_in,
        norm="pre",
        positions="sinusoidal",
        share_embeddings="decoder",
        normalizer=name,
    )
    assert rel_err(inter.logits, ref["logits"]) < 1e-5
    assert rel_err(inter.cross_attention, ref["cross"]) < 1e-5
    cross = np.asarray(inter.cross_attention)  # [B, L_dec, H, T, S]
    real = np.broadcast_to(np.asarray(src_mask)[:, None, None, None, :], cross.shape)
    assert np.all(cross[~real] == 0.0)  # padded source words: exactly 0
    assert np.any(cross[real] == 0.0)  # real source words ignored outright
    # The trainer's diagnostics read the returned attention, the last layer's mean over heads: its exact zeros are
    # the real cells every head of that layer ignores, and attn_zero_share counts exactly those.
    from attn_jax.train import attention_stats, summarize_attention

    _, returned = nnx.jit(lambda m, *a: m(*a))(model, src, src_mask, tgt_in)
    ignored = np.all(cross[:, -1] == 0.0, axis=1) & real[:, -1, 0]  # [B, T, S]
    np.testing.assert_array_equal(np.asarray(returned) == 0.0, ignored | ~real[:, -1, 0])
    tgt_mask = jnp.ones(tgt_in.shape, bool)
    share = summarize_attention(attention_stats(returned, src_mask, tgt_mask))["attn_zero_share"]
    assert share == pytest.approx(ignored.sum() / real[:, -1, 0].sum()) and share > 0, share
    # one position at a time from the key/value cache == teacher forcing
    enc = model.encode(src, src_mask)
    state = model.init_decoder_state(enc)
    step = nnx.jit(lambda m, e, s, t: m.decode_step(e, s, t))
    for t in range(TT):
        logits, state, _ = step(model, enc, state, tgt_in[:, t])
        assert_close_f32(logits, inter.logits[:, t], reduction=T_REDUCTION)


def test_model_normalizer_config_key_reaches_the_transformer_and_it_trains():
    from attn_jax.train import ConfigError, apply_overrides, default_config, model_config

    sizes = [f"model.{k}={v}" for k, v in T_SIZES.items()]
    config = apply_overrides(default_config("transformer"), ["model.normalizer=entmax15", *sizes])
    cfg = model_config(config, src_vocab=TV, tgt_vocab=TV)
    assert isinstance(cfg, TransformerConfig) and cfg.normalizer == "entmax15"
    assert model_config(default_config("transformer"), TV, TV).normalizer == "softmax"  # the paper's default
    with pytest.raises(
        ConfigError, match="normalizer must be one of softmax, sparsemax, entmax15; got 'bogus'"
    ):
        model_config(apply_overrides(default_config("transformer"), ["model.normalizer=bogus"]), TV, TV)

    # smaller parameters than above: rows with one key (weight 1) have a zero Jacobian, and N(0, 1.2²) makes most
    model, _, _, (src, src_mask, tgt_in) = _transformer("entmax15", seed=1, spread=0.4)
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(params):
        logits, _ = nnx.merge(graphdef, params)(src, src_mask, tgt_in, dropout_rng=jax.random.key(0))
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 3])

    grads = jax.jit(jax.grad(loss))(params)
    leaves = jax.tree.leaves(grads)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
    for stack, sub in (
        ("encoder", "attention"),
        ("decoder", "self_attention"),
        ("decoder", "cross_attention"),
    ):
        kernel = np.asarray(grads[stack][sub]["query"]["kernel"])  # every attention learns through entmax
        assert np.any(kernel != 0.0), (stack, sub)
