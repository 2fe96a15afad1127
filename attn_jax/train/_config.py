"""Training configs: the schema (:func:`default_config`), loading ``configs/*.py``, command-line overrides,
validation, and the typed objects the trainer builds from a config.

A config file defines ``get_config(arg=None) -> ml_collections.ConfigDict`` (the Flax examples' convention) and
starts from :func:`default_config`, so every config has exactly the schema's keys. ``path.py:arg`` passes
``arg`` to ``get_config`` (e.g. ``configs/rnnsearch_cpu.py:smoke``). Overrides ``model.hidden=256`` are parsed
with the type of the field they replace; an unknown key, a value of the wrong type or an impossible value is
a :class:`ConfigError` with a one-line message.

Each key is explained where it is defined: by the comment above it in :func:`default_config`, or for the
``model.*`` and ``optimizer.*`` keys by the ``Attributes:`` section of the config class.
:func:`config_help` reads those lines for ``attn-jax train --help-config`` and the docs' config page.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import math
import os
from collections.abc import Iterable
from typing import Any

import ml_collections

from attn_jax.data import AttnJaxSynthetic, BatchConfig, SyntheticSpec
from attn_jax.models import GNMTConfig, ModelConfig, RNNConfig, TransformerConfig
from attn_jax.parallel import STRATEGIES, UnknownStrategyError, rules_for
from attn_jax.train._optim import OptimizerConfig

__all__ = [
    "BEST_METRICS",
    "ConfigError",
    "apply_overrides",
    "batch_configs",
    "check_config",
    "default_config",
    "flatten_config",
    "has_eval_split",
    "load_config",
    "model_defaults",
    "model_config",
    "optimizer_config",
    "parallel_axes",
    "smoke_config",
    "synthetic_spec",
]

CORPORA = ("synthetic", "tfds", "plain", "tsv")
VOCABULARIES = ("word", "sentencepiece")
SENTENCEPIECE_TYPES = ("unigram", "bpe")
_MODEL_EXCLUDED = ("src_vocab", "tgt_vocab", "param_dtype", "dtype")
# model.arch -> the config class whose fields are the other model.* keys.
MODEL_CLASSES: dict[str, type] = {
    "rnnsearch": RNNConfig,
    "rnnenc": RNNConfig,
    "gnmt": GNMTConfig,
    "transformer": TransformerConfig,
}
# The built-in corpus' named configs (the TFDS builder's), so that generating in memory gives the TFDS pairs.
_SYNTHETIC_NAMED = {c.name: c.spec for c in AttnJaxSynthetic.BUILDER_CONFIGS}


class ConfigError(ValueError):
    """A config cannot be loaded, overridden or used; the message is one line and names the key or file."""


def model_class(arch: str) -> type:
    """The config class ``model.arch`` names: one of :data:`MODEL_CLASSES`, or a user's ``"module:Class"``.

    A user's class (bring your own model; ``examples/own_model.py``) is a frozen dataclass with ``src_vocab`` and
    ``tgt_vocab`` fields, every other field with a default, and a ``build(*, rngs)`` method returning an NNX module
    with the decoding-step interface (:class:`attn_jax.models.Seq2SeqModel`). ``module`` must be importable
    (installed, or on ``sys.path``); it is imported here, by name, because no import in this package can know it.

    >>> model_class("gnmt").__name__
    'GNMTConfig'
    """
    if not isinstance(arch, str):
        raise ConfigError(f"model.arch must be a string, got {arch!r}")
    if arch in MODEL_CLASSES:
        return MODEL_CLASSES[arch]
    if ":" not in arch:
        raise ConfigError(
            f"model.arch must be one of {', '.join(MODEL_CLASSES)} or 'module:Class' (your own model); got {arch!r}"
        )
    module_name, _, qualname = arch.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"model.arch={arch!r}: cannot import module {module_name!r} ({e})") from None
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigError(f"model.arch={arch!r}: module {module_name!r} has no {qualname!r}")
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        problem = "is not a dataclass"
    elif not {"src_vocab", "tgt_vocab"} <= {f.name for f in dataclasses.fields(obj)}:
        problem = "lacks the fields src_vocab and tgt_vocab"
    elif not callable(getattr(obj, "build", None)):
        problem = "has no build(*, rngs) method"
    else:
        return obj
    raise ConfigError(f"model.arch={arch!r}: {qualname} {problem} (see attn_jax.train.model_class)")


def model_defaults(arch: str) -> ml_collections.ConfigDict:
    """The ``model`` group for ``arch``: ``arch`` plus the fields of its config class, with their defaults.

    >>> sorted(model_defaults("gnmt"))[:3]
    ['align', 'arch', 'attention']
    """
    cls = model_class(arch)
    fields = {}
    for f in dataclasses.fields(cls):
        if f.name in _MODEL_EXCLUDED or f.name == "arch":
            continue
        if f.default is dataclasses.MISSING:
            raise ConfigError(f"model.arch={arch!r}: field {f.name!r} of {cls.__name__} needs a default")
        fields[f.name] = f.default
    fields["arch"] = arch
    return ml_collections.ConfigDict(fields)


def default_config(arch: str = "rnnsearch") -> ml_collections.ConfigDict:
    """The full schema with defaults (the paper's RNNsearch sizes and optimiser, on the built-in corpus); the
    ``model`` group holds the fields of ``arch`` (:func:`model_defaults`).

    >>> default_config().optimizer.rho
    0.95
    >>> default_config("gnmt").model.encoder_layers
    8
    """
    c = ml_collections.ConfigDict()
    # Seeds parameter initialisation, shuffling and the run's PRNG key; an int in [0, 2**63 - 1].
    c.seed = 0
    # Training length in updates (optimiser steps).
    c.num_train_steps = 1000
    # Log the training metrics every N updates.
    c.log_every = 50
    # Validate every N updates, and after the last one.
    c.eval_every = 500
    # Save a checkpoint every N updates, and after the last one.
    c.checkpoint_every = 500
    # Keep the last K checkpoints; older ones are deleted.
    c.keep_checkpoints = 3
    # Also keep the best checkpoint by checkpoint.best_metric.
    c.keep_best = True
    # Write checkpoints in the background (orbax's async saving) while training goes on.
    c.async_checkpoints = True
    # Write TensorBoard event files beside metrics.jsonl.
    c.tensorboard = True
    # (a, b): write a jax.profiler trace of updates a+1..b to <workdir>/tensorboard; (0, 0): no trace.
    c.profile_steps = (0, 0)
    # Label smoothing ε of the training loss; 0: plain cross-entropy.
    c.label_smoothing = 0.0
    # Weight λ of the coverage loss Σ_j min(α_tj, c_tj) (See et al. 2017); needs model.coverage.
    c.lambda_coverage = 0.0
    # Add the coverage loss to training only after this many updates; validation always includes it.
    c.coverage_start_step = 0
    # Weight of the guided-alignment loss (alignment_loss) toward gold word alignments; 0: off.
    c.lambda_align = 0.0
    # Compute in bfloat16; parameters and optimiser state stay float32.
    c.mixed_precision = False
    # The model: rnnsearch, rnnenc, gnmt, transformer or module:Class; its fields are the model.* keys.
    c.model = model_defaults(arch)
    # The optimiser: the fields of OptimizerConfig (default: the paper's Adadelta).
    c.optimizer = ml_collections.ConfigDict(dataclasses.asdict(OptimizerConfig()))
    spec = _SYNTHETIC_NAMED["small"]
    c.data = ml_collections.ConfigDict(
        dict(
            # The corpus: synthetic (built in), tfds, plain (one file per side) or tsv.
            corpus="synthetic",
            # Size of the built-in corpus: tiny, small, default, or custom (data.synthetic_spec).
            synthetic="small",
            # Read the built-in corpus from its TFDS build instead of generating the same pairs in memory.
            use_tfds=False,
            # The generator's settings when data.synthetic=custom.
            synthetic_spec=dict(
                # Training pairs generated.
                train_size=spec.train_size,
                # Validation pairs generated.
                validation_size=spec.validation_size,
                # Test pairs generated per length bucket.
                test_per_bucket=spec.test_per_bucket,
                # The generator's seed.
                seed=spec.seed,
                # Shortest generated sentence, in words.
                min_length=spec.min_length,
                # Longest generated sentence, in words.
                max_length=spec.max_length,
            ),
            # TFDS dataset name (data.corpus=tfds), e.g. wmt14_translate/fr-en.
            tfds_name="",
            # The TFDS feature holding the source sentence.
            source_key="",
            # The TFDS feature holding the target sentence.
            target_key="",
            # TFDS data directory; empty: TFDS's default.
            data_dir="",
            # Source text file, one sentence a line (data.corpus=plain); {split} stands for the split name.
            source_path="",
            # Target text file, line-aligned with the source; {split} stands for the split name.
            target_path="",
            # A tab-separated file of source and target (data.corpus=tsv); {split} stands for the split name.
            tsv_path="",
            # Gold word alignments in Pharaoh format (i-j ...), one line per pair (plain or tsv only).
            alignment_path="",
            # The split to train on.
            train_split="train",
            # The validation split (a file corpus also tries valid and dev); none or empty: no validation.
            eval_split="validation",
            # Keep at most this many training pairs; 0: all.
            max_train_examples=0,
            # Keep at most this many validation pairs; 0: all.
            max_eval_examples=0,
            # Vocabulary: word (the paper's word shortlists) or sentencepiece (subwords learnt per language).
            vocab="word",
            # SentencePiece model type with data.vocab=sentencepiece: unigram or bpe.
            sentencepiece_type="unigram",
            # One vocabulary learnt over both languages (src_vocab_size of them; tgt_vocab_size must match).
            joint_vocab=False,
            # Source vocabulary: K words or pieces, plus four specials (SentencePiece may give fewer).
            src_vocab_size=30000,
            # Target vocabulary: K words or pieces, plus four specials (SentencePiece may give fewer).
            tgt_vocab_size=30000,
            # Drop pairs whose source is longer (words, or pieces with sentencepiece); the drops are counted.
            max_source_length=50,
            # Drop pairs whose target is longer (words, or pieces with sentencepiece); the drops are counted.
            max_target_length=50,
            # Training pairs per batch.
            batch_size=80,
            # Token budget of a training batch: rows × padded length <= N in every bucket; 0: batch_size pairs.
            batch_tokens=0,
            # Validation pairs per batch.
            eval_batch_size=80,
            # Padded lengths of the length buckets; a batch is drawn from one bucket.
            bucket_boundaries=(16, 24, 32, 48, 64, 96, 128),
            # Batches prepared ahead of the training step.
            prefetch=2,
            # Pack several training pairs into each row, with no attention across pairs (transformer only).
            pack=False,
            # Train from token arrays prepared on disk: "" reads the text into memory; auto: <workdir>/prepared.
            prepared_dir="",
            # Without prepared_dir: prepare a plain or tsv training file of more lines in <workdir>/prepared; 0: never.
            prepare_above=200_000,
        )
    )
    c.checkpoint = ml_collections.ConfigDict()
    # The validation metric that picks the best checkpoint: nll (lower is better), bleu or chrf (higher).
    c.checkpoint.best_metric = "nll"
    c.early_stopping = ml_collections.ConfigDict()
    # Stop after this many validations without improvement of checkpoint.best_metric; 0: never stop early.
    c.early_stopping.patience = 0
    # An improvement must beat the best value so far by more than this (in the metric's own units).
    c.early_stopping.min_delta = 0.0
    c.validation = ml_collections.ConfigDict()
    # Translate the validation split at every validation and score it with sacreBLEU's BLEU and chrF.
    c.validation.bleu = False
    # Beam size of that translation; 1 is greedy decoding.
    c.validation.beam_size = 1
    # GNMT length normalisation α of the beam's scores (attn-jax evaluate --alpha); greedy ignores it.
    c.validation.alpha = 0.6
    # GNMT coverage penalty β (attn-jax evaluate --beta); greedy ignores it; needs attention.
    c.validation.beta = 0.0
    # Sentences per decoding batch; 0: data.eval_batch_size.
    c.validation.batch_size = 0
    # Length limit max(data.max_target_length, ⌊ratio · n⌋ + offset) tokens for n source tokens: the ratio.
    c.validation.max_length_ratio = 2.0
    # The offset of that length limit (attn-jax evaluate --max-length-offset).
    c.validation.max_length_offset = 10
    # sacreBLEU tokeniser (13a, none, intl, ...); "": 13a, with a warning when references look tokenised.
    c.validation.bleu_tokenize = ""
    # Detokenise hypotheses and references before scoring: none or moses (attn-jax evaluate --detokenize).
    c.validation.detokenize = "none"
    # The Moses language of the detokeniser (en, fr, de, ...).
    c.validation.detokenize_lang = "en"
    c.debug = ml_collections.ConfigDict(
        dict(
            # Make the parameters NaN just before update k, to test the divergence guard; -1: off.
            inject_nan_at_step=-1,
        )
    )
    c.parallel = ml_collections.ConfigDict(
        dict(
            # none (one device), or a +-join of data, fsdp, tensor and pipeline over a data × model × stage mesh
            # (fsdp: the batch and the parameters split over data; docs/scaling.md).
            strategy="none",
            # Size of the mesh's data axis; 0: the devices the other axes leave (1 if unused).
            data=0,
            # Size of the mesh's model (tensor) axis; 0: the devices the other axes leave (1 if unused).
            model=0,
            # Size of the mesh's stage (pipeline) axis: model.pipeline_stages, or 0 to take it from there.
            stage=0,
            # A parameter dim that does not divide by its mesh axes is an error instead of replicated.
            strict_sharding=False,
        )
    )
    return c


def flatten_config(config: ml_collections.ConfigDict | dict, prefix: str = "") -> dict[str, Any]:
    """``{"model.hidden": 1000, ...}``: every leaf under its dotted key."""
    out = {}
    for key, value in config.items():
        if isinstance(value, (ml_collections.ConfigDict, dict)):
            out.update(flatten_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _suggest(key: str, keys: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(keys), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _message(error: Exception) -> str:
    """An exception's text on one line, unwrapped (ml_collections raises ``AttributeError(KeyError(text))``,
    whose ``str`` is a repr with literal ``\\n``)."""
    arg = error.args[0] if len(error.args) == 1 else None
    while isinstance(arg, BaseException) and len(arg.args) == 1:
        arg = arg.args[0]
    return " ".join((arg if isinstance(arg, str) else str(error)).split())


def load_config(spec: str) -> ml_collections.ConfigDict:
    """Load ``path.py`` or ``path.py:arg`` by calling its ``get_config()`` / ``get_config(arg)``.

    Raises:
      ConfigError: missing file, no ``get_config``, an error raised by it, or a result that is not a config
        with the schema's keys.
    """
    path, arg = spec, None
    if not os.path.isfile(path) and ":" in spec:
        path, arg = spec.rsplit(":", 1)
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such config file")
    module_spec = importlib.util.spec_from_file_location(f"_attn_jax_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # a config file is user code: report its error on one line
        raise ConfigError(f"{path}: cannot load: {type(e).__name__}: {e}") from None
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise ConfigError(f"{path}: defines no get_config()")
    try:
        config = get_config() if arg is None else get_config(arg)
    except (ValueError, TypeError, KeyError) as e:  # how a config says "no such variant"
        raise ConfigError(f"{spec}: {_message(e)}") from None
    except Exception as e:  # a config file is user code: any other error it raises is still a config error
        raise ConfigError(f"{spec}: get_config raised {type(e).__name__}: {_message(e)}") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(
            f"{spec}: get_config() returned {type(config).__name__}, not an ml_collections.ConfigDict"
        )
    _check_keys(config, source=spec)
    return config


def _schema(config: ml_collections.ConfigDict, source: str) -> ml_collections.ConfigDict:
    """The defaults of ``config``'s architecture (``model.arch``), i.e. the keys it must have."""
    arch = config.get("model", {}).get("arch", "rnnsearch")
    try:
        model_class(arch)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return default_config(arch)


