"""Sparsemax and 1.5-entmax (attn_jax.attention._normalizers) against float64 references, and wired into attention.

References (tests/reference/normalizers.py): sparsemax by sort and threshold, 1.5-entmax by *bisection* (another
algorithm than the library's sort-based solve), Jacobians by float64 central differences of those references.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

from attn_jax.attention import (
    NORMALIZERS,
    entmax15,
    init_additive_params,
    init_general_params,
    masked_normalize,
    masked_softmax,
    sparsemax,
)
from attn_jax.attention._additive import additive_attention, additive_attention_step
from attn_jax.attention._local import local_attention
from attn_jax.attention._luong import general_scores, luong_attention
from attn_jax.attention._normalizers import attend_normalized
from attn_jax.attention._softmax import assert_valid_attention_weights, attend
from tests.reference.normalizers import (
    ROW_REFS,
    attention_ref,
    entmax15_row_ref,
    local_normalized_ref,
    normalize_ref,
    sparsemax_row_ref,
    vjp_ref,
)
from tests.reference.scorers import additive_energies_ref, general_scores_ref, rel_err
from tests.tolerance import assert_close_f32

B, T, S, DQ, DK, DV, A = 3, 5, 7, 11, 13, 9, 15
SPARSE = ("sparsemax", "entmax15")
FN = {"sparsemax": sparsemax, "entmax15": entmax15}
LENGTHS = np.array([7, 4, 0])  # full, padded, and a sentence with no valid key

_masked = jax.jit(masked_normalize, static_argnames=("axis", "normalizer"))


def _logits(rng, shape=(B, T, S), scale=2.0):
    return (scale * rng.normal(size=shape)).astype(np.float32)


def _length_mask(lengths=LENGTHS, s=S):
    return np.arange(s)[None, None, :] < np.asarray(lengths)[:, None, None]  # [B, 1, S]


def _random_mask(rng):
    mask = rng.random((B, T, S)) < 0.7
    mask[0, 1] = False  # one query with nothing to attend to
    mask[2] = False  # a sentence with no valid key at all
    return mask


# --- the functions against float64 references ----------------------------------------------------------------


@pytest.mark.parametrize("name", SPARSE)
def test_forward_matches_float64_reference(name, rng):
    x = _logits(rng)
    p = np.asarray(jax.jit(FN[name])(x))
    want = normalize_ref(x, None, name)
    assert rel_err(p, want) < 1e-5
    np.testing.assert_array_equal(p == 0, want == 0)  # the same support, entry by entry
    assert np.any(p == 0)


@pytest.mark.parametrize("name", SPARSE)
def test_vjp_matches_float64_finite_difference_jacobian(name, rng):
    x, g = _logits(rng), rng.normal(size=(B, T, S)).astype(np.float32)
    _, vjp = jax.vjp(FN[name], jnp.asarray(x))
    assert rel_err(vjp(jnp.asarray(g))[0], vjp_ref(ROW_REFS[name], x, g)) < 1e-5


@pytest.mark.parametrize("name", SPARSE)
def test_check_grads(name, rng):
    # Rows are permutations of an evenly spaced grid: every entry is >= 0.16 from the threshold, far beyond the
    # finite-difference step, so no difference quotient crosses a kink of the piecewise function.
    x = np.stack([rng.permutation(np.linspace(-2.0, 2.0, S)) for _ in range(4)]).astype(np.float32)
    x = x + (0.01 * rng.normal(size=x.shape)).astype(np.float32)
    # float32 differences (the normalisers compute in float32 by policy): eps=1e-3 gives ~1e-4 relative noise.
    check_grads(FN[name], (x,), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("name", SPARSE)
def test_weights_are_a_distribution_with_exact_zeros(name, rng):
    x = _logits(rng, scale=3.0)
    p = np.asarray(FN[name](x), np.float64)
    assert np.all(p >= 0.0)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-6)
    spread = FN[name](jnp.arange(S, dtype=jnp.float32) * 3.0)  # gaps of 3 > the support's width
    np.testing.assert_array_equal(np.asarray(spread), np.eye(S, dtype=np.float32)[-1])
    # shift invariance; x + 100 rounds the logits to float32's spacing there, 2^-17 ≈ 7.6e-6
    np.testing.assert_allclose(np.asarray(FN[name](x + 100.0)), p, atol=5e-5)


@pytest.mark.parametrize("gap", [-3.0, -1.0, -0.4, 0.0, 0.25, 0.9, 1.0, 2.5])
def test_sparsemax_of_two_scores_is_the_closed_form(gap):
    """sparsemax([a, b]) = [clip((1 + a − b)/2, 0, 1), 1 − that] (Martins & Astudillo 2016, §2.2)."""
    p = np.asarray(sparsemax(jnp.array([gap, 0.0])), np.float64)
    first = min(max((1.0 + gap) / 2.0, 0.0), 1.0)
    np.testing.assert_allclose(p, [first, 1.0 - first], atol=1e-7)


def test_entmax15_lies_between_softmax_and_sparsemax_in_sparsity(rng):
    """Row by row: softmax's support (all) ⊇ 1.5-entmax's ⊇ sparsemax's, and the latter two are strict somewhere."""
    x = (rng.normal(size=(400, S)) * rng.uniform(0.2, 4.0, size=(400, 1))).astype(np.float32)
    soft = np.asarray(jax.nn.softmax(x))
    ent, sp = np.asarray(entmax15(x)), np.asarray(sparsemax(x))
    assert np.all(soft > 0)
    assert not np.any((sp > 0) & (ent == 0))  # sparsemax's support inside entmax's
    assert np.sum(ent == 0) < np.sum(sp == 0)
    assert 0 < np.sum(ent == 0)


