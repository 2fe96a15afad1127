"""The train state and the pure, jitted ``train_step`` / ``eval_step``.

The model is an NNX module, but the step is a pure function of pytrees (Flax NNX's functional API): the
module's *graph definition* is derived from the static :class:`StepConfig` (``nnx.eval_shape`` + ``nnx.split``,
cached), its parameters travel in :class:`TrainState` as a plain nested dict of arrays, and every step
rebuilds the module with ``nnx.merge(graphdef, params)`` inside the trace. So ``jax.jit`` sees only arrays,
donates the old state's buffers, and two runs with equal configs share compiled programs (the jit cache is
keyed on the hashable ``StepConfig``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from attn_jax.data import Batch
from attn_jax.models import ModelConfig, build_model
from attn_jax.train._align import AlignmentSums, alignment_loss_sums
from attn_jax.train._coverage import coverage_loss
from attn_jax.train._diagnostics import AttentionStats, attention_stats
from attn_jax.train._loss import LossSums, loss_sums
from attn_jax.train._optim import OptimizerConfig, ema_decay_at, make_optimizer, make_schedule
from attn_jax.typing import Array, Float, Int

__all__ = [
    "EvalMetrics",
    "GradSums",
    "StepConfig",
    "TrainMetrics",
    "TrainState",
    "accumulate_grads",
    "accumulated_train_step",
    "all_finite",
    "apply_grad_sums",
    "build_module",
    "eval_step",
    "init_params",
    "init_train_state",
    "param_count",
    "train_step",
    "zero_grad_sums",
]


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Everything the compiled steps depend on besides arrays (frozen, hashable: a static jit argument).

    Attributes:
      model: the model's sizes and options (vocabulary sizes filled in from the built vocabularies).
      optimizer: the optimiser and its schedule.
      label_smoothing: ``ε`` of the training loss (validation reports it too, and always the plain NLL).
      lambda_coverage: ``λ`` of the coverage loss (See et al. 2017) added to the token-level loss sum; 0 adds
        nothing and computes nothing.
      coverage_start_step: with ``lambda_coverage > 0``, the training updates add the coverage loss only once
        ``state.step >= coverage_start_step`` updates have been applied (See et al. 2017 add it for a final phase
        of training); before that its weight is 0. Evaluation always includes it. 0: from the first update.
      lambda_align: weight of the guided-alignment loss (:mod:`attn_jax.train._align`); needs batches with
        ``gold``. At 0 the term is not part of the compiled step.
    """

    model: ModelConfig
    optimizer: OptimizerConfig = OptimizerConfig()
    label_smoothing: float = 0.0
    lambda_coverage: float = 0.0
    coverage_start_step: int = 0
    lambda_align: float = 0.0


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training, as one pytree (checkpointed whole).

    Attributes:
      step: int32 scalar, the number of updates applied.
      params: the model's parameters, a plain nested dict of arrays (``nnx.to_pure_dict`` of the module state).
      opt_state: the optax state (moments and the schedule's count).
      rng: uint32 ``[2]``, key data of the run's base PRNG key; step ``t`` uses ``fold_in(key, t)``, so the
        randomness of a step depends on the seed and the step only (resumption is exact).
      ema_params: the moving average of ``params`` (:func:`attn_jax.train.ema_decay_at`), structured like
        them; ``None`` when ``optimizer.ema_decay`` is 0 (a ``None`` field holds no leaves, so such a state,
        its checkpoints and its compiled steps are those of a run without the field).
    """

    step: Int[Array, ""]
    params: dict
    opt_state: optax.OptState
    rng: jax.Array
    ema_params: dict | None = None


class TrainMetrics(NamedTuple):
    """What one train step reports (float32 scalars; loss sums as :class:`LossSums`, whose ``loss`` includes
    ``λ ·`` the coverage loss; ``coverage``: its unweighted sum when ``lambda_coverage > 0``, else ``None``;
    ``align`` only with ``lambda_align > 0``)."""

    loss: LossSums
    grad_norm: Float[Array, ""]
    learning_rate: Float[Array, ""]
    coverage: Float[Array, ""] | None = None
    align: AlignmentSums | None = None


class GradSums(NamedTuple):
    """The running sums of one accumulated update (float32; :func:`accumulate_grads` adds a micro-batch).

    Attributes:
      grads: ``Σ ∂(Σ loss)/∂θ`` over the micro-batches so far: the gradients of the summed, unnormalised loss.
      loss: the micro-batches' :class:`LossSums`, added.
      coverage: the unweighted coverage-loss sum (0 unless ``lambda_coverage > 0``).
      count: micro-batches added; micro-batch ``i`` of update ``t`` draws dropout from
        ``fold_in(fold_in(key, t), i)``.
    """

    grads: dict
    loss: LossSums
    coverage: Float[Array, ""]
    count: Int[Array, ""]


class EvalMetrics(NamedTuple):
    """What one eval step reports: loss sums, attention statistics (``None`` for a model without attention),
    the coverage-loss sum (``None`` unless ``lambda_coverage > 0``) and the guided-alignment sums (only with
    ``lambda_align > 0`` and gold alignments in the batch)."""

    loss: LossSums
    attention: AttentionStats | None
    coverage: Float[Array, ""] | None = None
    align: AlignmentSums | None = None


@functools.lru_cache(maxsize=32)
def _graphdef(model: ModelConfig) -> nnx.GraphDef:
    """The module structure for ``model``, without allocating parameters."""
    abstract = nnx.eval_shape(lambda: build_model(model, rngs=nnx.Rngs(0)))
    return nnx.split(abstract)[0]


def build_module(model: ModelConfig, params: dict) -> nnx.Module:
    """The NNX model for ``model`` holding ``params`` (a pure dict, as in :class:`TrainState`)."""
    return nnx.merge(_graphdef(model), params)


def param_count(model: ModelConfig) -> int:
    """Number of scalar parameters of the model (no allocation)."""
    abstract = nnx.eval_shape(lambda: build_model(model, rngs=nnx.Rngs(0)))
    return sum(int(x.size) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


@functools.partial(jax.jit, static_argnames="model")
def init_params(model: ModelConfig, key: jax.Array) -> dict:
    """Fresh parameters of ``model`` from the PRNG ``key`` (as ``nnx.Rngs(key)``), as a plain nested dict.

    Jitted: one compiled program instead of one dispatch (and compilation) per initializer, which on a CPU is
    the difference between a fraction of a second and tens of seconds.
    """
    module = build_model(model, rngs=nnx.Rngs(key))
    return nnx.to_pure_dict(nnx.state(module, nnx.Param))


@functools.partial(jax.jit, static_argnames="config")
def init_train_state(config: StepConfig, seed: Int[Array, ""]) -> TrainState:
    """A fresh state: parameters from the first half of ``split(key(seed))`` (:func:`init_params`), the
    optimiser's initial state, and the second half as the run's PRNG key."""
    init_key, run_key = jax.random.split(jax.random.key(seed))
    params = init_params(config.model, init_key)
    opt_state = make_optimizer(config.optimizer).init(params)
    ema = jax.tree.map(jnp.copy, params) if config.optimizer.ema_decay > 0 else None
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=opt_state,
        rng=jax.random.key_data(run_key),
        ema_params=ema,
    )


def _masks(batch: Batch) -> tuple[jax.Array, jax.Array]:
    if batch.src_segments is not None:  # packed rows: real wherever a pair sits
        return batch.src_segments > 0, batch.tgt_segments > 0
    src_mask = jnp.arange(batch.src.shape[1]) < batch.src_len[:, None]  # [B, S]
    tgt_mask = jnp.arange(batch.tgt_out.shape[1]) < batch.tgt_len[:, None]  # [B, T]
    return src_mask, tgt_mask


def _forward(
    config: StepConfig,
    params: dict,
    batch: Batch,
    dropout_rng: jax.Array | None = None,
    step: jax.Array | None = None,
):
    """``(loss sums, coverage-loss sum or None, attention weights, src_mask, tgt_mask)`` of ``batch``.

    ``step``: the training state's update count (``None`` in evaluation), read only by ``coverage_start_step``.
    """
    src_mask, tgt_mask = _masks(batch)
    kwargs = {} if dropout_rng is None else {"dropout_rng": dropout_rng}
    if batch.src_segments is not None:  # packed rows (data.pack): a static pytree difference, its own trace
        kwargs.update(
            src_segments=batch.src_segments,
            tgt_segments=batch.tgt_segments,
            src_positions=batch.src_positions,
            tgt_positions=batch.tgt_positions,
        )
    labels = batch.tgt_out
    if getattr(config.model, "copy", False):  # static: the default program is unchanged
        if batch.src_ext is None or batch.tgt_out_ext is None:
            raise ValueError(
                "model.copy needs batches with src_ext and tgt_out_ext (encode_corpus(..., copy=True))"
            )
        kwargs["src_ext"] = batch.src_ext
        # out-of-vocabulary target words that occur in the source are labelled with their copy ids
        labels = batch.tgt_out_ext
    # With copy the model returns normalised log-probabilities: the loss' log_softmax leaves them unchanged.
    logits, weights = build_module(config.model, params)(batch.src, src_mask, batch.tgt_in, **kwargs)
    sums = loss_sums(logits, labels, tgt_mask, label_smoothing=config.label_smoothing)
    if batch.tgt_segments is not None:  # a row holds pairs 1..k: count pairs, not rows
        sums = sums._replace(sentences=jnp.sum(jnp.max(batch.tgt_segments, axis=-1), dtype=jnp.float32))
    coverage = None
    if config.lambda_coverage > 0:  # static: with 0 nothing is computed and the loss is the cross-entropy's
        if weights is None:
            raise ValueError("lambda_coverage > 0 needs a model with attention weights")
        coverage = jnp.sum(coverage_loss(weights, tgt_mask))
        weight = config.lambda_coverage
        if config.coverage_start_step > 0 and step is not None:  # static: a training run with a late start
            weight = jnp.where(step >= config.coverage_start_step, weight, 0.0)
        sums = sums._replace(loss=sums.loss + weight * coverage)
    return sums, coverage, weights, src_mask, tgt_mask


@functools.partial(jax.jit, static_argnames="config", donate_argnames="state")
def train_step(state: TrainState, batch: Batch, config: StepConfig) -> tuple[TrainState, TrainMetrics]:
    """One update on ``batch``: token-level loss, gradients, the optimiser; ``state``'s buffers are donated.

    The objective is ``Σ loss / Σ tokens`` over the batch's real target tokens (:func:`loss_sums`, plus
    ``λ ·`` the coverage loss when ``config.lambda_coverage > 0``), plus ``lambda_align`` times the
    guided-alignment loss over the supervised target words when that weight is > 0.
    Bind the config to get the ``train_step(state, batch) -> (state, metrics)`` of the Flax examples:
    ``step = functools.partial(train_step, config=cfg)``.
    """

    # Dropout (models with a ``dropout`` rate, e.g. the Transformer): a key from the run's key and the step only,
    # so a resumed run draws the same masks. Evaluation is deterministic.
    dropout_rng = None
    if getattr(config.model, "dropout", 0.0) > 0:
        dropout_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)

    def objective(params):
        sums, coverage, weights, src_mask, tgt_mask = _forward(config, params, batch, dropout_rng, state.step)
        value = sums.loss / jnp.maximum(sums.tokens, 1.0)
        if config.lambda_align == 0.0:  # not in the graph at all: the default run computes exactly as before
            return value, (sums, coverage, None)
        if weights is None or batch.gold is None:
            raise ValueError(
                "lambda_align > 0 needs a model that returns attention weights and batches with gold alignments "
                f"(weights: {'none' if weights is None else 'yes'}, batch.gold: {batch.gold is not None})"
            )
        align = alignment_loss_sums(weights, batch.gold, src_mask, tgt_mask)
        value = value + config.lambda_align * align.loss / jnp.maximum(align.rows, 1.0)
        return value, (sums, coverage, align)

    (_, (sums, coverage, align)), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    metrics = TrainMetrics(
        loss=sums,
        grad_norm=optax.tree.norm(grads),
        learning_rate=jnp.asarray(make_schedule(config.optimizer)(state.step), jnp.float32),
        coverage=coverage,
        align=align,
    )
    return _update(state, grads, config), metrics


def _update(state: TrainState, grads: dict, config: StepConfig) -> TrainState:
    """``state`` after the optimiser's update with ``grads`` (and the moving average's, when there is one)."""
    tx = make_optimizer(config.optimizer)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    step = state.step + 1
    ema = state.ema_params
    if config.optimizer.ema_decay > 0:  # static: without it the program is the plain update
        if ema is None:
            raise ValueError("optimizer.ema_decay > 0 needs a TrainState with ema_params (init_train_state)")
        decay = ema_decay_at(config.optimizer.ema_decay, step.astype(jnp.float32))
        ema = optax.incremental_update(params, ema, 1.0 - decay)  # β·ema + (1 - β)·θ
    return state.replace(step=step, params=params, opt_state=opt_state, ema_params=ema)


@jax.jit
def zero_grad_sums(params: dict) -> GradSums:
    """Empty :class:`GradSums` for ``params``: the start of an accumulated update."""
    zero = jnp.zeros((), jnp.float32)
    return GradSums(
        grads=jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
        loss=LossSums(zero, zero, zero, zero),
        coverage=zero,
        count=jnp.zeros((), jnp.int32),
    )


@functools.partial(jax.jit, static_argnames="config", donate_argnames="sums")
def accumulate_grads(sums: GradSums, state: TrainState, batch: Batch, config: StepConfig) -> GradSums:
    """``sums`` plus one micro-batch: the gradient of its summed loss ``Σ loss`` (not divided by its tokens).

    Compiled memory is that of one micro-batch (its activations) plus the float32 sums, which are donated
    and updated in place. :func:`apply_grad_sums` divides by the tokens of all micro-batches together.
    """
    if config.lambda_align > 0:  # its loss is normalised per supervised word: a second normaliser
        raise ValueError("optimizer.accumulate > 1 does not support lambda_align > 0")
    dropout_rng = None
    if getattr(config.model, "dropout", 0.0) > 0:
        step_key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        dropout_rng = jax.random.fold_in(step_key, sums.count)

    def objective(params):
        loss, coverage, *_ = _forward(config, params, batch, dropout_rng, state.step)
        return loss.loss, (loss, coverage)

    (_, (loss, coverage)), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    return GradSums(
        grads=jax.tree.map(jnp.add, sums.grads, grads),
        loss=LossSums(*(a + b for a, b in zip(sums.loss, loss, strict=True))),
        coverage=sums.coverage + (0.0 if coverage is None else coverage),
        count=sums.count + 1,
    )


@functools.partial(jax.jit, static_argnames="config", donate_argnames="state")
def apply_grad_sums(state: TrainState, sums: GradSums, config: StepConfig) -> tuple[TrainState, TrainMetrics]:
    """One update from accumulated micro-batches: the gradient ``Σ grads / Σ tokens``, then the optimiser.

    That is the gradient of ``Σ loss / Σ tokens`` over all the micro-batches' real target tokens, the
    objective :func:`train_step` computes for one batch holding all their rows.
    """
    grads = jax.tree.map(lambda g: g / jnp.maximum(sums.loss.tokens, 1.0), sums.grads)
    metrics = TrainMetrics(
        loss=sums.loss,
        grad_norm=optax.tree.norm(grads),
        learning_rate=jnp.asarray(make_schedule(config.optimizer)(state.step), jnp.float32),
        coverage=sums.coverage if config.lambda_coverage > 0 else None,
    )
    return _update(state, grads, config), metrics


def accumulated_train_step(state: TrainState, batches, config: StepConfig) -> tuple[TrainState, TrainMetrics]:
    """One update from the micro-batches ``batches`` (an iterable; their shapes may differ).

    :func:`zero_grad_sums`, :func:`accumulate_grads` per micro-batch, :func:`apply_grad_sums`. Each
    micro-batch shape compiles :func:`accumulate_grads` once. With dropout off, the update equals
    :func:`train_step` on one batch holding all the micro-batches' rows, up to float32 rounding.
    ``state``'s buffers are donated.
    """
    sums = zero_grad_sums(state.params)
    for batch in batches:
        sums = accumulate_grads(sums, state, batch, config)
    return apply_grad_sums(state, sums, config)


@functools.partial(jax.jit, static_argnames="config")
def eval_step(params: dict, batch: Batch, config: StepConfig) -> EvalMetrics:
    """Loss sums and attention statistics of ``batch`` under ``params`` (teacher forcing, no update).

    ``batch.gold`` (when present) adds the gold-alignment diagnostics, and with ``lambda_align > 0`` the
    guided-alignment loss.
    """
    sums, coverage, weights, src_mask, tgt_mask = _forward(config, params, batch)
    stats = None if weights is None else attention_stats(weights, src_mask, tgt_mask, batch.gold)
    align = None
    if config.lambda_align > 0 and weights is not None and batch.gold is not None:
        align = alignment_loss_sums(weights, batch.gold, src_mask, tgt_mask)
    return EvalMetrics(loss=sums, attention=stats, coverage=coverage, align=align)


@jax.jit
def all_finite(tree) -> jax.Array:
    """True iff every float leaf of ``tree`` is finite (checked before each checkpoint is written)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)
