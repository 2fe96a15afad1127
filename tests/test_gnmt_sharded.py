"""GNMT's sharded train step equals the single-device step under every strategy, on 8 fake CPU devices.

One update of a tiny GNMT (Wu et al. 2016: 4 + 4 LSTM layers, residuals from layer 3, so the encoder and the
decoder each have a uniform stack of 2 layers that splits into 2 pipeline stages) under data (data=4), tensor
(model=2), pipeline (stage=2, ``GNMTConfig.pipeline_stages=2``) and data × pipeline (data=4 × stage=2), each
compared with :func:`attn_jax.train.train_step` on one device: the loss, the gradients (through Adam's first
moment), the updated parameters, and a second update from the first one's output state.

Sizes are distinct so that a swapped axis or a gathered weight cannot hide in the HLO: B=8, S=7, T=5, m=6, n=10,
n'=14, K_x=18, K_y=22 (even where the model axis splits them; the encoder's 2n=20 differs from every other
size). Parameters are drawn from N(0, 0.5²) with NumPy (U(-0.1, 0.1) makes every gradient tiny, where a relative
comparison would pass almost anything); the optimiser is Adam with ``eps=1`` as in tests/test_sharded_step.py:
its first update ``lr·ĝ/(|ĝ|+1)`` is a smooth function of the gradient and its first moment ``μ = (1-β₁)·g``
exposes the gradient itself.

Compilation dominates (a GNMT train step is ~20 s of CPU per program on this machine): every program here is
compiled once, with XLA's backend (LLVM) optimisation level 0, which halves that time. The partitioned HLO these
tests inspect (collectives, shardings) is fixed before the backend runs; the level only changes how the same
HLO becomes machine code.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from attn_jax.data import Batch
from attn_jax.models import GNMTConfig, build_model, gnmt_wmt14_config
from attn_jax.parallel import make_mesh, rules_for
from attn_jax.train import OptimizerConfig, StepConfig, TrainState, make_optimizer, train_step
from attn_jax.train import _step as step_module
from attn_jax.train._sharded import make_sharded_train_step, shard_train_state, train_state_shardings
from tests.tolerance import assert_close_f32

MODEL = GNMTConfig(
    src_vocab=18,
    tgt_vocab=22,
    embed=6,
    hidden=10,
    align=14,
    encoder_layers=4,
    decoder_layers=4,
    residual_start=3,
)
OPTIMIZER = OptimizerConfig(name="adam", learning_rate=0.1, eps=1.0, clip_norm=1.0)
CONFIG = StepConfig(model=MODEL, optimizer=OPTIMIZER)
B, S, T = 8, 7, 5
COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}  # see the module docstring

# Loss, gradients and parameters agree with the single-device step up to float32 rounding. Data parallelism sums
# per-shard partial gradients (an all-reduce over data), tensor parallelism splits matmuls into partial sums; the
# pipeline runs the same float32 operations per layer and step in another schedule (and other fusions). Two float32
# programs, so tests.tolerance.assert_close_f32 over the step's longest summation chain: the forward (S steps of 4
# encoder layers over a 2n input and n; T steps of 4 decoder layers over 4n, the attention over 2n + n', softmax
# and context over S, the output over n), the backward through it again, the loss's sums over the B·T tokens and
# the K_y-way softmax. Each leaf is judged against its own largest entry (gradient entries that are sums of
# cancelling terms too; the gradient norm is ~1, just under the clip at 1). Measured before this helper, the
# largest |got − want| / (1e-6 + 1e-5·|want|) over all entries was 0.015 for loss, gradients and parameters and
# 0.29 for the update.
_N = MODEL.hidden
_FORWARD = S * 4 * (3 * _N) + T * (4 * (4 * _N) + (2 * _N + MODEL.align + 2 * S) + _N)
STEP_REDUCTION = 2 * _FORWARD + B * T + MODEL.tgt_vocab


def _host(tree):
    return jax.tree.map(np.array, tree)


def _close(got, want):
    assert_close_f32(_host(got), want, reduction=STEP_REDUCTION)


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


@pytest.fixture(scope="module")
def initial():
    """``(initial train state as host NumPy arrays, batch)``."""
    rng = np.random.default_rng(0)
    abstract = nnx.eval_shape(lambda: build_model(MODEL, rngs=nnx.Rngs(0)))
    shapes = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
    params = jax.tree.map(lambda s: rng.normal(0.0, 0.5, s.shape).astype(np.float32), shapes)
    state = TrainState(
        step=np.int32(0),
        params=params,
        opt_state=_host(make_optimizer(OPTIMIZER).init(params)),
        rng=np.asarray(jax.random.key_data(jax.random.key(1))),
    )
    src_len = np.array([7, 3, 5, 1, 6, 7, 2, 4], np.int32)
    tgt_len = np.array([5, 2, 4, 1, 5, 3, 5, 4], np.int32)
    src_mask = np.arange(S) < src_len[:, None]
    tgt_mask = np.arange(T) < tgt_len[:, None]
    batch = Batch(
        src=np.where(src_mask, rng.integers(3, MODEL.src_vocab, (B, S)), 0).astype(np.int32),
        src_len=src_len,
        tgt_in=np.where(tgt_mask, rng.integers(3, MODEL.tgt_vocab, (B, T)), 0).astype(np.int32),
        tgt_out=np.where(tgt_mask, rng.integers(3, MODEL.tgt_vocab, (B, T)), 0).astype(np.int32),
        tgt_len=tgt_len,
        example_id=np.arange(B, dtype=np.int32),
    )
    return state, batch


@pytest.fixture(scope="module")
def setup(initial):
    """``(initial state, batch, single-device (state, metrics) after one step, after two steps)``, on the host."""
    state, batch = initial
    device_state = jax.tree.map(jnp.array, state)
    compiled = train_step.lower(device_state, batch, config=CONFIG).compile(COMPILER_OPTIONS)
    one, metrics_one = compiled(device_state, batch)
    one = _host(one)
    two, metrics_two = compiled(jax.tree.map(jnp.array, one), batch)
    return state, batch, (one, _host(metrics_one)), (_host(two), _host(metrics_two))


# ------------------------------------------------------------------------------------------- expected shardings
# Written out by hand from the rule table (attn_jax/parallel/_rules.py) and the model's logical names, not
# computed by the code under test. Tensor: vocab, align, hidden -> model (align before hidden, so W_q [hidden,
# align] splits its columns; hidden_in, embed, context stay whole). Pipeline: layers -> stage, nothing else.

M, G = "model", "stage"
_LSTMS = ("encoder_forward", "encoder_backward", "encoder_plain/0", "decoder_bottom", "decoder_plain/0")
_STACKS = ("encoder_stack", "decoder_stack")
_KERNELS = {"encoder": ("w_x", "u"), "decoder": ("w_x", "u", "w_c")}


def _lstm_paths(name):
    kernels = _KERNELS[name.split("_")[0]]
    return {f"{name}/params/{k}": 3 for k in kernels} | {f"{name}/params/b": 2}


TENSOR = {  # path -> spec under tensor (model=2)
    "src_embed/embedding": (M, None),
    "tgt_embed/embedding": (M, None),
    "output/w": (None, M),
    "output/b": (M,),
    "attention/params/w_q": (None, M),
    "attention/params/w_k": (None, M),
    "attention/params/v": (M,),
    "attention/params/b": (M,),
    "attention/params/g": (),
    # LSTM kernels [in, 4, n] and biases [4, n]: column-parallel over the units n (gates split together).
    **{path: (None,) * (rank - 1) + (M,) for name in _LSTMS for path, rank in _lstm_paths(name).items()},
    **{path: (None,) * rank + (M,) for name in _STACKS for path, rank in _lstm_paths(name).items()},
}
PIPELINE = {  # path -> spec under pipeline (stage=2): only the stacks' leading layers axis is split
    path: (G,) + (None,) * rank if any(path.startswith(s) for s in _STACKS) else (None,) * len(spec)
    for path, spec in TENSOR.items()
    for rank in [len(spec) - 1]
}
DATA = {path: (None,) * len(spec) for path, spec in TENSOR.items()}  # data: every weight replicated


def _at(tree, path):
    for key in path.split("/"):
        tree = tree[int(key) if key.isdigit() else key]
    return tree


def test_expected_tables_cover_every_parameter(initial):
    paths = {
        "/".join(str(getattr(k, "key", k)) for k in path)
        for path, _ in jax.tree_util.tree_leaves_with_path(initial[0].params)
    }
    assert paths == set(TENSOR) == set(PIPELINE)
    for path, spec in TENSOR.items():
        assert len(spec) == np.ndim(_at(initial[0].params, path)), path


STRATEGIES = [  # (strategy, mesh shape, pipeline stages, expected parameter specs)
    ("data", dict(data=4), 1, DATA),
    ("tensor", dict(model=2), 1, TENSOR),
    ("pipeline", dict(stage=2), 2, PIPELINE),
    ("data+pipeline", dict(data=4, stage=2), 2, PIPELINE),
]


def _config(stages: int) -> StepConfig:
    return StepConfig(model=MODEL.replace(pipeline_stages=stages), optimizer=OPTIMIZER)


def _mesh(shape):
    return make_mesh(**shape, devices=jax.devices()[: int(np.prod(list(shape.values())))])


@pytest.mark.parametrize(
    ("strategy", "mesh_shape", "stages", "expected"), STRATEGIES, ids=[s[0] for s in STRATEGIES]
)
def test_state_shardings_follow_the_rules(strategy, mesh_shape, stages, expected):
    # No compilation: the shardings the sharded step pins its state to, for every parameter and Adam moment.
    shardings = train_state_shardings(_config(stages), _mesh(mesh_shape), rules_for(strategy))
    adam = shardings.opt_state[1][0]
    for path, spec in expected.items():
        assert _at(shardings.params, path).spec == P(*spec), path
        assert _at(adam.mu, path).spec == P(*spec) and _at(adam.nu, path).spec == P(*spec), path
    assert shardings.step.spec == P() and adam.count.spec == P() and shardings.rng.spec == P()


def _compile(strategy, mesh_shape, stages, state, batch):
    """``(the sharded step compiled for the mesh, the state placed on it, the mesh)``."""
    config, mesh, rules = _config(stages), _mesh(mesh_shape), rules_for(strategy)
    # The model's graph definition is built (nnx.eval_shape, cached per model config) outside the mesh context:
    # under `jax.set_mesh` Flax resolves the params' logical names against the mesh's axes and fails.
    step_module._graphdef(config.model)
    step = make_sharded_train_step(config, mesh, rules)
    sharded = shard_train_state(state, config, mesh, rules)
    # pipelined_stack reads the ambient mesh at trace time; make_sharded_train_step does not set it itself.
    with jax.set_mesh(mesh):
        compiled = step.lower(sharded, batch).compile(COMPILER_OPTIONS)
    return compiled, sharded, mesh


CASES = [
    pytest.param(*STRATEGIES[0], id="data4", marks=[pytest.mark.slow, pytest.mark.heavy]),
    pytest.param(*STRATEGIES[1], id="model2", marks=[pytest.mark.slow, pytest.mark.heavy]),
    pytest.param(*STRATEGIES[2], id="stage2", marks=pytest.mark.slow),
    pytest.param(*STRATEGIES[3], id="data4xstage2"),
]


@pytest.mark.parametrize(("strategy", "mesh_shape", "stages", "expected"), CASES)
def test_sharded_gnmt_step_equals_single_device_step(setup, strategy, mesh_shape, stages, expected):
    state, batch, (want, want_metrics), (want_two, want_metrics_two) = setup
    compiled, sharded, mesh = _compile(strategy, mesh_shape, stages, state, batch)
    got, metrics = compiled(sharded, batch)

    # The loss, the (clipped) gradients through Adam's first moment, and the updated parameters.
    _close(metrics, want_metrics)
    assert float(metrics.loss.tokens) == batch.tgt_len.sum()  # real target tokens, counted once across shards
    b1 = OPTIMIZER.b1
    grads = jax.tree.map(lambda mu: np.asarray(mu) / (1 - b1), got.opt_state[1][0].mu)
    want_grads = jax.tree.map(lambda mu: mu / (1 - b1), want.opt_state[1][0].mu)
    _close(grads, want_grads)
    assert max(float(np.max(np.abs(g))) for g in jax.tree.leaves(want_grads)) > 1e-2  # not a vacuous check
    # Every stacked layer got its own gradient (a pipeline stage whose work was dropped would leave zeros).
    for name in _STACKS:
        u = want_grads[name]["params"]["u"]
        assert np.all(np.max(np.abs(u.reshape(u.shape[0], -1)), axis=1) > 1e-4), name
    _close(got.params, want.params)
    # The update itself (~lr·g/(|g|+1), up to 1e-2), relative to its own size: a smooth function of the gradient.
    delta = jax.tree.map(lambda a, b: np.asarray(a) - b, got.params, state.params)
    _close(delta, jax.tree.map(lambda a, b: a - b, want.params, state.params))
    assert int(got.step) == 1
    np.testing.assert_array_equal(got.rng, state.rng)

    # Shardings: parameters as the rules say, Adam's moments like their parameters, scalars replicated.
    adam = got.opt_state[1][0]
    for path, spec in expected.items():
        assert _at(got.params, path).sharding.spec == P(*spec), path
        assert _at(adam.mu, path).sharding.spec == P(*spec), path
    assert got.step.sharding.spec == P() and adam.count.sharding.spec == P()
    assert all(m.sharding.spec == P() for m in jax.tree.leaves(metrics))

    # The compiled program's collectives.
    hlo = compiled.as_text()
    local_batch = B // mesh.shape["data"]
    gathered = set(_collective_shapes(hlo, "all-gather"))
    # No strategy gathers a whole weight: tensor parallelism communicates activations (never an embedding, the
    # softmax or an LSTM kernel), and the pipeline's layers stay on their stage (never a whole stacked kernel).
    weights = {np.shape(x) for x in jax.tree.leaves(state.params) if np.ndim(x)}
    assert not gathered & weights, gathered & weights
    if mesh.shape["data"] > 1:
        # Gradients are summed over the data replicas: the target embedding's gradient is all-reduced.
        assert (MODEL.tgt_vocab, MODEL.embed) in _collective_shapes(hlo, "all-reduce")
    if mesh.shape["stage"] > 1:
        # The wavefront hands each stage's output [B / data, n] to the next stage: collective-permutes of the
        # local batch's activations (under data × pipeline the batch stays split inside the pipeline too).
        permuted = _collective_shapes(hlo, "collective-permute")
        assert (local_batch, MODEL.hidden) in permuted, permuted
        assert (B, MODEL.hidden) not in permuted or local_batch == B
    elif mesh.shape["model"] == 1:
        # Data parallelism alone permutes nothing: the permutes above are the pipeline's.
        assert not re.search(r"\bcollective-permute(-start)?\(", hlo)
    if mesh.shape["model"] > 1:
        assert gathered  # the program really is partitioned over model: it gathers split activations

    # The output state has the input's shardings: it feeds the next step as is (Adam's count carried over).
    got_two, metrics_two = compiled(got, batch)
    _close(metrics_two, want_metrics_two)
    _close(got_two.params, want_two.params)


PAPER_MESHES = [  # the 8-device layouts of experiments/gnmt/README.md
    ("data", dict(data=8)),
    ("tensor", dict(model=8)),
    ("data+pipeline", dict(data=4, stage=2)),
    ("data+tensor", dict(data=2, model=4)),
]


@pytest.mark.parametrize(("strategy", "mesh_shape"), PAPER_MESHES, ids=[s for s, _ in PAPER_MESHES])
def test_paper_preset_splits_evenly_on_8_devices(strategy, mesh_shape):
    # strict=True: no split the rules ask for is silently dropped at the paper's sizes (32k vocabularies,
    # n = n' = 1024, stacks of 6 layers), so the README's memory table measures the plan as written.
    stages = mesh_shape.get("stage", 1)
    config = StepConfig(model=gnmt_wmt14_config(pipeline_stages=stages), optimizer=OPTIMIZER)
    shardings = train_state_shardings(config, make_mesh(**mesh_shape), rules_for(strategy), strict=True)
    embedding = shardings.params["tgt_embed"]["embedding"].spec
    stack = shardings.params["decoder_stack"]["params"]["u"].spec
    assert embedding == (P(M, None) if "tensor" in strategy else P(None, None))
    assert stack == P(G if "pipeline" in strategy else None, None, None, M if "tensor" in strategy else None)
