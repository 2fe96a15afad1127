"""The train step on a device mesh: :func:`attn_jax.train.train_step` under ``jax.jit`` with named shardings.

Nothing about the objective or the optimiser changes: the sharded step *calls* the single-device
:func:`~attn_jax.train._step.train_step` (a nested ``jax.jit`` is inlined into the outer program), and the outer
``jax.jit`` pins only where things live: the state as the logical-axis rules say (parameters by their NNX
metadata, optimiser moments like their parameters, scalars and the PRNG key replicated), the batch split over
``data``, the metrics replicated. The compiler (``AxisType.Auto`` mesh axes) partitions everything in between
and inserts the collectives: an all-reduce of the gradients under data parallelism, all-gathers of small
activations and all-reduces of partial sums under tensor parallelism. The old state's buffers are donated.

    mesh = make_mesh(data=2, model=4)
    rules = rules_for("data+tensor")
    step = make_sharded_train_step(step_config, mesh, rules)
    state = shard_train_state(init_train_state(step_config, seed), step_config, mesh, rules)
    state, metrics = step(state, batch)

A checkpoint written under one mesh restores onto another through :func:`abstract_sharded_state` (orbax reads
each array straight into the target shardings). Gradient accumulation (``optimizer.accumulate``) has its own three
programs, :func:`make_sharded_accumulation`, with the gradient sums laid out like the parameters.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from attn_jax.models import ModelConfig, build_model
from attn_jax.models.interface import layer_params_hook
from attn_jax.parallel import (
    DEFAULT_RULES,
    Rules,
    batch_sharding,
    gather_layer,
    gathered_rules,
    param_shardings,
    replicated,
)
from attn_jax.train import _step
from attn_jax.train._loss import LossSums
from attn_jax.train._optim import make_optimizer
from attn_jax.train._step import EvalMetrics, GradSums, StepConfig, TrainMetrics, TrainState

__all__ = [
    "abstract_sharded_state",
    "make_sharded_accumulation",
    "make_sharded_eval_step",
    "make_sharded_train_step",
    "model_param_shardings",
    "shard_train_state",
    "train_state_shardings",
]


def model_param_shardings(
    model: ModelConfig, mesh: Mesh, rules: Rules = DEFAULT_RULES, *, strict: bool = False
) -> dict:
    """A ``NamedSharding`` per parameter of ``model`` (the structure of ``TrainState.params``), from the
    logical axis names the model annotates its ``nnx.Param``s with (no parameter is allocated)."""
    abstract = nnx.eval_shape(lambda: build_model(model, rngs=nnx.Rngs(0)))
    return param_shardings(nnx.state(abstract, nnx.Param), mesh, rules, strict=strict)


def _abstract_state(config: StepConfig) -> TrainState:
    return jax.eval_shape(functools.partial(_step.init_train_state, config), jnp.zeros((), jnp.int32))


def train_state_shardings(
    config: StepConfig, mesh: Mesh, rules: Rules = DEFAULT_RULES, *, strict: bool = False
) -> TrainState:
    """A :class:`TrainState` of ``NamedSharding``s: parameters by the rules, each optimiser moment like its
    parameter (``optax.tree_map_params``), the moving average (if any) like the parameters, every other leaf
    (step, counts, the PRNG key) replicated."""
    hashable = tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in rules)
    return _state_shardings(config, mesh, hashable, strict)


@functools.lru_cache(maxsize=16)
def _state_shardings(config: StepConfig, mesh: Mesh, rules: Rules, strict: bool) -> TrainState:
    params = model_param_shardings(config.model, mesh, rules, strict=strict)
    tx = make_optimizer(config.optimizer)
    opt_state = optax.tree_map_params(
        tx,
        lambda _, sharding: sharding,
        _abstract_state(config).opt_state,
        params,
        transform_non_params=lambda _: replicated(mesh),
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )
    ema = params if config.optimizer.ema_decay > 0 else None
    return TrainState(
        step=replicated(mesh), params=params, opt_state=opt_state, rng=replicated(mesh), ema_params=ema
    )


def shard_train_state(
    state: TrainState, config: StepConfig, mesh: Mesh, rules: Rules = DEFAULT_RULES, *, strict: bool = False
) -> TrainState:
    """``state`` placed on ``mesh`` as :func:`train_state_shardings` says (``jax.device_put``; a state already
    sharded differently is resharded)."""
    return jax.device_put(state, train_state_shardings(config, mesh, rules, strict=strict))


def abstract_sharded_state(
    config: StepConfig, mesh: Mesh, rules: Rules = DEFAULT_RULES, *, strict: bool = False
) -> TrainState:
    """The train state's ``jax.ShapeDtypeStruct``s carrying their target shardings on ``mesh``.

    The restore target of an orbax checkpoint onto any mesh (the one it was written on or another):
    ``CheckpointManager.restore(step, args=ocp.args.StandardRestore(abstract_sharded_state(cfg, mesh, rules)))``.
    """
    shardings = train_state_shardings(config, mesh, rules, strict=strict)
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), _abstract_state(config), shardings
    )


def _gathering(mesh: Mesh, rules: Rules):
    """A context in which each scanned layer gathers its weights (fully sharded rules), else a no-op.

    Without it the compiler may keep a weight split over ``data`` and move the activations instead, all-gathering
    the batch at every matmul; gathering the layer's weights keeps the batch split as data parallelism does.
    """
    if gathered_rules(rules) == tuple(rules):
        return contextlib.nullcontext()
    return layer_params_hook(functools.partial(gather_layer, mesh=mesh, rules=rules))


def make_sharded_train_step(
    config: StepConfig, mesh: Mesh, rules: Rules = DEFAULT_RULES, *, strict: bool = False
):
    """``step(state, batch) -> (state, metrics)``: :func:`~attn_jax.train.train_step` compiled for ``mesh``.

    ``jax.jit(..., in_shardings=(state, batch), out_shardings=(state, replicated metrics), donate_argnums=0)``:
    the state must already be laid out as :func:`train_state_shardings` says (use :func:`shard_train_state`);
    every batch array is split over its leading axis as ``rules`` map ``batch`` (so the batch size must be a
    multiple of that mesh axis). The loss, gradients and update are those of the single-device step, up to
    float32 reduction order.

    Args:
      config: the static step configuration (model, optimiser, label smoothing).
      mesh: the device mesh (:func:`attn_jax.parallel.make_mesh`).
      rules: the logical-axis rule table (:func:`attn_jax.parallel.rules_for`).
      strict: raise instead of replicating parameter dims not divisible by their mesh axes.

    Returns:
      The jitted step (``.lower(state, batch)`` works for inspecting the compiled program).
    """
    state_shardings = train_state_shardings(config, mesh, rules, strict=strict)
    metrics_sharding = replicated(mesh)  # a prefix: every metric leaf
    # Build (and cache) the module structure outside any mesh context: nnx.eval_shape inside `jax.set_mesh` would
    # try to resolve the logical axis names against the mesh.
    _step._graphdef(config.model)

    def sharded_train_step(state: TrainState, batch) -> tuple[TrainState, TrainMetrics]:
        # The mesh is ambient inside the trace, so a model that pipelines its layers (GNMT's pipelined_stack under
        # jax.shard_map) finds it without the caller having to lower the step under `jax.set_mesh`.
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), _gathering(mesh, rules):
            return _step.train_step(state, batch, config)

    return jax.jit(
        sharded_train_step,
        in_shardings=(state_shardings, batch_sharding(mesh, rules)),
        out_shardings=(state_shardings, metrics_sharding),
        donate_argnums=0,
    )


def make_sharded_eval_step(
    config: StepConfig, mesh: Mesh, rules: Rules = DEFAULT_RULES, *, strict: bool = False
):
    """``step(params, batch) -> metrics``: :func:`~attn_jax.train.eval_step` compiled for ``mesh``.

    The parameters lie as :func:`train_state_shardings` says, the batch is split as in training, the metrics are
    replicated; under fully sharded rules each layer gathers its weights as the train step does.
    """
    params = train_state_shardings(config, mesh, rules, strict=strict).params
    _step._graphdef(config.model)  # built outside any mesh context (see make_sharded_train_step)

    def sharded_eval_step(params: dict, batch) -> EvalMetrics:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), _gathering(mesh, rules):
            return _step.eval_step(params, batch, config)

    return jax.jit(
        sharded_eval_step, in_shardings=(params, batch_sharding(mesh, rules)), out_shardings=replicated(mesh)
    )


def make_sharded_accumulation(
    config: StepConfig, mesh: Mesh, rules: Rules = DEFAULT_RULES, *, strict: bool = False
):
    """``(zero, add, apply)``: :func:`~attn_jax.train.zero_grad_sums`, :func:`~attn_jax.train.accumulate_grads`
    and :func:`~attn_jax.train.apply_grad_sums` compiled for ``mesh`` (gradient accumulation).

    The gradient sums are laid out like the parameters and donated from one micro-batch to the next; the
    state as :func:`train_state_shardings` says; every batch split over ``data`` as in
    :func:`make_sharded_train_step`. ``zero(params)``, ``add(sums, state, batch)``, ``apply(state, sums)``.
    """
    state_shardings = train_state_shardings(config, mesh, rules, strict=strict)
    rep = replicated(mesh)
    sums_shardings = GradSums(
        grads=state_shardings.params, loss=LossSums(rep, rep, rep, rep), coverage=rep, count=rep
    )
    _step._graphdef(config.model)  # outside any mesh context, as in make_sharded_train_step

    def add(sums, state, batch):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), _gathering(mesh, rules):
            return _step.accumulate_grads(sums, state, batch, config)

    def apply(state, sums):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), _gathering(mesh, rules):
            return _step.apply_grad_sums(state, sums, config)

    zero = jax.jit(_step.zero_grad_sums, in_shardings=(state_shardings.params,), out_shardings=sums_shardings)
    add = jax.jit(
        add,
        in_shardings=(sums_shardings, state_shardings, batch_sharding(mesh, rules)),
        out_shardings=sums_shardings,
        donate_argnums=0,
    )
    apply = jax.jit(
        apply,
        in_shardings=(state_shardings, sums_shardings),
        out_shardings=(state_shardings, rep),
        donate_argnums=0,
    )
    return zero, add, apply
