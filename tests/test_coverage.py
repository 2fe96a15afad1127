"""Coverage (Tu et al. 2016; See, Liu & Manning 2017): the scorer term ``w_c c_ij``, RNNsearch's ``model.coverage``
(teacher forcing, single steps, beam search) and the coverage loss ``Σ_j min(α_tj, c_tj)`` with ``lambda_coverage``,
against float64 loop references (tests/reference/scorers.py, rnn.py, coverage.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_jax.attention import additive_attention, additive_attention_step, init_additive_params, project_keys
from attn_jax.attention._softmax import assert_valid_attention_weights
from attn_jax.decoding import beam_search
from attn_jax.models import RNNConfig, build_model
from attn_jax.nn.attention import AdditiveAttention
from attn_jax.train import (
    ConfigError,
    OptimizerConfig,
    StepConfig,
    TrainState,
    apply_overrides,
    check_config,
    coverage_loss,
    default_config,
    eval_step,
    evaluate,
    loss_sums,
    make_optimizer,
    model_config,
    train_step,
)
from tests.reference.coverage import coverage_loss_grad_ref, coverage_loss_ref
from tests.reference.rnn import rnnsearch_ref
from tests.reference.scorers import additive_ref, rel_err
from tests.test_models_rnn import (
    KY,
    LENGTHS,
    MODEL_REDUCTION,
    Compiled,
    make_batch,
    make_model,
    pure_params,
    rnn_reduction,
)
from tests.tolerance import assert_close_f32

# Odd, distinct sizes: a swapped axis changes a shape or a sum and fails.
B, T, S, DQ, DK, DV, A = 3, 5, 7, 11, 13, 9, 15
SRC_LENGTHS = np.array([7, 4, 0])  # full, padded, and a sentence with no valid key
REDUCTION = DK + 2 * A + 2 * S


def _params(key, **kw):
    """Random scorer params with coverage; b and w_c scaled so that their terms move the energies."""
    p = init_additive_params(key, DQ, DK, A, coverage=True, **kw)
    ks = jax.random.split(jax.random.fold_in(key, 1), 2)
    p["b"] = 0.5 * jax.random.normal(ks[0], (A,))
    p["w_c"] = 0.8 * jax.random.normal(ks[1], (A,))
    return p


def _case(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, T, DQ)).astype(np.float32)
    k = rng.normal(size=(B, S, DK)).astype(np.float32)
    v = rng.normal(size=(B, S, DV)).astype(np.float32)
    cov = rng.uniform(0.0, 2.0, size=(B, T, S)).astype(np.float32)  # accumulated weights lie in [0, T]
    mask = np.broadcast_to((np.arange(S) < SRC_LENGTHS[:, None])[:, None, :], (B, T, S))
    return q, k, v, cov, mask


_attn = jax.jit(
    lambda p, q, k, v, m, c, fused: additive_attention(
        p, q, k, v, m, return_weights=True, coverage=c, fused=fused
    ),
    static_argnames="fused",
)


# ------------------------------------------------------------------------------------------------ the scorer


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
@pytest.mark.parametrize("normalize", [False, True], ids=["plain_v", "normed_v"])
def test_coverage_attention_matches_float64_reference(fused, normalize):
    p = _params(jax.random.key(0), normalize=normalize)
    q, k, v, cov, mask = _case()
    ctx, w = _attn(p, q, k, v, mask, cov, fused)
    ref_ctx, ref_w = additive_ref(p, q, k, v, mask, coverage=cov)
    assert rel_err(w, ref_w) < 1e-5 and rel_err(ctx, ref_ctx) < 1e-5
    # The coverage term matters here: without it the weights differ well beyond rounding.
    _, ref_w_plain = additive_ref({n: x for n, x in p.items() if n != "w_c"}, q, k, v, mask)
    assert rel_err(ref_w_plain, ref_w) > 1e-2
    # Padded keys exactly 0, the sentence with no key gives zero weights and a zero context, never NaN.
    assert_valid_attention_weights(w, mask)
    np.testing.assert_array_equal(np.asarray(w)[1, :, 4:], 0.0)
    np.testing.assert_array_equal(np.asarray(w)[2], 0.0)
    np.testing.assert_array_equal(np.asarray(ctx)[2], 0.0)


def test_coverage_at_padding_changes_nothing():
    p = _params(jax.random.key(1))
    q, k, v, cov, mask = _case(1)
    poisoned = np.where(mask, cov, np.nan).astype(np.float32)
    for fused in (True, False):
        ctx, w = _attn(p, q, k, v, mask, cov, fused)
        ctx2, w2 = _attn(p, q, k, v, mask, poisoned, fused)
        np.testing.assert_array_equal(np.asarray(ctx2), np.asarray(ctx))  # same program, same bits
        np.testing.assert_array_equal(np.asarray(w2), np.asarray(w))

        def loss(p, c, fused=fused):
            out, wts = additive_attention(p, q, k, v, mask, return_weights=True, coverage=c, fused=fused)
            return jnp.sum(out * out) + jnp.sum(wts * wts)

        g_p, g_c = jax.jit(jax.grad(loss, argnums=(0, 1)))(p, poisoned)
        assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(g_p))
        assert bool(jnp.all(jnp.isfinite(g_c))) and not np.any(np.asarray(g_c)[~mask])


def _ref_objective(p64, q, k, v, mask, cov, r_ctx, r_w):
    """float64 ``Σ r_ctx · context + Σ r_w · weights`` of the loop reference."""
    ctx, w = additive_ref(p64, q, k, v, mask, coverage=cov)
    return float(np.sum(r_ctx * ctx) + np.sum(r_w * w))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
def test_coverage_gradients_match_float64_finite_differences(fused):
    p = _params(jax.random.key(2))
    q, k, v, cov, mask = _case(2)
    rng = np.random.default_rng(3)
    r_ctx, r_w = rng.normal(size=(B, T, DV)), rng.normal(size=(B, T, S))

    def objective(p, q, c):
        ctx, w = additive_attention(p, q, k, v, mask, return_weights=True, coverage=c, fused=fused)
        return jnp.sum(r_ctx * ctx) + jnp.sum(r_w * w)

    g_p, g_q, g_c = jax.jit(jax.grad(objective, argnums=(0, 1, 2)))(p, q, cov)
    p64 = {n: np.asarray(x, np.float64) for n, x in p.items()}
    q64, c64 = np.asarray(q, np.float64), np.asarray(cov, np.float64)
    h = 1e-5

    def central(dp, dq, dc):
        plus = {n: p64[n] + h * dp.get(n, 0.0) for n in p64}
        minus = {n: p64[n] - h * dp.get(n, 0.0) for n in p64}
        f = lambda pp, qq, cc: _ref_objective(pp, qq, k, v, mask, cc, r_ctx, r_w)
        return (f(plus, q64 + h * dq, c64 + h * dc) - f(minus, q64 - h * dq, c64 - h * dc)) / (2 * h)

    # w_c entry by entry (the new parameter), then random directions through every input and parameter at once.
    fd_wc = [central({"w_c": np.eye(A)[a]}, np.zeros_like(q64), np.zeros_like(c64)) for a in range(A)]
    assert rel_err(g_p["w_c"], fd_wc) < 1e-4
    for seed in range(3):
        d = np.random.default_rng(10 + seed)
        dp = {n: d.normal(size=np.shape(x)) for n, x in p64.items()}
        dq, dc = d.normal(size=q64.shape), d.normal(size=c64.shape)
        analytic = sum(float(np.sum(np.asarray(g_p[n], np.float64) * dp[n])) for n in p64)
        analytic += float(np.sum(np.asarray(g_q, np.float64) * dq) + np.sum(np.asarray(g_c, np.float64) * dc))
        fd = central(dp, dq, dc)
        # float32 gradients against a float64 central difference (truncation error ~h² ≈ 1e-10)
        assert abs(analytic - fd) <= 1e-4 * max(1.0, abs(fd)), (analytic, fd)


@pytest.mark.numerics
def test_fused_and_plain_coverage_scorers_agree_and_step_equals_all_queries():
    p = _params(jax.random.key(4))
    q, k, v, cov, mask = _case(4)
    fused = _attn(p, q, k, v, mask, cov, True)
    plain = _attn(p, q, k, v, mask, cov, False)
    assert_close_f32(fused, plain, reduction=REDUCTION)
    pk = project_keys(p, k)
    for t in range(T):  # one query at a time, as a decoder step: a second program
        ctx, w = additive_attention_step(p, q[:, t], pk, v, mask[:, t], coverage=cov[:, t])
        assert_close_f32((ctx, w), (fused[0][:, t], fused[1][:, t]), reduction=REDUCTION)


def test_coverage_errors_are_one_line_value_errors():
    p = _params(jax.random.key(5))
    q, k, v, cov, mask = _case()
    plain = init_additive_params(jax.random.key(5), DQ, DK, A)
    cases = [
        (lambda: additive_attention(p, q, k, v, mask), "carry a coverage weight w_c but no coverage"),
        (lambda: additive_attention(plain, q, k, v, mask, coverage=cov), "no coverage weight w_c"),
        (lambda: additive_attention(p, q, k, v, mask, coverage=cov[:, :, :5]), r"coverage \[3, 5, 5\]"),
        (lambda: additive_attention(p, q, k, v, mask, coverage=cov.astype(np.int32)), "float array"),
        (lambda: init_additive_params(jax.random.key(0), 4, 4, 3, coverage=1), "coverage must be a bool"),
        (
            lambda: additive_attention({**p, "w_c": p["w_c"][:3]}, q, k, v, mask, coverage=cov),
            r"w_c .*\[15\]",
        ),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert "\n" not in str(info.value)


def test_init_keeps_the_other_parameters_and_scales_w_c():
    key = jax.random.key(6)
    for init in ("fan_in", "paper"):
        base = init_additive_params(key, DQ, DK, A, init=init)
        cov = init_additive_params(key, DQ, DK, A, init=init, coverage=True)
        assert set(cov) == set(base) | {"w_c"} and cov["w_c"].shape == (A,)
        for name in base:  # bit for bit: coverage draws from a key of its own
            np.testing.assert_array_equal(np.asarray(cov[name]), np.asarray(base[name]))
        spread = float(jnp.std(cov["w_c"]))
        assert (0.3 < spread < 3.0) if init == "fan_in" else (1e-4 < spread < 1e-2)
    module = AdditiveAttention(DQ, DK, A, coverage=True, rngs=nnx.Rngs(0))
    assert nnx.to_pure_dict(nnx.state(module, nnx.Param))["params"]["w_c"].shape == (A,)


# ----------------------------------------------------------------------------------------------- RNNsearch


@pytest.fixture(scope="module")
def coverage_model():
    """A random RNNsearch with coverage (N(0, 0.5²) parameters), compiled once, and its teacher-forced output."""
    compiled = Compiled(make_model(coverage=True))
    batch = make_batch()
    return compiled, batch, *compiled.forward(*batch)


def test_rnnsearch_with_coverage_matches_float64_reference(coverage_model):
    compiled, (src, mask, tgt_in), logits, attn = coverage_model
    params = pure_params(compiled.model)
    ref, ref_attn = rnnsearch_ref(params, src, mask, tgt_in, coverage=True)
    assert rel_err(attn, ref_attn) < 1e-5 and rel_err(logits, ref) < 1e-5
    plain, plain_attn = rnnsearch_ref(params, src, mask, tgt_in, coverage=False)
    assert rel_err(plain_attn, ref_attn) > 1e-3  # the reference without coverage is another model
    assert_valid_attention_weights(attn, mask[:, None, :])


def test_teacher_forcing_equals_step_by_step_decoding_with_coverage(coverage_model):
    compiled, batch, logits, attn = coverage_model
    enc, dec = compiled.start(batch[0], batch[1])
    np.testing.assert_array_equal(np.asarray(dec.coverage), 0.0)
    step_logits, step_attn = compiled.step_loop(*batch)
    assert_close_f32(step_logits, logits, reduction=MODEL_REDUCTION)
    assert_close_f32(step_attn, attn, reduction=MODEL_REDUCTION)
    for t in range(batch[2].shape[1]):  # the state's coverage is the sum of the steps' weights so far
        _, dec, w = compiled.step(enc, dec, batch[2][:, t])
    assert_close_f32(dec.coverage, jnp.sum(step_attn, axis=1), reduction=MODEL_REDUCTION)


def test_coverage_off_keeps_the_parameter_tree_and_state():
    cfg = dict(src_vocab=11, tgt_vocab=13, embed=4, hidden=6, maxout=3, align=5)
    off = nnx.eval_shape(lambda: build_model(RNNConfig(**cfg), rngs=nnx.Rngs(0)))
    on = nnx.eval_shape(lambda: build_model(RNNConfig(**cfg, coverage=True), rngs=nnx.Rngs(0)))
    off_paths = {
        p for p, _ in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(nnx.state(off, nnx.Param)))
    }
    on_paths = {p for p, _ in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(nnx.state(on, nnx.Param)))}
    assert {jax.tree_util.keystr(p) for p in on_paths - off_paths} == {"['attention']['params']['w_c']"}
    assert off_paths < on_paths
    compiled = Compiled(make_model())
    _, dec = compiled.start(*make_batch()[:2])
    assert dec.coverage is None


def test_beam_search_reorders_the_coverage_with_the_hypotheses(coverage_model):
    compiled, (src, mask, _), _, _ = coverage_model
    out = beam_search(
        compiled.model, src, mask, beam_size=3, num_return=3, max_length=9, max_length_ratio=None
    )
    tokens = np.asarray(out.tokens).reshape(-1, out.tokens.shape[-1])
    lengths = np.asarray(out.lengths).reshape(-1)
    assert np.all(np.isfinite(np.asarray(out.scores))) and lengths.max() >= 4
    # Teacher forcing on the returned hypotheses carries each its own coverage: beam search's attention and
    # log-probabilities equal it only if every reordering of the beams moved the coverage with its hypothesis.
    tgt_in = np.concatenate([np.ones((len(tokens), 1), np.int32), tokens[:, :-1]], axis=1)
    rep = lambda x: jnp.repeat(x, 3, axis=0)
    logits, attn = compiled.forward(rep(src), rep(mask), jnp.asarray(tgt_in))
    logp = jax.nn.log_softmax(logits, axis=-1)
    got_attn = np.asarray(out.attention).reshape(len(tokens), -1, src.shape[1])
    reduction = rnn_reduction(src.shape[1], 9)
    for i, n in enumerate(lengths):
        assert_close_f32(got_attn[i, :n], attn[i, :n], reduction=reduction)
        lp = float(np.sum(np.asarray(logp[i, np.arange(n), tokens[i, :n]], np.float64)))
        assert_close_f32(np.asarray(out.log_probs).reshape(-1)[i], lp, reduction=reduction)
    # Two hypotheses of one sentence sharing a prefix and then parting: one beam's state (coverage included) was
    # copied into two rows there, so the reordering was exercised.
    shared = [
        int(np.argmax(tokens[i] != tokens[j]))
        for b in range(len(src))
        for i in range(3 * b, 3 * b + 3)
        for j in range(i + 1, 3 * b + 3)
    ]
    assert max(shared) >= 1


# -------------------------------------------------------------------------------------------- coverage loss


def _loss_case(seed=0):
    rng = np.random.default_rng(seed)
    # No one-word source: its weights are all 1, and min(1, 1) at the second step is a tie (a kink: JAX splits the
    # gradient, the reference would have to pick a side).
    s_len, t_len = np.array([7, 4, 2]), np.array([5, 3, 2])
    src_mask = np.arange(S) < s_len[:, None]
    logits = rng.normal(size=(B, T, S)) * 2.0
    w = np.where(src_mask[:, None, :], np.exp(logits), 0.0)
    w = (w / w.sum(-1, keepdims=True)).astype(np.float32)
    return w, np.arange(T) < t_len[:, None]


def test_coverage_loss_and_gradient_match_float64_reference():
    w, tgt_mask = _loss_case()
    got = coverage_loss(w, tgt_mask)
    assert got.shape == (B,) and got.dtype == jnp.float32
    ref = coverage_loss_ref(w, tgt_mask)
    assert rel_err(got, ref) < 1e-5 and ref.min() >= 0 and ref[0] > 0.5
    d_out = np.array([1.0, -2.0, 0.5])
    grad = jax.grad(lambda x: jnp.sum(coverage_loss(x, tgt_mask) * d_out))(jnp.asarray(w))
    # Padded source positions (α = c = 0) are ties; their gradient reaches no logit through the masked softmax.
    src_real = np.asarray(w) > 0
    ref_grad = coverage_loss_grad_ref(w, tgt_mask, d_out)
    np.testing.assert_array_equal(np.asarray(grad)[src_real], ref_grad[src_real])  # counts: exact in float32
    assert np.abs(ref_grad).max() >= 2.0  # a weight counted at its own step and again at a later one


def test_coverage_loss_by_hand_and_padding():
    w = jnp.array([[[0.9, 0.1], [0.5, 0.5], [0.8, 0.2]]])
    # t=1: min(.5,.9)+min(.5,.1) = .6; t=2: min(.8,1.4)+min(.2,.6) = 1.0
    np.testing.assert_allclose(coverage_loss(w, jnp.ones((1, 3), bool)), [1.6], rtol=1e-6)
    np.testing.assert_allclose(coverage_loss(w, jnp.array([[True, True, False]])), [0.6], rtol=1e-6)
    poisoned = w.at[0, 2].set(jnp.nan)  # a padded target row holding NaN changes nothing, value or gradient
    mask = jnp.array([[True, True, False]])
    assert float(coverage_loss(poisoned, mask)[0]) == float(coverage_loss(w, mask)[0])
    g = jax.grad(lambda x: coverage_loss(x, mask).sum())(poisoned)
    assert bool(jnp.all(jnp.isfinite(g)))
    with pytest.raises(ValueError, match="tgt_mask must be bool"):
        coverage_loss(w, jnp.ones((1, 2), bool))
    with pytest.raises(ValueError, match="float weights"):
        coverage_loss(jnp.ones((3,)), jnp.ones((3,), bool))


def _tiny_params_and_batch(model, seed):
    """``(abstract model, N(0, 0.5²) float32 params, padded batch, src_mask, tgt_mask)`` drawn from ``seed``."""
    from attn_jax.data import Batch

    rng = np.random.default_rng(seed)
    abstract = nnx.eval_shape(lambda: build_model(model, rngs=nnx.Rngs(0)))
    shapes = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
    params = jax.tree.map(lambda s: rng.normal(0.0, 0.5, s.shape).astype(np.float32), shapes)
    src_len, tgt_len = np.array([7, 4, 1], np.int32), np.array([5, 3, 2], np.int32)
    src_mask, tgt_mask = np.arange(S) < src_len[:, None], np.arange(T) < tgt_len[:, None]
    batch = Batch(
        src=np.where(src_mask, rng.integers(3, 20, (B, S)), 0).astype(np.int32),
        src_len=src_len,
        tgt_in=np.where(tgt_mask, rng.integers(3, 24, (B, T)), 0).astype(np.int32),
        tgt_out=np.where(tgt_mask, rng.integers(3, 24, (B, T)), 0).astype(np.int32),
        tgt_len=tgt_len,
        example_id=np.arange(B, dtype=np.int32),
    )
    return abstract, params, batch, src_mask, tgt_mask


def test_train_objective_adds_lambda_times_the_coverage_loss():

    sizes = ["model.embed=5", "model.hidden=8", "model.maxout=6", "model.align=12", "model.coverage=true"]
    config = apply_overrides(default_config(), [*sizes, "lambda_coverage=0.7"])
    check_config(config)
    model = model_config(config, src_vocab=20, tgt_vocab=24)
    assert model.coverage
    abstract, params, batch, src_mask, tgt_mask = _tiny_params_and_batch(model, seed=0)
    optimizer = OptimizerConfig(name="adam", learning_rate=0.01)
    with_cov = eval_step(params, batch, StepConfig(model=model, optimizer=optimizer, lambda_coverage=0.7))
    without = eval_step(params, batch, StepConfig(model=model, optimizer=optimizer))
    assert without.coverage is None
    module = nnx.merge(nnx.split(abstract)[0], jax.tree.map(jnp.asarray, params))
    logits, attn = module(batch.src, src_mask, batch.tgt_in)
    expected_cov = coverage_loss_ref(np.asarray(attn), tgt_mask).sum()
    ce = loss_sums(logits, batch.tgt_out, tgt_mask)
    assert expected_cov > 0.1
    np.testing.assert_allclose(float(with_cov.coverage), expected_cov, rtol=1e-5)
    np.testing.assert_allclose(float(with_cov.loss.loss), float(ce.loss) + 0.7 * expected_cov, rtol=1e-5)
    np.testing.assert_allclose(float(without.loss.loss), float(ce.loss), rtol=1e-5)
    assert float(with_cov.loss.nll) == float(without.loss.nll)  # the NLL stays the plain NLL
    # Validation reports the unweighted coverage loss per token beside the loss that includes λ times it.
    cfg_with = StepConfig(model=model, optimizer=optimizer, lambda_coverage=0.7)
    record = evaluate(params, [batch], cfg_with)
    np.testing.assert_allclose(record["coverage_loss"], expected_cov / batch.tgt_len.sum(), rtol=1e-5)
    assert "coverage_loss" not in evaluate(params, [batch], StepConfig(model=model, optimizer=optimizer))


def test_coverage_start_step_adds_the_loss_from_that_update_on():
    """Before ``coverage_start_step`` updates an update is the λ = 0 update; from it on, the λ one (See et al. 2017
    add the coverage loss for a final phase). Different programs (a where on the step against a static weight):
    float32 rounding apart."""

    sizes = ["model.embed=5", "model.hidden=8", "model.maxout=6", "model.align=12", "model.coverage=true"]
    model = model_config(apply_overrides(default_config(), sizes), src_vocab=20, tgt_vocab=24)
    _, params, batch, _, _ = _tiny_params_and_batch(model, seed=1)
    optimizer = OptimizerConfig(name="adam", learning_rate=0.01)

    def update(step, **options):
        cfg = StepConfig(model=model, optimizer=optimizer, **options)
        state = TrainState(
            step=np.int32(step),
            params=jax.tree.map(jnp.asarray, params),
            opt_state=make_optimizer(optimizer).init(jax.tree.map(jnp.asarray, params)),
            rng=np.asarray(jax.random.key_data(jax.random.key(0))),
        )
        new, metrics = train_step(state, batch, cfg)
        return float(metrics.grad_norm), new.params

    late = dict(lambda_coverage=0.7, coverage_start_step=3)
    plain_norm, plain_params = update(2)
    full_norm, full_params = update(3, lambda_coverage=0.7)
    assert abs(full_norm - plain_norm) > 1e-3 * plain_norm  # the loss changes the update: the test can fail
    for step, (norm, new_params) in ((2, (plain_norm, plain_params)), (3, (full_norm, full_params))):
        late_norm, late_params = update(step, **late)
        assert_close_f32(late_norm, norm, reduction=64)
        assert_close_f32(late_params, new_params, reduction=64)


def test_config_errors_name_the_key():
    base = ["model.embed=5", "model.hidden=8", "model.maxout=6", "model.align=12"]
    cases = [
        (["lambda_coverage=0.5"], "lambda_coverage=0.5 needs model.coverage=True"),
        (["model.coverage=true", "lambda_coverage=-1.0"], "lambda_coverage must be a finite number >= 0"),
        (["model.coverage=true", "lambda_coverage=nan"], "lambda_coverage must be a finite number >= 0"),
        (["model.coverage=true", "model.scorer=dot"], "coverage feeds the additive scorer"),
        (["model.coverage=true", "model.arch=rnnenc"], "coverage feeds the additive scorer"),
        (["model.coverage=true", "coverage_start_step=5"], "coverage_start_step=5 needs lambda_coverage > 0"),
        (["model.coverage=true", "lambda_coverage=1.0", "coverage_start_step=-1"], "must be an int >= 0"),
        (
            ["model.coverage=true", "lambda_coverage=1.0", "num_train_steps=100", "coverage_start_step=100"],
            "coverage_start_step=100 is not below num_train_steps=100",
        ),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            check_config(apply_overrides(default_config(), base + overrides))
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="coverage must be a bool"):
        RNNConfig(coverage=1)
    check_config(
        apply_overrides(default_config(), base + ["model.coverage=true", "model.scorer=normed_additive"])
    )
    assert default_config().lambda_coverage == 0.0 and default_config().model.coverage is False
    assert len(LENGTHS) == B and KY > 0  # the shared helpers' batch is the one these tests assume