@pytest.mark.numerics
@pytest.mark.parametrize("name", SPARSE)
def test_axis_and_dtype(name, rng):
    x = _logits(rng)
    moved = np.asarray(FN[name](np.moveaxis(x, 1, -1)))
    # two float32 programs (the axis moved inside or outside): a sort, a cumulative sum over T, the threshold
    assert_close_f32(FN[name](x, axis=1), np.moveaxis(moved, -1, 1), reduction=T)
    low = jnp.asarray(x, jnp.bfloat16)
    out = FN[name](low)
    assert out.dtype == jnp.bfloat16
    # computed in float32 from the bf16 inputs; only the final rounding to bf16 (2^-8 relative) differs
    want = np.asarray(FN[name](low.astype(jnp.float32)))
    np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=2**-8, atol=2**-9)


def test_errors_name_what_is_accepted():
    with pytest.raises(ValueError, match="'softmax', 'sparsemax', 'entmax15'; got 'sparse'"):
        masked_normalize(jnp.zeros((2, 3)), normalizer="sparse")
    with pytest.raises(ValueError, match="floating-point"):
        sparsemax(jnp.arange(3))
    with pytest.raises(ValueError, match="at least one axis"):
        entmax15(jnp.float32(1.0))
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        sparsemax(jnp.zeros((2, 3)), axis=2)
    with pytest.raises(ValueError, match="mask"):
        masked_normalize(jnp.zeros((2, 3)), jnp.zeros((2, 3)), normalizer="sparsemax")  # a float mask
    assert NORMALIZERS == ("softmax", "sparsemax", "entmax15")


# --- masks ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SPARSE)
def test_masked_rows_match_reference_and_fully_masked_rows_are_zero(name, rng):
    x, mask = _logits(rng), _random_mask(rng)
    w = np.asarray(_masked(x, mask, normalizer=name))
    assert rel_err(w, normalize_ref(x, mask, name)) < 1e-5
    assert np.all(w[~mask] == 0.0)
    assert np.all(w[~mask.any(-1)] == 0.0)
    assert_valid_attention_weights(w, mask)