def _check_keys(config: ml_collections.ConfigDict, source: str) -> None:
    schema, keys = flatten_config(_schema(config, source)), flatten_config(config)
    for key in keys:
        if key not in schema:
            raise ConfigError(f"{source}: unknown config key {key!r}{_suggest(key, schema)}")
    missing = [k for k in schema if k not in keys]
    if missing:
        raise ConfigError(f"{source}: config lacks key(s) {', '.join(missing)} (start from default_config())")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _parse_value(text: str, old: Any) -> Any:
    """``text`` as a value of ``old``'s type (int, float, bool, str or a tuple of such)."""
    if isinstance(old, bool):
        return _parse_bool(text)
    if isinstance(old, int):
        return int(text.strip())
    if isinstance(old, float):
        return float(text.strip())
    if isinstance(old, str):
        return text
    if isinstance(old, (tuple, list)):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = tuple(t for t in text.split(",") if t.strip())
        if not isinstance(value, (tuple, list)):
            value = (value,)
        kind = type(old[0]) if len(old) else None
        if kind is not None:
            value = tuple(_parse_value(str(v), kind()) if not isinstance(v, kind) else v for v in value)
        return tuple(value)
    raise ValueError(f"cannot set a field of type {type(old).__name__} from the command line")


def apply_overrides(config: ml_collections.ConfigDict, overrides: Iterable[str]) -> ml_collections.ConfigDict:
    """Apply ``key=value`` overrides (dotted keys, e.g. ``model.hidden=256``) to a copy of ``config``.

    >>> apply_overrides(default_config(), ["model.hidden=256", "data.bucket_boundaries=16,32"]).model.hidden
    256

    Raises:
      ConfigError: an unknown key (with a suggestion), a group instead of a field, or a value that does not
        parse as the field's type.
    """
    config = ml_collections.ConfigDict(config.to_dict())
    keys = flatten_config(config)
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if key.startswith("config."):
            key = key[len("config.") :]
        if not sep:
            raise ConfigError(f"override {item!r} must look like key=value")
        if key not in keys:
            groups = {k.rsplit(".", i)[0] for k in keys for i in range(1, k.count(".") + 1)}
            if key in groups:
                raise ConfigError(f"config key {key!r} is a group; set its fields, e.g. {key}.<field>=...")
            raise ConfigError(f"unknown config key {key!r}{_suggest(key, keys)}")
        old = keys[key]
        try:
            value = _parse_value(text, old)
        except ValueError as e:
            raise ConfigError(
                f"config key {key!r}: cannot parse {text!r} as {type(old).__name__} ({e})"
            ) from None
        *parents, leaf = key.split(".")
        node = config
        for p in parents:
            node = node[p]
        node[leaf] = value
        keys[key] = value
    return config


