"""The sharded train step (attn_jax.train._sharded) equals the single-device step, on 8 fake CPU devices.

RNNsearch at tiny sizes (K_x=20, K_y=24, m=5, n=8, l=6, n'=12; B=8, S=7, T=6) so that the vocabularies, hidden
and alignment widths split evenly over model=2 and 4 while l=6 does not split over 4 (the replicate-and-fall-back
rule is exercised). Parameters are drawn from N(0, 0.5²) with NumPy (the paper's N(0, 0.01²) gives gradients
~1e-10 where any comparison passes) and the optimiser is Adam with ``eps=1``: its first update
``lr·ĝ/(|ĝ|+1)`` is a smooth function of the gradient, so updated parameters inherit the gradients' agreement
(with the usual tiny ``eps`` the update is ~``lr·sign(g)``, which amplifies roundoff at ``g ≈ 0``), and its
first moment ``μ = (1-β₁)·clip(g)`` exposes the (clipped) gradient itself.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from attn_jax.data import Batch
from attn_jax.models import RNNConfig, build_model
from attn_jax.parallel import make_mesh, rules_for
from attn_jax.train import OptimizerConfig, StepConfig, TrainState, make_optimizer, train_step
from attn_jax.train._checkpoint import CheckpointManager
from attn_jax.train._sharded import (
    abstract_sharded_state,
    make_sharded_train_step,
    shard_train_state,
    train_state_shardings,
)
from tests.tolerance import assert_close_f32

MODEL = RNNConfig(src_vocab=20, tgt_vocab=24, embed=5, hidden=8, maxout=6, align=12)
OPTIMIZER = OptimizerConfig(name="adam", learning_rate=0.1, eps=1.0, clip_norm=1.0)
CONFIG = StepConfig(model=MODEL, optimizer=OPTIMIZER)
B, S, T = 8, 7, 6

# Loss, gradients and parameters agree with the single-device step up to float32 rounding: the sharded program
# sums per-shard partial sums (psum over data; split matmuls under tensor parallelism). Two float32 programs, so
# tests.tolerance.assert_close_f32 over the step's longest summation chain: the forward (S encoder GRU steps over
# m + n; T decoder steps: the GRU over m + 3n, the alignment over 2n + n', softmax and context over S, the readout
# over m + 3n), the backward through it again, the loss's sums over the B·T tokens and the K_y-way softmax. Each
# leaf is judged against its own largest entry (a gradient entry that is a sum of cancelling terms too).
_M, _N = MODEL.embed, MODEL.hidden
_FORWARD = S * (_M + _N) + T * ((_M + 3 * _N) + (2 * _N + MODEL.align) + 2 * S + (_M + 3 * _N))
STEP_REDUCTION = 2 * _FORWARD + B * T + MODEL.tgt_vocab


def _host(tree):
    return jax.tree.map(np.array, tree)


def initial_state_and_batch(model, optimizer: OptimizerConfig = OPTIMIZER):
    """``(initial train state of ``model`` as host NumPy arrays, a batch [B, S] -> [B, T] of ragged lengths)``."""
    rng = np.random.default_rng(0)
    abstract = nnx.eval_shape(lambda: build_model(model, rngs=nnx.Rngs(0)))
    shapes = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
    params = jax.tree.map(lambda s: rng.normal(0.0, 0.5, s.shape).astype(np.float32), shapes)
    state = TrainState(
        step=np.int32(0),
        params=params,
        opt_state=_host(make_optimizer(optimizer).init(params)),
        rng=np.asarray(jax.random.key_data(jax.random.key(1))),
    )
    src_len = np.array([7, 3, 5, 1, 6, 7, 2, 4], np.int32)
    tgt_len = np.array([6, 2, 4, 1, 6, 3, 5, 6], np.int32)
    src_mask = np.arange(S) < src_len[:, None]
    tgt_mask = np.arange(T) < tgt_len[:, None]
    batch = Batch(
        src=np.where(src_mask, rng.integers(3, model.src_vocab, (B, S)), 0).astype(np.int32),
        src_len=src_len,
        tgt_in=np.where(tgt_mask, rng.integers(3, model.tgt_vocab, (B, T)), 0).astype(np.int32),
        tgt_out=np.where(tgt_mask, rng.integers(3, model.tgt_vocab, (B, T)), 0).astype(np.int32),
        tgt_len=tgt_len,
        example_id=np.arange(B, dtype=np.int32),
    )
    return state, batch


@pytest.fixture(scope="module")
def initial():
    """``(initial train state as host NumPy arrays, batch)``."""
    return initial_state_and_batch(MODEL)


@pytest.fixture(scope="module")
def setup(initial):
    """``(initial state, batch, single-device (state, metrics) after one step, after two steps)``, on the host."""
    state, batch = initial
    one, metrics_one = train_step(jax.tree.map(jnp.array, state), batch, CONFIG)
    one = _host(one)
    two, metrics_two = train_step(jax.tree.map(jnp.array, one), batch, CONFIG)
    return state, batch, (one, _host(metrics_one)), (_host(two), _host(metrics_two))


def _close(got, want):
    assert_close_f32(_host(got), want, reduction=STEP_REDUCTION)


def _spec(x):
    return x.sharding.spec


def _collective_shapes(hlo: str, op: str) -> list[tuple[int, ...]]:
    """Result shapes of every ``op`` (e.g. ``all-gather``; its async ``-start`` form too) in HLO text."""
    shapes = []
    for line in hlo.splitlines():
        match = re.search(rf"=\s*(.*?)\s{op}(?:-start)?\(", line)
        if match:
            shapes += [
                tuple(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\[([\d,]*)\]", match[1])
            ]
    return shapes


# Expected parameter specs, written out by hand from the rule table (not computed by the code under test).
REPLICATED = {
    ("src_embed", "embedding"): P(None, None),
    ("tgt_embed", "embedding"): P(None, None),
    ("output", "params", "w_o"): P(None, None),
    ("decoder", "params", "u"): P(None, None, None),
}
TENSOR4 = {  # model=4: l=6 does not split, so U_o's hidden (input) dim takes the model axis instead
    ("src_embed", "embedding"): P("model", None),
    ("tgt_embed", "embedding"): P("model", None),
    ("output", "params", "w_o"): P(None, "model"),
    ("output", "params", "b_w"): P("model"),
    ("output", "params", "u_o"): P("model", None, None),
    ("output", "params", "c_o"): P(None, None, None),
    ("attention", "params", "w_q"): P(None, "model"),
    ("attention", "params", "w_k"): P(None, "model"),
    ("decoder", "params", "u"): P(None, None, "model"),
    ("init_state", "w_s"): P(None, "model"),
}
TENSOR2 = {  # model=2: l=6 splits, the whole deep output is column-parallel over l
    **TENSOR4,
    ("output", "params", "u_o"): P(None, "model", None),
    ("output", "params", "c_o"): P(None, "model", None),
    ("output", "params", "b_o"): P("model", None),
}
VOCAB_SPLIT_SHAPES = {(20, 5), (24, 5), (6, 24), (24,)}  # full shapes of the embeddings, W_o and its bias

CASES = [
    pytest.param("data", dict(data=8), REPLICATED, id="data8", marks=pytest.mark.slow),
    pytest.param("tensor", dict(model=4), TENSOR4, id="model4", marks=pytest.mark.slow),
    pytest.param("data+tensor", dict(data=4, model=2), TENSOR2, id="data4xmodel2"),
]


@pytest.mark.parametrize(("strategy", "mesh_shape", "expected_specs"), CASES)
def test_sharded_step_equals_single_device_step(setup, strategy, mesh_shape, expected_specs):
    state, batch, (want, want_metrics), (want_two, want_metrics_two) = setup
    devices = int(np.prod(list(mesh_shape.values())))
    mesh, rules = make_mesh(**mesh_shape, devices=jax.devices()[:devices]), rules_for(strategy)
    sharded = shard_train_state(state, CONFIG, mesh, rules)
    compiled = make_sharded_train_step(CONFIG, mesh, rules).lower(sharded, batch).compile()
    got, metrics = compiled(sharded, batch)

    # The loss, the (clipped) gradients through Adam's first moment, and the updated parameters.
    _close(metrics, want_metrics)
    b1 = OPTIMIZER.b1
    grads = jax.tree.map(lambda mu: np.asarray(mu) / (1 - b1), got.opt_state[1][0].mu)
    want_grads = jax.tree.map(lambda mu: mu / (1 - b1), want.opt_state[1][0].mu)
    _close(grads, want_grads)
    assert max(float(np.max(np.abs(g))) for g in jax.tree.leaves(want_grads)) > 1e-2  # not a vacuous check
    _close(got.params, want.params)
    # The update itself (~lr·g, up to 1e-2), relative to its own size: a smooth function of the gradient.
    delta = jax.tree.map(lambda a, b: np.asarray(a) - b, got.params, state.params)
    _close(delta, jax.tree.map(lambda a, b: a - b, want.params, state.params))
    assert int(got.step) == 1
    np.testing.assert_array_equal(got.rng, state.rng)

    # Shardings: parameters as the rules say, Adam's moments like their parameters, scalars replicated.
    for path, spec in expected_specs.items():
        param, mu = got.params, got.opt_state[1][0].mu
        for key in path:
            param, mu = param[key], mu[key]
        assert _spec(param) == spec, path
        assert _spec(mu) == spec, path
    assert _spec(got.step) == P() and _spec(got.opt_state[1][0].count) == P()
    assert all(_spec(m) == P() for m in jax.tree.leaves(metrics))

    # The compiled program's collectives.
    hlo = compiled.as_text()
    if mesh.shape["data"] > 1:
        # Gradients are summed over the data replicas: the target embedding's (local shard of the) gradient is
        # all-reduced.
        local = (MODEL.tgt_vocab // mesh.shape["model"], MODEL.embed)
        assert local in _collective_shapes(hlo, "all-reduce")
    if mesh.shape["model"] > 1:
        # Tensor parallelism communicates activations, never a whole vocabulary-sized weight.
        gathered = set(_collective_shapes(hlo, "all-gather"))
        assert gathered  # the program really is partitioned over model
        assert not gathered & VOCAB_SPLIT_SHAPES, gathered & VOCAB_SPLIT_SHAPES

    # The output state has the input's shardings: it feeds the next step as is (and Adam's count carried over).
    got_two, metrics_two = compiled(got, batch)
    _close(metrics_two, want_metrics_two)
    _close(got_two.params, want_two.params)


def test_abstract_sharded_state_has_the_states_shapes_and_the_rules_shardings(initial):
    state = initial[0]
    mesh, rules = make_mesh(data=4, model=2), rules_for("data+tensor")
    abstract = abstract_sharded_state(CONFIG, mesh, rules)
    assert jax.tree.structure(abstract) == jax.tree.structure(state)
    shardings = jax.tree.leaves(train_state_shardings(CONFIG, mesh, rules))
    for a, x, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(state), shardings, strict=True):
        assert (
            isinstance(a, jax.ShapeDtypeStruct) and a.shape == np.shape(x) and a.dtype == np.asarray(x).dtype
        )
        assert a.sharding == s
    assert abstract.params["tgt_embed"]["embedding"].sharding.spec == P("model", None)
    assert abstract.opt_state[1][0].nu["output"]["params"]["w_o"].sharding.spec == P(None, "model")
    assert abstract.rng.sharding.spec == P()


@pytest.mark.slow  # orbax saves a sharded state array by array (~10 s on 2 cores)
def test_checkpoint_written_on_one_mesh_restores_onto_another(initial, tmp_path):
    state = initial[0]
    manager = CheckpointManager(tmp_path, async_save=False, keep_best=False)
    manager.save(1, shard_train_state(state, CONFIG, make_mesh(data=8), rules_for("data")), {}, {})
    manager.wait()
    mesh, rules = make_mesh(data=4, model=2), rules_for("data+tensor")
    restored = manager.restore(1, abstract_sharded_state(CONFIG, mesh, rules)).state
    manager.close()

    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), restored, state)
    for x, s in zip(
        jax.tree.leaves(restored), jax.tree.leaves(train_state_shardings(CONFIG, mesh, rules)), strict=True
    ):
        assert x.sharding.is_equivalent_to(s, np.ndim(x)), (x.sharding, s)
    assert _spec(restored.params["tgt_embed"]["embedding"]) == P("model", None)


def test_indivisible_parameter_dims_are_replicated_or_rejected_when_strict():
    config = StepConfig(model=MODEL.replace(tgt_vocab=25), optimizer=OPTIMIZER)
    mesh, rules = make_mesh(model=2, devices=jax.devices()[:2]), rules_for("tensor")
    shardings = train_state_shardings(config, mesh, rules)
    assert shardings.params["tgt_embed"]["embedding"].spec == P(None, None)
    assert shardings.params["src_embed"]["embedding"].spec == P("model", None)
    assert isinstance(shardings.opt_state[1][0].mu["output"]["params"]["w_o"], NamedSharding)
    with pytest.raises(
        ValueError, match=r"parameter \['output'\]\['params'\]\['b_w'\]: dim 0 \('vocab'\) of shape \[25\]"
    ):
        train_state_shardings(config, mesh, rules, strict=True)