@pytest.mark.parametrize("name", SPARSE)
def test_masked_gradients_are_finite_exact_zero_where_masked_and_match_reference(name, rng):
    x, mask = _logits(rng), _random_mask(rng)
    g = rng.normal(size=(B, T, S)).astype(np.float32)
    _, vjp = jax.vjp(lambda z: masked_normalize(z, mask, normalizer=name), jnp.asarray(x))
    grad = np.asarray(vjp(jnp.asarray(g))[0])
    assert np.all(np.isfinite(grad))
    assert np.all(grad[~mask] == 0.0)
    assert rel_err(grad, vjp_ref(ROW_REFS[name], x, g, mask)) < 1e-5


@pytest.mark.parametrize("name", SPARSE)
def test_masked_content_never_changes_the_weights(name, rng):
    """NaN, ±inf or huge logits where the mask forbids: the same weights, bit for bit (the same program)."""
    x, mask = _logits(rng), _random_mask(rng)
    clean = np.asarray(_masked(x, mask, normalizer=name))
    for junk in (np.nan, np.inf, -np.inf, 3e38, -3e38):
        dirty = np.where(mask, x, np.float32(junk))
        np.testing.assert_array_equal(np.asarray(_masked(dirty, mask, normalizer=name)), clean)
    # a -inf logit is a masked entry (as exp(-inf) = 0 is for a softmax)
    minus_inf = np.where(mask, x, -np.inf).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(_masked(minus_inf, None, normalizer=name)), clean)
    # large logits keep the masked entries below the threshold
    big = np.asarray(_masked(x * 1e6, mask, normalizer=name))
    assert np.all(big[~mask] == 0.0) and np.all(np.abs(big.sum(-1) - mask.any(-1)) < 1e-5)


def test_softmax_is_masked_softmax_bit_for_bit(rng):
    """The default dispatches to the program it names: existing results do not move by a bit."""
    x, mask = _logits(rng), _random_mask(rng)
    values = rng.normal(size=(B, S, DV)).astype(np.float32)
    np.testing.assert_array_equal(
        np.asarray(_masked(x, mask, normalizer="softmax")), np.asarray(jax.jit(masked_softmax)(x, mask))
    )
    ours = jax.jit(lambda e, v, m: attend_normalized(e, v, m, normalizer="softmax"))(x, values, mask)
    theirs = jax.jit(attend)(x, values, mask)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# --- the attention paths with normalizer= ------------------------------------------------------------------


@functools.cache
def _additive(name):
    return jax.jit(
        lambda p, q, k, v, m: additive_attention(p, q, k, v, m, return_weights=True, normalizer=name)
    )


@pytest.mark.parametrize("name", SPARSE)
def test_additive_attention_matches_reference(name, key, rng):
    params = init_additive_params(key, DQ, DK, A)
    params["b"] = 0.5 * jax.random.normal(jax.random.fold_in(key, 1), (A,))
    params["v"] = 3.0 * params["v"]  # energies of a few units, so the sparse normalisers drop words
    q = rng.normal(size=(B, T, DQ)).astype(np.float32)
    k = rng.normal(size=(B, S, DK)).astype(np.float32)
    v = rng.normal(size=(B, S, DV)).astype(np.float32)
    mask = _length_mask()
    ctx, w = _additive(name)(params, q, k, v, mask)
    p = {n: np.asarray(x, np.float64) for n, x in params.items()}
    energies = additive_energies_ref(q, k, p["w_q"], p["w_k"], p["v"], p["b"])
    ctx_ref, w_ref = attention_ref(energies, v, mask, name)
    assert rel_err(w, w_ref) < 1e-5 and rel_err(ctx, ctx_ref) < 1e-5
    assert np.any(np.asarray(w)[mask.repeat(T, 1)] == 0.0)  # real words with exactly zero weight
    assert np.all(np.asarray(ctx)[2] == 0.0)  # the sentence with no valid key
    # one decoder step equals the all-at-once form's row
    from attn_jax.attention._additive import project_keys

    step_ctx, step_w = additive_attention_step(
        params, q[:, 2], project_keys(params, k), v, mask[:, 0], normalizer=name
    )
    assert rel_err(step_w, w_ref[:, 2]) < 1e-5 and rel_err(step_ctx, ctx_ref[:, 2]) < 1e-5

    def loss(p, q):
        c, w = additive_attention(p, q, k, v, mask, return_weights=True, normalizer=name)
        return jnp.sum(c**2) + jnp.sum(w * jnp.arange(S))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, q)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    assert np.all(np.asarray(grads[1])[2] == 0.0)  # no gradient into a sentence with no valid key