# ------------------------------------------------------------------------------------------------------------
# From a config to the typed objects the trainer uses.


def synthetic_spec(data: ml_collections.ConfigDict) -> SyntheticSpec:
    """The :class:`SyntheticSpec` ``data.synthetic`` names (``custom``: ``data.synthetic_spec``)."""
    if data.synthetic in _SYNTHETIC_NAMED:
        return _SYNTHETIC_NAMED[data.synthetic]
    if data.synthetic != "custom":
        raise ConfigError(
            f"data.synthetic must be one of {', '.join(_SYNTHETIC_NAMED)} or custom; got {data.synthetic!r}"
        )
    s = data.synthetic_spec
    try:
        return SyntheticSpec(
            train_size=s.train_size,
            validation_size=s.validation_size,
            test_per_bucket=s.test_per_bucket,
            seed=s.seed,
            min_length=s.min_length,
            max_length=s.max_length,
        )
    except ValueError as e:
        raise ConfigError(f"data.synthetic_spec: {e}") from None


def has_eval_split(data: ml_collections.ConfigDict) -> bool:
    """Whether ``data.eval_split`` names a validation split; ``none`` (any case) or ``""`` trains without one.

    >>> has_eval_split(apply_overrides(default_config(), ["data.eval_split=none"]).data)
    False
    """
    return data.eval_split.strip().lower() not in ("", "none")


