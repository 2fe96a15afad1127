"""Gradient accumulation and the moving average of the weights, at the step level.

k = 3 micro-batches of B = 4 rows give the update of one batch holding their 12 rows (the same padded lengths
S = 7, T = 5): loss sums, gradient norm, new parameters and optimiser state, for RNNsearch and the Transformer
with dropout off. The accumulating step compiles to the memory of one micro-batch, and runs on a mesh (data
parallelism over 4 of the 8 fake CPU devices) with the results of one device. The moving average after n updates
equals a float64 NumPy recurrence over the parameters each update produced.

Parameters are drawn from N(0, 0.5²) with NumPy and the optimiser is Adam with ``eps=1``, as in
tests/test_sharded_step.py: its update ``lr·m̂/(√v̂+1)`` is a smooth function of the gradient, so the updated
parameters inherit the gradients' float32 agreement. Every program is compiled once (``lower().compile()``) and
the compiled objects are both run and measured.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from attn_jax.data import Batch
from attn_jax.models import RNNConfig, TransformerConfig, build_model
from attn_jax.parallel import make_mesh, rules_for
from attn_jax.train import (
    ConfigError,
    OptimizerConfig,
    StepConfig,
    TrainState,
    accumulate_grads,
    apply_grad_sums,
    check_config,
    default_config,
    make_optimizer,
    make_sharded_accumulation,
    shard_train_state,
    train_step,
    zero_grad_sums,
)
from tests.tolerance import assert_close_f32

K, B, S, T = 3, 4, 7, 5
EMA = 0.3  # small, so that both the warm-up (1+t)/(10+t) and the constant decay occur within 5 updates
OPTIMIZER = OptimizerConfig(name="adam", learning_rate=0.1, eps=1.0, clip_norm=1.0, ema_decay=EMA)
RNN = RNNConfig(src_vocab=20, tgt_vocab=24, embed=5, hidden=8, maxout=6, align=12)
TRANSFORMER = TransformerConfig(
    src_vocab=20, tgt_vocab=24, d_model=8, heads=2, d_ff=12, encoder_layers=1, decoder_layers=1, dropout=0.0
)

# Longest float32 summation chains (tests/tolerance.py), forward and backward, plus the loss over the big
# batch's K·B·T tokens and its V-way softmax. RNNsearch as in tests/test_sharded_step.py: S encoder GRU steps over
# m + n; T decoder steps (GRU over m + 3n, alignment over 2n + n', softmax and context over S, readout over
# m + 3n). Transformer: per layer Q/K/V and output projections over D, softmax and context over S or T, the FFN
# over D + d_ff, LayerNorm over D (three times in a decoder layer).
_M, _N = RNN.embed, RNN.hidden
_RNN_FORWARD = S * (_M + _N) + T * ((_M + 3 * _N) + (2 * _N + RNN.align) + 2 * S + (_M + 3 * _N))
_D = TRANSFORMER.d_model
_TR_FORWARD = 2 * (4 * _D + 2 * max(S, T) + _D + TRANSFORMER.d_ff + 3 * _D) + _D
REDUCTION = {
    "rnnsearch": 2 * _RNN_FORWARD + K * B * T + RNN.tgt_vocab,
    "transformer": 2 * _TR_FORWARD + K * B * T + TRANSFORMER.tgt_vocab,
}
MODELS = {"rnnsearch": RNN, "transformer": TRANSFORMER}


def _host(tree):
    return jax.tree.map(np.array, tree)


def _device(tree):
    return jax.tree.map(jnp.array, tree)  # fresh buffers: the steps donate the state


def _batch(rng, rows, model):
    src_len = rng.integers(1, S + 1, rows).astype(np.int32)
    tgt_len = rng.integers(1, T + 1, rows).astype(np.int32)
    src_len[0], tgt_len[0] = S, T  # every micro-batch is padded to the same S, T as the big batch
    src_mask, tgt_mask = np.arange(S) < src_len[:, None], np.arange(T) < tgt_len[:, None]

    def ids(mask, vocab):
        return np.where(mask, rng.integers(3, vocab, mask.shape), 0).astype(np.int32)

    return Batch(
        src=ids(src_mask, model.src_vocab),
        src_len=src_len,
        tgt_in=ids(tgt_mask, model.tgt_vocab),
        tgt_out=ids(tgt_mask, model.tgt_vocab),
        tgt_len=tgt_len,
        example_id=np.arange(rows, dtype=np.int32),
    )


def _concat(batches):
    return jax.tree.map(lambda *xs: np.concatenate(xs), *batches)


def _initial(model, seed):
    rng = np.random.default_rng(seed)
    abstract = nnx.eval_shape(lambda: build_model(model, rngs=nnx.Rngs(0)))
    shapes = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
    params = jax.tree.map(lambda s: rng.normal(0.0, 0.5, s.shape).astype(np.float32), shapes)
    state = TrainState(
        step=np.int32(0),
        params=params,
        opt_state=_host(make_optimizer(OPTIMIZER).init(params)),
        rng=np.asarray(jax.random.key_data(jax.random.key(1))),
        ema_params=jax.tree.map(np.copy, params),
    )
    return state, [_batch(rng, B, model) for _ in range(K)]


class Compiled:
    """One model's programs, each compiled once: the plain step on the big batch (and on one micro-batch, for
    the memory comparison) and the three accumulation programs on micro-batches."""

    def __init__(self, name):
        self.config = StepConfig(model=MODELS[name], optimizer=OPTIMIZER)
        self.state, self.micro = _initial(MODELS[name], seed=len(name))
        self.big = _concat(self.micro)
        state, sums = _device(self.state), zero_grad_sums(self.state.params)
        self.zero = zero_grad_sums.lower(self.state.params).compile()
        self.add = accumulate_grads.lower(sums, state, self.micro[0], self.config).compile()
        self.apply = apply_grad_sums.lower(state, sums, self.config).compile()
        self.train_big = train_step.lower(state, self.big, self.config).compile()

    def accumulated(self, state):
        sums = self.zero(state.params)
        for batch in self.micro:
            sums = self.add(sums, state, batch)
        return self.apply(state, sums)


_COMPILED: dict[str, Compiled] = {}


def _compiled(name: str) -> Compiled:
    if name not in _COMPILED:
        _COMPILED[name] = Compiled(name)
    return _COMPILED[name]


# The AVX2 ``numerics`` pass reruns RNNsearch's cases only: compiling the Transformer there doubles that pass' cost.
@pytest.fixture(
    scope="module",
    params=[pytest.param(m, marks=pytest.mark.numerics) if m == "rnnsearch" else m for m in sorted(MODELS)],
)
def compiled(request):
    yield request.param, _compiled(request.param)
    _COMPILED.pop(request.param, None)


@pytest.fixture
def rnn():
    """RNNsearch's programs: the same objects as ``compiled``'s while its rnnsearch instance lives."""
    return _compiled("rnnsearch")


@pytest.mark.slow  # shares a module fixture that compiles its programs (~10-30 s)
def test_k_micro_batches_give_the_update_of_one_batch_holding_them(compiled):
    name, c = compiled
    got_state, got = _host(c.accumulated(_device(c.state)))
    want_state, want = _host(c.train_big(_device(c.state), c.big))
    n = REDUCTION[name]
    # Exact counts: the tokens and sentences of all micro-batches together.
    assert got.loss.tokens == want.loss.tokens == sum(int(b.tgt_len.sum()) for b in c.micro)
    assert got.loss.sentences == want.loss.sentences == K * B
    assert_close_f32(got.loss, want.loss, reduction=n, err_msg=f"{name} loss sums")
    assert_close_f32(got.grad_norm, want.grad_norm, reduction=n, err_msg=f"{name} gradient norm")
    assert got.learning_rate == want.learning_rate and int(got_state.step) == int(want_state.step) == 1
    assert_close_f32(got_state.params, want_state.params, reduction=n, err_msg=f"{name} parameters")
    # Adam's moments: each judged against the largest moment of its kind, not of its leaf. Some gradients are
    # zero up to rounding (a key bias shifts every logit of a softmax alike), so their leaf holds only noise.
    for kind in ("mu", "nu"):
        got_m, want_m = (optax.tree_utils.tree_get(s.opt_state, kind) for s in (got_state, want_state))
        scale = max(float(np.max(np.abs(x))) for x in jax.tree.leaves(want_m))
        assert_close_f32(got_m, want_m, reduction=n, scale=scale, err_msg=f"{name} Adam {kind}")
    assert_close_f32(got_state.ema_params, want_state.ema_params, reduction=n, err_msg=f"{name} EMA")
    # Not the mean of per-micro-batch means: that objective weights a micro-batch's tokens by 1/its tokens.
    tokens = [int(b.tgt_len.sum()) for b in c.micro]
    assert len(set(tokens)) > 1, "micro-batches with equal token counts cannot tell the two objectives apart"


@pytest.mark.slow  # shares a module fixture that compiles its programs (~10-30 s)
def test_accumulating_step_compiles_to_one_micro_batch_of_memory(rnn):
    """The temporary buffers of the accumulating program at micro-batch B are those of the plain step at B (its
    activations), not at K·B; the update itself needs parameter-sized buffers only."""
    c = rnn
    plain_micro = train_step.lower(_device(c.state), c.micro[0], c.config).compile()
    temp = {
        "accumulate at B": c.add.memory_analysis().temp_size_in_bytes,
        "apply": c.apply.memory_analysis().temp_size_in_bytes,
        "plain at B": plain_micro.memory_analysis().temp_size_in_bytes,
        "plain at K·B": c.train_big.memory_analysis().temp_size_in_bytes,
    }
    assert temp["accumulate at B"] <= 1.05 * temp["plain at B"], temp
    assert temp["plain at K·B"] >= 2 * temp["accumulate at B"], temp
    assert temp["apply"] < temp["accumulate at B"] / 2, temp


@pytest.mark.slow  # shares a module fixture that compiles its programs (~10-30 s)
@pytest.mark.numerics
def test_sharded_accumulation_matches_one_device(rnn):
    """Data parallelism over 4 devices (each micro-batch's 4 rows split 1 a device) gives the one-device
    accumulated update."""
    name, c = "rnnsearch", rnn
    mesh = make_mesh(data=4, devices=jax.devices()[:4])
    rules = rules_for("data")
    zero, add, apply = make_sharded_accumulation(c.config, mesh, rules)
    state = shard_train_state(_device(c.state), c.config, mesh, rules)
    sums = zero(state.params)
    for batch in c.micro:
        sums = add(sums, state, batch)
    got_state, got = _host(apply(state, sums))
    want_state, want = _host(c.accumulated(_device(c.state)))
    n = REDUCTION[name]
    assert_close_f32(got.loss, want.loss, reduction=n, err_msg="sharded loss sums")
    assert_close_f32(got_state.params, want_state.params, reduction=n, err_msg="sharded parameters")
    assert_close_f32(got_state.ema_params, want_state.ema_params, reduction=n, err_msg="sharded EMA")


@pytest.mark.slow  # shares a module fixture that compiles its programs (~10-30 s)
def test_moving_average_equals_a_float64_recurrence(compiled):
    """Five updates; ``ema_t = β_t·ema_{t-1} + (1-β_t)·θ_t``, ``β_t = min(β, (1+t)/(10+t))``, ``ema_0 = θ_0``,
    recomputed in float64 from the parameters each update produced."""
    name, c = compiled
    state = _device(c.state)
    thetas = [c.state.params]
    batches = [c.big, _concat(c.micro[::-1])]  # two different batches of the compiled shape
    for t in range(5):
        state, _ = c.train_big(state, batches[t % 2])
        thetas.append(_host(state.params))
    ema = jax.tree.map(lambda p: p.astype(np.float64), thetas[0])
    for t in range(1, 6):
        beta = min(EMA, (1 + t) / (10 + t))
        ema = jax.tree.map(lambda e, p, b=beta: b * e + (1 - b) * p.astype(np.float64), ema, thetas[t])
    got = _host(state.ema_params)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(ema), strict=True):
        # float32 against float64: each of the 5 updates rounds once (a few ulps); 1e-5 relative to the leaf
        scale = float(np.max(np.abs(w)))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{name} {path}")
    assert not all(
        np.allclose(g, p) for g, p in zip(jax.tree.leaves(got), jax.tree.leaves(thetas[-1]), strict=True)
    )


def test_config_refuses_bad_accumulate_and_ema_decay():
    for key, value, message in (
        ("accumulate", 0, "optimizer.accumulate must be an int >= 1"),
        ("ema_decay", 1.0, r"optimizer.ema_decay must be in \[0, 1\)"),
        ("ema_decay", -0.1, r"optimizer.ema_decay must be in \[0, 1\)"),
    ):
        config = default_config()
        config.optimizer[key] = value
        with pytest.raises(ConfigError, match=message):
            check_config(config)
    config = default_config()
    config.optimizer.accumulate = 2
    config.lambda_align = 0.5
    with pytest.raises(ConfigError, match="optimizer.accumulate=2 cannot be used with lambda_align"):
        check_config(config)