@pytest.mark.parametrize("name", SPARSE)
def test_luong_attention_matches_reference(name, key, rng):
    params = init_general_params(key, DQ, DK)
    q = rng.normal(size=(B, T, DQ)).astype(np.float32)
    k = rng.normal(size=(B, S, DK)).astype(np.float32)
    v = rng.normal(size=(B, S, DV)).astype(np.float32)
    mask = _length_mask()
    f = jax.jit(
        lambda w, q, k, v, m: luong_attention(
            general_scores({"w": w}, q, k), v, m, return_weights=True, normalizer=name
        )
    )
    ctx, w = f(params["w"], q, k, v, mask)
    ctx_ref, w_ref = attention_ref(
        general_scores_ref(q, k, np.asarray(params["w"], np.float64)), v, mask, name
    )
    assert rel_err(w, w_ref) < 1e-5 and rel_err(ctx, ctx_ref) < 1e-5
    assert np.any(np.asarray(w)[mask.repeat(T, 1)] == 0.0)


@pytest.mark.parametrize("name", SPARSE)
@pytest.mark.parametrize("gaussian", [False, True])
def test_local_attention_matches_reference(name, gaussian, rng):
    scores = _logits(rng, scale=3.0)
    values = rng.normal(size=(B, S, DV)).astype(np.float32)
    centers = np.array([[0.0, 1.4, 2.6, 4.5, 6.0]] * B, np.float32)
    mask = _length_mask()
    f = jax.jit(
        lambda e, v, c, m: local_attention(
            e, v, c, window=2, mask=m, gaussian=gaussian, return_weights=True, normalizer=name
        )
    )
    ctx, w = f(scores, values, centers, mask)
    ctx_ref, w_ref = local_normalized_ref(scores, values, centers, 2, mask, gaussian, name)
    assert rel_err(w, w_ref) < 1e-5 and rel_err(ctx, ctx_ref) < 1e-5


def test_unknown_normalizer_is_refused_everywhere(key, rng):
    params = init_additive_params(key, DQ, DK, A)
    q, k = jnp.zeros((T, DQ)), jnp.zeros((S, DK))
    accepted = "'softmax', 'sparsemax', 'entmax15'"
    with pytest.raises(ValueError, match=accepted):
        additive_attention(params, q, k, normalizer="entmax")
    with pytest.raises(ValueError, match=accepted):
        luong_attention(jnp.zeros((T, S)), jnp.zeros((S, DV)), normalizer="Softmax")
    with pytest.raises(ValueError, match=accepted):
        local_attention(
            jnp.zeros((T, S)), jnp.zeros((S, DV)), jnp.zeros(T), window=1, gaussian=False, normalizer=None
        )
    from attn_jax.nn.attention import AdditiveAttention, LuongAttention

    with pytest.raises(ValueError, match=accepted):
        AdditiveAttention(4, 6, 3, normalizer="sparse", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=accepted):
        LuongAttention(4, 6, normalizer="sparse", rngs=nnx.Rngs(0))