def model_config(config: ml_collections.ConfigDict, src_vocab: int, tgt_vocab: int) -> ModelConfig:
    """The model's config object (``model.arch``'s class): ``config.model`` plus vocabulary sizes and the
    mixed-precision dtype."""
    fields = config.model.to_dict()
    cls = model_class(fields.get("arch"))
    names = {f.name for f in dataclasses.fields(cls)}
    if "arch" not in names:
        fields.pop("arch")
    dtypes = dict(param_dtype="float32", dtype="bfloat16" if config.mixed_precision else "float32")
    if config.mixed_precision and "dtype" not in names:
        raise ConfigError(
            f"mixed_precision needs a dtype field in {cls.__name__} (model.arch={config.model.arch!r})"
        )
    try:
        return cls(
            src_vocab=src_vocab,
            tgt_vocab=tgt_vocab,
            **{k: v for k, v in dtypes.items() if k in names},
            **fields,
        )
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from None


def optimizer_config(config: ml_collections.ConfigDict) -> OptimizerConfig:
    """The :class:`OptimizerConfig` of ``config.optimizer``."""
    try:
        return OptimizerConfig(**config.optimizer.to_dict())
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from None


def batch_configs(config: ml_collections.ConfigDict, data_axis: int = 1) -> tuple[BatchConfig, BatchConfig]:
    """``(train, eval)`` batching: shuffled endless training batches; every validation pair once, in order.

    Training batches hold ``data.batch_size`` pairs, or with ``data.batch_tokens`` as many rows as the budget
    holds in each bucket, rounded down to a multiple of ``data_axis`` (the mesh's data axis). Validation
    batches always hold ``data.eval_batch_size`` pairs: one fixed set of shapes, compiled once.
    """
    d = config.data
    common = dict(
        bucket_boundaries=tuple(d.bucket_boundaries),
        max_source_length=d.max_source_length,
        max_target_length=d.max_target_length,
    )
    tokens = d.get("batch_tokens", 0)  # a run saved before the key existed has none
    # The sentence schedule keeps batch_multiple=1, so its fingerprint does not depend on the mesh.
    size = dict(batch_size=None, tokens_per_batch=tokens, batch_multiple=data_axis) if tokens else {}
    try:
        train = BatchConfig(
            **{"batch_size": d.batch_size, **size},
            shuffle=True,
            seed=config.seed,
            drop_remainder=True,
            **common,
        )
        evaluation = BatchConfig(
            batch_size=d.eval_batch_size, shuffle=False, num_epochs=1, drop_remainder=False, **common
        )
    except ValueError as e:
        raise ConfigError(f"data: {e}") from None
    return train, evaluation


