"""Training: losses, optimisers, the train state and pure jitted steps, orbax checkpoints, metrics, the loop.

    from attn_jax.train import load_config, apply_overrides, train_and_evaluate
    config = apply_overrides(load_config("configs/rnnsearch_cpu.py:smoke"), ["model.hidden=64"])
    result = train_and_evaluate(config, "runs/smoke")            # or: attn-jax train --config ... --workdir ...

The step is the Flax examples' pure ``train_step(state, batch) -> (state, metrics)`` (bind the static
:class:`StepConfig` with ``functools.partial``), jitted with the state donated. ``attn_jax.train`` imports
models, data and optax/orbax/ml_collections; models never import it.
"""

from attn_jax._host_memory import HostAllocator, tune_host_allocator  # re-exported: the trainer's
from attn_jax.train._align import AlignmentSums, alignment_loss, alignment_loss_sums
from attn_jax.train._average import (
    Averaged,
    AverageError,
    average_checkpoints,
    check_average_output,
    kept_steps,
    last_steps,
    write_averaged_run,
)
from attn_jax.train._checkpoint import (
    BEST_METRIC,
    CheckpointManager,
    CheckpointSaveError,
    CheckpointUnreadable,
    Restored,
    load_checkpoint,
    metric_rank,
)
from attn_jax.train._config import (
    BEST_METRICS,
    ConfigError,
    apply_overrides,
    batch_configs,
    check_config,
    default_config,
    flatten_config,
    has_eval_split,
    load_config,
    model_class,
    model_config,
    model_defaults,
    optimizer_config,
    paper_config,
    smoke_config,
)
from attn_jax.train._config_help import config_help
from attn_jax.train._coverage import coverage_loss
from attn_jax.train._diagnostics import DIAG_BAND, AttentionStats, attention_stats, summarize_attention
from attn_jax.train._early_stopping import EarlyStopping, early_stopping_update
from attn_jax.train._inputs import (
    Inputs,
    SplitReport,
    data_state,
    describe_split,
    load_corpus,
    make_inputs,
    prepare_train_split,
    resolve_corpus_split,
    resolve_prepared_dir,
    restore_data_state,
)
from attn_jax.train._lock import RunLocked, lock_run
from attn_jax.train._loop import TrainingDiverged, TrainResult, WorkdirError, evaluate, train_and_evaluate
from attn_jax.train._loss import LossSums, loss_sums, sentence_losses, token_cross_entropy
from attn_jax.train._metrics import MetricsLogger, ProgressLine, format_duration, read_metrics
from attn_jax.train._optim import OptimizerConfig, ema_decay_at, make_optimizer, make_schedule
from attn_jax.train._sharded import (
    abstract_sharded_state,
    make_sharded_accumulation,
    make_sharded_train_step,
    model_param_shardings,
    shard_train_state,
    train_state_shardings,
)
from attn_jax.train._step import (
    EvalMetrics,
    GradSums,
    StepConfig,
    TrainMetrics,
    TrainState,
    accumulate_grads,
    accumulated_train_step,
    all_finite,
    apply_grad_sums,
    build_module,
    eval_step,
    init_params,
    init_train_state,
    param_count,
    train_step,
    zero_grad_sums,
)
from attn_jax.train._tensorboard import EventWriter
from attn_jax.train._validation import TranslationScores, TranslationValidator

__all__ = [
    "AverageError",
    "Averaged",
    "average_checkpoints",
    "check_average_output",
    "kept_steps",
    "last_steps",
    "write_averaged_run",
    "data_state",
    "restore_data_state",
    "abstract_sharded_state",
    "make_sharded_accumulation",
    "make_sharded_train_step",
    "model_param_shardings",
    "shard_train_state",
    "train_state_shardings",
    "BEST_METRIC",
    "BEST_METRICS",
    "DIAG_BAND",
    "AttentionStats",
    "CheckpointManager",
    "CheckpointSaveError",
    "CheckpointUnreadable",
    "ConfigError",
    "EarlyStopping",
    "EvalMetrics",
    "GradSums",
    "HostAllocator",
    "EventWriter",
    "Inputs",
    "LossSums",
    "AlignmentSums",
    "MetricsLogger",
    "OptimizerConfig",
    "ProgressLine",
    "Restored",
    "RunLocked",
    "SplitReport",
    "StepConfig",
    "TrainMetrics",
    "TrainResult",
    "TrainState",
    "TrainingDiverged",
    "WorkdirError",
    "accumulate_grads",
    "accumulated_train_step",
    "all_finite",
    "apply_grad_sums",
    "apply_overrides",
    "alignment_loss",
    "alignment_loss_sums",
    "attention_stats",
    "batch_configs",
    "build_module",
    "check_config",
    "config_help",
    "coverage_loss",
    "default_config",
    "describe_split",
    "early_stopping_update",
    "ema_decay_at",
    "eval_step",
    "evaluate",
    "flatten_config",
    "format_duration",
    "has_eval_split",
    "init_params",
    "init_train_state",
    "load_checkpoint",
    "load_config",
    "load_corpus",
    "lock_run",
    "loss_sums",
    "make_inputs",
    "make_optimizer",
    "make_schedule",
    "metric_rank",
    "model_config",
    "model_class",
    "model_defaults",
    "optimizer_config",
    "paper_config",
    "prepare_train_split",
    "param_count",
    "read_metrics",
    "resolve_corpus_split",
    "resolve_prepared_dir",
    "sentence_losses",
    "smoke_config",
    "summarize_attention",
    "token_cross_entropy",
    "train_and_evaluate",
    "train_step",
    "TranslationScores",
    "TranslationValidator",
    "tune_host_allocator",
    "zero_grad_sums",
]