def test_nn_modules_pass_the_normalizer(rng):
    from attn_jax.nn.attention import AdditiveAttention, LuongAttention

    q = rng.normal(size=(B, T, 4)).astype(np.float32)
    k = 3.0 * rng.normal(size=(B, S, 6)).astype(np.float32)
    mask = _length_mask()
    add = AdditiveAttention(4, 6, 5, normalizer="sparsemax", rngs=nnx.Rngs(0))
    _, w = add(q, k, mask=mask, return_weights=True)
    assert_valid_attention_weights(w, mask)
    assert np.any(np.asarray(w)[mask.repeat(T, 1)] == 0.0)
    luong = LuongAttention(
        4, 6, score="general", local="m", window=2, normalizer="entmax15", rngs=nnx.Rngs(0)
    )
    _, w = luong(q, k, mask=mask, source_lengths=jnp.asarray(LENGTHS), return_weights=True)
    scores = luong.scores(jnp.asarray(q), jnp.asarray(k))
    centers = np.minimum(np.arange(T)[None, :], np.maximum(LENGTHS - 1, 0)[:, None]).astype(np.float64)
    _, w_ref = local_normalized_ref(scores, k, centers, 2, mask, False, "entmax15")
    assert rel_err(w, w_ref) < 1e-5


# --- RNNsearch through its config ----------------------------------------------------------------------------


def test_rnnsearch_takes_a_train_step_with_model_normalizer_sparsemax():
    from attn_jax.data import Batch
    from attn_jax.models import RNNConfig, build_model
    from attn_jax.train import (
        ConfigError,
        OptimizerConfig,
        StepConfig,
        TrainState,
        apply_overrides,
        default_config,
        eval_step,
        make_optimizer,
        model_config,
        summarize_attention,
        train_step,
    )

    sizes = ["model.embed=5", "model.hidden=8", "model.maxout=6", "model.align=12"]
    config = apply_overrides(default_config(), ["model.normalizer=sparsemax", *sizes])
    model = model_config(config, src_vocab=20, tgt_vocab=24)
    assert isinstance(model, RNNConfig) and model.normalizer == "sparsemax"
    assert model_config(default_config(), 20, 24).normalizer == "softmax"  # the default: the paper's softmax
    with pytest.raises(
        ConfigError, match="normalizer must be one of softmax, sparsemax, entmax15; got 'bogus'"
    ):
        model_config(apply_overrides(default_config(), ["model.normalizer=bogus"]), 20, 24)
    with pytest.raises(ValueError, match="RNNenc has none"):
        RNNConfig(arch="rnnenc", normalizer="entmax15")

    # N(0, 0.5²) parameters: energies spread over a few units, so sparsemax drops source words
    rng = np.random.default_rng(0)
    abstract = nnx.eval_shape(lambda: build_model(model, rngs=nnx.Rngs(0)))
    shapes = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
    params = jax.tree.map(lambda s: rng.normal(0.0, 0.5, s.shape).astype(np.float32), shapes)
    optimizer = OptimizerConfig(name="adam", learning_rate=0.01)
    step_config = StepConfig(model=model, optimizer=optimizer)
    b, s, t = 3, 7, 5
    src_len, tgt_len = np.array([7, 4, 1], np.int32), np.array([5, 3, 2], np.int32)
    src_mask, tgt_mask = np.arange(s) < src_len[:, None], np.arange(t) < tgt_len[:, None]
    batch = Batch(
        src=np.where(src_mask, rng.integers(3, 20, (b, s)), 0).astype(np.int32),
        src_len=src_len,
        tgt_in=np.where(tgt_mask, rng.integers(3, 24, (b, t)), 0).astype(np.int32),
        tgt_out=np.where(tgt_mask, rng.integers(3, 24, (b, t)), 0).astype(np.int32),
        tgt_len=tgt_len,
        example_id=np.arange(b, dtype=np.int32),
    )
    state = TrainState(
        step=np.int32(0),
        params=params,
        opt_state=make_optimizer(optimizer).init(params),
        rng=np.asarray(jax.random.key_data(jax.random.key(1))),
    )
    before = jax.tree.map(np.array, params)
    new, metrics = train_step(state, batch, step_config)
    assert np.isfinite(float(metrics.loss.loss)) and np.isfinite(float(metrics.grad_norm))
    attention_after = new.params["attention"]["params"]
    for name in ("w_q", "w_k", "v"):  # the attention learns through sparsemax's Jacobian
        assert not np.array_equal(np.asarray(attention_after[name]), before["attention"]["params"][name])
    summary = summarize_attention(eval_step(new.params, batch, step_config).attention)
    assert summary["attn_zero_share"] > 0.1  # real source words with exactly zero weight, reported