def _positive(config: ml_collections.ConfigDict, *keys: str) -> None:
    flat = flatten_config(config)
    for key in keys:
        value = flat[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key} must be a positive int, got {value!r}")


def _same_kind(value: Any, old: Any) -> bool:
    """Whether ``value`` may stand where the schema has ``old`` (an int may stand for a float, not a bool)."""
    if isinstance(old, bool):
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if isinstance(old, float):
        return isinstance(value, (int, float))
    if isinstance(old, (tuple, list)):
        return isinstance(value, (tuple, list))
    return isinstance(value, type(old))


def check_config(config: ml_collections.ConfigDict) -> None:
    """Validate every field (keys, types, values) without loading data; raises :class:`ConfigError`."""
    _check_keys(config, source="config")
    schema = flatten_config(_schema(config, "config"))
    for key, value in flatten_config(config).items():
        if not _same_kind(value, schema[key]):
            raise ConfigError(f"config key {key!r} must be {type(schema[key]).__name__}, got {value!r}")
    _positive(
        config,
        "num_train_steps",
        "log_every",
        "eval_every",
        "checkpoint_every",
        "keep_checkpoints",
        "data.max_source_length",
        "data.max_target_length",
        "data.eval_batch_size",  # batch_configs' message would say batch_size=0 (BatchConfig's own field)
        "data.src_vocab_size",
        "data.tgt_vocab_size",
    )
    _check_training(config)
    _check_alignment(config)
    _check_data(config)
    batch_configs(config)
    optimizer_config(config)
    if config.optimizer.accumulate > 1 and config.lambda_align > 0:
        raise ConfigError(
            f"optimizer.accumulate={config.optimizer.accumulate} cannot be used with lambda_align > 0 (the "
            "guided-alignment loss has its own normaliser, summed over micro-batches it is not exact)"
        )
    model_config(config, src_vocab=8, tgt_vocab=8)
    _check_parallel(config)
    _check_validation(config)


def _check_training(config: ml_collections.ConfigDict) -> None:
    """The seed, label smoothing and the coverage loss's weight and start."""
    if not 0 <= config.seed < 2**63:  # NumPy's SeedSequence refuses negative seeds, JAX's key needs an int64
        raise ConfigError(f"seed must be an int in [0, 2**63 - 1], got {config.seed}")
    if not 0.0 <= config.label_smoothing < 1.0:
        raise ConfigError(f"label_smoothing must be in [0, 1), got {config.label_smoothing}")
    if not (config.lambda_coverage >= 0.0 and math.isfinite(config.lambda_coverage)):
        raise ConfigError(f"lambda_coverage must be a finite number >= 0, got {config.lambda_coverage}")
    if config.lambda_coverage > 0 and not config.model.get("coverage", False):
        raise ConfigError(
            f"lambda_coverage={config.lambda_coverage} needs model.coverage=True (the coverage loss trains the "
            "coverage model; OpenNMT-py's lambda_coverage likewise needs coverage_attn)"
        )
    profile = tuple(config.profile_steps)
    if profile != (0, 0) and not (
        len(profile) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in profile)
        and 0 <= profile[0] < profile[1]
    ):
        raise ConfigError(
            f"profile_steps must be two ints a < b (trace updates a+1..b) or 0,0, got {profile}"
        )
    start = config.get("coverage_start_step", 0)
    if not isinstance(start, int) or start < 0:
        raise ConfigError(f"coverage_start_step must be an int >= 0, got {start!r}")
    if start > 0 and config.lambda_coverage == 0:
        raise ConfigError(
            f"coverage_start_step={start} needs lambda_coverage > 0 (it says when the coverage loss starts)"
        )
    if start >= config.num_train_steps > 0:
        raise ConfigError(
            f"coverage_start_step={start} is not below num_train_steps={config.num_train_steps}: "
            "the coverage loss would never be trained"
        )


def _check_data(config: ml_collections.ConfigDict) -> None:
    """``data.*``: the corpus and its paths, the vocabulary, copying, prepared corpora and packing."""
    d = config.data
    if config.model.get("copy", False):
        # Subword vocabularies leave no word outside the target vocabulary to copy, and source pieces are not
        # target pieces; the smoothed loss' uniform part would spread mass over the per-sentence extended ids,
        # most of which no sentence has (log-probability finfo.min).
        if d.vocab != "word":
            raise ConfigError(
                f"model.copy copies words outside the target vocabulary: needs data.vocab=word, got {d.vocab!r}"
            )
        if config.label_smoothing > 0:
            raise ConfigError(
                f"model.copy needs label_smoothing=0 (got {config.label_smoothing}): smoothing over the extended vocabulary is not defined here"
            )
    if d.corpus not in CORPORA:
        raise ConfigError(f"data.corpus must be one of {', '.join(CORPORA)}; got {d.corpus!r}")
    if d.corpus == "synthetic":
        synthetic_spec(d)
        if d.use_tfds and d.synthetic == "custom":
            raise ConfigError(
                "data.use_tfds needs a named built-in corpus (tiny, small, default), not custom"
            )
    if d.corpus == "tfds" and not d.tfds_name:
        raise ConfigError("data.corpus='tfds' needs data.tfds_name, e.g. wmt14_translate/fr-en")
    if d.corpus == "plain" and not (d.source_path and d.target_path):
        raise ConfigError("data.corpus='plain' needs data.source_path and data.target_path")
    if d.corpus == "tsv" and not d.tsv_path:
        raise ConfigError("data.corpus='tsv' needs data.tsv_path")
    if d.vocab not in VOCABULARIES:
        raise ConfigError(f"data.vocab must be one of {', '.join(VOCABULARIES)}; got {d.vocab!r}")
    if d.sentencepiece_type not in SENTENCEPIECE_TYPES:
        raise ConfigError(
            f"data.sentencepiece_type must be one of {', '.join(SENTENCEPIECE_TYPES)}; got {d.sentencepiece_type!r}"
        )
    for key in ("max_train_examples", "max_eval_examples", "prefetch", "batch_tokens", "prepare_above"):
        if d[key] < 0:
            raise ConfigError(f"data.{key} must be >= 0, got {d[key]}")
    _check_joint_vocab(config)
    if d.get("prepared_dir", ""):
        if d.corpus not in ("plain", "tsv"):
            raise ConfigError(
                f"data.prepared_dir={d.prepared_dir!r} needs a plain or tsv corpus, not data.corpus={d.corpus!r} "
                "(the built-in and TFDS corpora are read as they are)"
            )
        for key, on in (
            ("data.alignment_path", bool(d.alignment_path)),
            ("model.copy", config.model.get("copy", False)),
        ):
            if on:
                raise ConfigError(f"data.prepared_dir keeps token ids only: set it to '' to train with {key}")
    if d.pack and config.model.arch != "transformer":
        raise ConfigError(
            f"data.pack=True needs model.arch=transformer (the only model that reads segment ids); got "
            f"model.arch={config.model.arch!r}"
        )


# checkpoint.best_metric -> (the validation record's key, whether higher is better).
BEST_METRICS = {"nll": ("nll_per_token", False), "bleu": ("bleu", True), "chrf": ("chrf", True)}