@pytest.mark.parametrize("scorer", ["general", "local-p"])
def test_rnnsearch_scorers_normalise_with_entmax15(scorer):
    from attn_jax.models import RNNConfig, build_model

    cfg = RNNConfig(
        src_vocab=11, tgt_vocab=13, embed=4, hidden=6, maxout=3, align=5, local_window=2, scorer=scorer,
        normalizer="entmax15",
    )  # fmt: skip
    abstract = nnx.eval_shape(lambda: build_model(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    rng = np.random.default_rng(1)
    state = jax.tree.map(lambda x: jnp.asarray(rng.normal(0.0, 1.0, x.shape), x.dtype), state)
    src_mask = np.arange(7) < np.array([7, 4, 2])[:, None]
    src = np.where(src_mask, rng.integers(0, 11, (3, 7)), 0).astype(np.int32)
    tgt = rng.integers(0, 13, (3, 4)).astype(np.int32)
    _, w = jax.jit(lambda st, *a: nnx.merge(graphdef, st)(*a))(state, src, src_mask, tgt)
    w = np.asarray(w)
    assert np.all(w[~np.broadcast_to(src_mask[:, None, :], w.shape)] == 0.0)
    assert np.any(w[np.broadcast_to(src_mask[:, None, :], w.shape)] == 0.0)
    if scorer == "general":
        assert_valid_attention_weights(w, src_mask[:, None, :])


# --- diagnostics ---------------------------------------------------------------------------------------------


def test_attention_diagnostics_report_the_share_of_exact_zeros(rng):
    from attn_jax.train import attention_stats, summarize_attention

    src_mask = np.arange(S)[None] < np.array([7, 4, 1])[:, None]
    tgt_mask = np.arange(T)[None] < np.array([5, 3, 2])[:, None]
    w = np.asarray(_masked(_logits(rng), src_mask[:, None, :], normalizer="sparsemax"))
    cells = zeros = 0
    for b in range(B):
        for j in range(T):
            for i in range(S):
                if tgt_mask[b, j] and src_mask[b, i]:
                    cells += 1
                    zeros += int(w[b, j, i] == 0.0)
    summary = summarize_attention(attention_stats(w, src_mask, tgt_mask))
    assert zeros > 0 and summary["attn_zero_share"] == pytest.approx(zeros / cells)
    soft = np.asarray(_masked(_logits(rng), src_mask[:, None, :], normalizer="softmax"))
    assert summarize_attention(attention_stats(soft, src_mask, tgt_mask))["attn_zero_share"] == 0.0


def test_references_agree_with_each_other_on_hand_cases():
    """The float64 references themselves: sparsemax's worked example and entmax's defining equation."""
    np.testing.assert_allclose(sparsemax_row_ref([1.0, 0.5, -1.0]), [0.75, 0.25, 0.0], atol=1e-15)
    p = entmax15_row_ref([1.0, 0.5, -1.0])
    a = (0.5 + np.sqrt(7.75)) / 4  # (0.5 − τ) with τ from (0.5 − τ)² + (0.25 − τ)² = 1
    np.testing.assert_allclose(p, [a**2, (a - 0.25) ** 2, 0.0], atol=1e-12)


@pytest.mark.parametrize("name", ["attn_jax.attention._normalizers", "attn_jax.train._diagnostics"])
def test_docstring_examples(name):
    import doctest
    import importlib

    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0, result