def _check_validation(config: ml_collections.ConfigDict) -> None:
    """``validation.*``, ``checkpoint.best_metric`` and ``early_stopping.*``: values in range, and a validation
    split (and translation) for whatever needs one."""
    v, best, es = config.validation, config.checkpoint.best_metric, config.early_stopping
    if best not in BEST_METRICS:
        raise ConfigError(f"checkpoint.best_metric must be one of {', '.join(BEST_METRICS)}; got {best!r}")
    if es.patience < 0:
        raise ConfigError(f"early_stopping.patience must be >= 0 (0: off), got {es.patience}")
    if not (math.isfinite(es.min_delta) and es.min_delta >= 0):
        raise ConfigError(f"early_stopping.min_delta must be a finite number >= 0, got {es.min_delta}")
    validates = has_eval_split(config.data)
    for key, on in (("validation.bleu", v.bleu), ("early_stopping.patience", es.patience > 0)):
        if on and not validates:
            raise ConfigError(
                f"{key} needs a validation split, but data.eval_split={config.data.eval_split!r}"
            )
    if best != "nll" and not v.bleu:
        raise ConfigError(f"checkpoint.best_metric={best!r} needs validation.bleu=True (it is scored there)")
    if v.beam_size < 1:
        raise ConfigError(f"validation.beam_size must be >= 1 (1: greedy), got {v.beam_size}")
    for key in ("alpha", "beta", "max_length_ratio"):
        if not (math.isfinite(v[key]) and v[key] >= 0):
            raise ConfigError(f"validation.{key} must be a finite number >= 0, got {v[key]}")
    for key in ("batch_size", "max_length_offset"):
        if v[key] < 0:
            raise ConfigError(f"validation.{key} must be >= 0, got {v[key]}")
    if v.max_length_ratio == 0 and v.max_length_offset == 0 and not config.data.max_target_length:
        raise ConfigError("validation.max_length_ratio=0 with validation.max_length_offset=0 leaves no room")
    if v.beta > 0 and config.model.arch == "rnnenc":
        raise ConfigError(f"validation.beta={v.beta} needs attention, which model.arch='rnnenc' has not")
    from attn_jax.eval import DETOKENIZERS

    if v.detokenize not in DETOKENIZERS:
        raise ConfigError(
            f"validation.detokenize must be one of {', '.join(DETOKENIZERS)}; got {v.detokenize!r}"
        )
    lang = v.detokenize_lang
    if not (lang.isascii() and lang.isalpha() and lang.islower() and 2 <= len(lang) <= 3):
        raise ConfigError(
            f"validation.detokenize_lang must be a Moses language code such as en or de, got {lang!r}"
        )
    if v.bleu_tokenize and v.bleu:
        from sacrebleu.metrics import BLEU

        if v.bleu_tokenize not in BLEU.TOKENIZERS:
            raise ConfigError(
                f'validation.bleu_tokenize must be a sacreBLEU tokeniser ({", ".join(BLEU.TOKENIZERS)}) or "", '
                f"got {v.bleu_tokenize!r}"
            )


def _check_joint_vocab(config: ml_collections.ConfigDict) -> None:
    """``data.joint_vocab``: one size for the one vocabulary; ``share_embeddings=all`` needs it."""
    d = config.data
    if d.joint_vocab and d.src_vocab_size != d.tgt_vocab_size:
        raise ConfigError(
            f"data.joint_vocab=True learns one vocabulary of data.src_vocab_size={d.src_vocab_size} entries, but "
            f"data.tgt_vocab_size={d.tgt_vocab_size}; set them equal"
        )
    if config.model.get("share_embeddings") == "all" and not d.joint_vocab:
        raise ConfigError(
            "model.share_embeddings=all ties the source and target embeddings, so it needs one joint "
            "vocabulary: set data.joint_vocab=True"
        )


def _check_alignment(config: ml_collections.ConfigDict) -> None:
    """``lambda_align`` and ``data.alignment_path``: a weight >= 0, gold it can use, a model with attention."""
    lam, d = config.lambda_align, config.data
    if not (math.isfinite(lam) and lam >= 0.0):
        raise ConfigError(f"lambda_align must be a finite number >= 0, got {lam}")
    if d.alignment_path:
        if d.corpus not in ("plain", "tsv"):
            raise ConfigError(
                f"data.alignment_path is for a plain or tsv corpus, not data.corpus={d.corpus!r}"
                + (" (the built-in corpus has its own gold alignments)" if d.corpus == "synthetic" else "")
            )
        text = [d.source_path, d.target_path] if d.corpus == "plain" else [d.tsv_path]
        if any("{split}" in p for p in text) and "{split}" not in d.alignment_path:
            raise ConfigError(
                f"data.alignment_path={d.alignment_path!r} needs {{split}} like the corpus paths, "
                "one Pharaoh file per split"
            )
    if lam == 0.0:
        return
    if d.corpus in ("plain", "tsv") and not d.alignment_path:
        raise ConfigError(
            f"lambda_align={lam} needs gold alignments: set data.alignment_path to a Pharaoh file per {{split}}"
        )
    if d.vocab != "word":
        raise ConfigError(
            f"lambda_align={lam} needs data.vocab='word': gold alignments link words, not {d.vocab} pieces"
        )
    if config.model.arch == "rnnenc":
        raise ConfigError(f"lambda_align={lam}: model.arch='rnnenc' has no attention to guide")
    if d.pack:
        raise ConfigError(f"lambda_align={lam} needs data.pack=False: packed rows carry no gold alignments")


# parallel.strategy part -> the mesh axis it splits over.
_STRATEGY_AXES = {"data": "data", "fsdp": "data", "tensor": "model", "pipeline": "stage"}
MESH_KEYS = ("data", "model", "stage")


def parallel_axes(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The mesh axes ``parallel.strategy`` splits over (``()`` for ``none``)."""
    strategy = config.parallel.strategy
    return () if strategy == "none" else tuple(_STRATEGY_AXES[part] for part in strategy.split("+"))


def _check_parallel(config: ml_collections.ConfigDict) -> None:
    p = config.parallel
    if p.strategy != "none":
        try:
            rules_for(p.strategy)
        except UnknownStrategyError:
            raise ConfigError(
                f"parallel.strategy must be none or one of {', '.join(STRATEGIES)} (or another '+'-join of "
                f"{', '.join(_STRATEGY_AXES)}); got {p.strategy!r}"
            ) from None
        except ValueError as error:  # known parts that do not combine; the reason names them
            raise ConfigError(f"parallel.strategy={error}") from None
    for axis in MESH_KEYS:
        if p[axis] < 0:
            raise ConfigError(
                f"parallel.{axis} must be >= 0 (0: inferred from the device count), got {p[axis]}"
            )
    used = parallel_axes(config)
    for axis in MESH_KEYS:
        if axis not in used and p[axis] > 1:
            raise ConfigError(
                f"parallel.{axis}={p[axis]} but parallel.strategy={p.strategy!r} does not split over the "
                f"{axis} axis"
            )
    stages = config.model.get("pipeline_stages")
    if "stage" in used:
        if stages is None:
            raise ConfigError(
                f"parallel.strategy={p.strategy!r} pipelines stacked layers, which model.arch="
                f"{config.model.arch!r} does not have (use model.arch=gnmt)"
            )
        if stages < 2:
            raise ConfigError(
                f"parallel.strategy={p.strategy!r} needs model.pipeline_stages >= 2 (it is {stages}); set it to "
                "the number of pipeline stages"
            )
        if p.stage not in (0, stages):
            raise ConfigError(
                f"parallel.stage={p.stage} differs from model.pipeline_stages={stages}; set them equal "
                "(parallel.stage=0 takes the model's)"
            )
    elif stages is not None and stages > 1:
        raise ConfigError(
            f"model.pipeline_stages={stages} needs a pipeline parallel.strategy (pipeline or data+pipeline); "
            f"got {p.strategy!r}"
        )
    inferred = [axis for axis in used if p[axis] == 0 and axis != "stage"]
    if len(inferred) > 1:
        raise ConfigError(
            f"parallel.{' and parallel.'.join(inferred)} are both 0 (inferred); give all but one of them"
        )
    if "data" in used and p.data > 0:
        # Token batches round their rows down to a multiple of the data axis (batch_configs).
        for key in ("eval_batch_size",) if config.data.batch_tokens else ("batch_size", "eval_batch_size"):
            if config.data[key] % p.data:
                raise ConfigError(
                    f"data.{key}={config.data[key]} must be a multiple of parallel.data={p.data}"
                )


def paper_config(arch: str, max_length: int) -> ml_collections.ConfigDict:
    """The settings Bahdanau et al. (2015) share across RNNencdec-30/50 and RNNsearch-30/50 (section 4, appendix B).

    Paper sizes (embedding 620, hidden 1000, maxout 500, alignment 1000), WMT'14 English→French through TFDS,
    30,000-word shortlists, pairs of at most ``max_length`` words, minibatches of 80, Adadelta (ρ 0.95, ε 1e-6)
    with gradient-norm clipping at 1. The four ``configs/rnn{enc,search}{30,50}.py`` presets differ only in
    ``arch`` and ``max_length``.
    """
    c = default_config()
    c.seed = 0
    c.num_train_steps = 300_000
    c.log_every = 100
    c.eval_every = 5_000
    c.checkpoint_every = 5_000
    c.keep_checkpoints = 3
    c.model.update(arch=arch, scorer="additive", embed=620, hidden=1000, maxout=500, align=1000)
    c.optimizer.update(name="adadelta", learning_rate=1.0, rho=0.95, eps=1e-6, clip_norm=1.0)
    c.data.update(corpus="tfds", tfds_name="wmt14_translate/fr-en", source_key="en", target_key="fr")
    c.data.update(train_split="train", eval_split="validation", src_vocab_size=30_000, tgt_vocab_size=30_000)
    c.data.update(
        max_source_length=max_length, max_target_length=max_length, batch_size=80, eval_batch_size=80
    )
    # Buckets up to the first one that holds max_length words plus </s>.
    bounds = (16, 24, 32, 48, 64, 96, 128)
    c.data.bucket_boundaries = bounds[: next(i for i, b in enumerate(bounds) if b >= max_length + 1) + 1]
    return c


def smoke_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config`` shrunk to a run of seconds on a CPU: the same architecture, scorer and optimiser, tiny sizes,
    30 updates on 300 short generated pairs of the built-in corpus (one batch shape), validation and checkpoints
    every 10 updates, no warm-up (a decay ends at the last step). Every config's ``get_config("smoke")``
    returns this.

    >>> smoke_config(default_config()).model.hidden
    24
    """
    c = ml_collections.ConfigDict(config.to_dict())
    c.num_train_steps, c.log_every, c.eval_every, c.checkpoint_every = 30, 5, 10, 10
    tiny = dict(
        embed=16, hidden=24, maxout=16, align=16, encoder_layers=3, decoder_layers=3, d_model=32, d_ff=64
    )
    c.model.update({k: v for k, v in tiny.items() if k in c.model})
    c.optimizer.update(warmup_steps=0)
    if c.optimizer.decay in ("cosine", "linear"):
        c.optimizer.decay_steps = c.num_train_steps
        c.optimizer.decay_start = min(c.optimizer.get("decay_start", 0), c.num_train_steps // 2)
    d = c.data
    d.update(
        corpus="synthetic", synthetic="custom", use_tfds=False, max_train_examples=0, max_eval_examples=0
    )
    d.synthetic_spec.update(
        train_size=300, validation_size=40, test_per_bucket=5, seed=0, min_length=3, max_length=8
    )
    d.update(
        max_source_length=14, max_target_length=14, batch_size=16, eval_batch_size=16, bucket_boundaries=(16,)
    )
    if d.get("batch_tokens", 0):
        d.batch_tokens = 16 * 16  # token batches stay token batches, of the sentence smoke's one shape
    return c
