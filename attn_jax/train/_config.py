"""Training configs: the schema (:func:`default_config`), loading ``configs/*.py``, command-line overrides,
validation, and the typed objects the trainer builds from a config.

A config file defines ``get_config(arg=None) -> ml_collections.ConfigDict`` (the Flax examples' convention) and
starts from :func:`default_config`, so every config has exactly the schema's keys. ``path.py:arg`` passes
``arg`` to ``get_config`` (e.g. ``configs/rnnsearch_cpu.py:smoke``). Overrides ``model.hidden=256`` are parsed
with the type of the field they replace; an unknown key, a value of the wrong type or an impossible value is
a :class:`ConfigError` with a one-line message.

The schema (every field, with its default):

``seed`` (0) — parameter initialisation, shuffling and the run's PRNG key; an int in [0, 2**63 - 1].
``num_train_steps`` (1000), ``log_every`` (50), ``eval_every`` (500), ``checkpoint_every`` (500) — in updates;
evaluation and a checkpoint also happen at the last step.
``keep_checkpoints`` (3) — the last K checkpoints kept; ``keep_best`` (True) — also keep the best by validation
NLL per token; ``async_checkpoints`` (True) — orbax writes in the background.
``tensorboard`` (True) — TensorBoard event files beside ``metrics.jsonl``.
``label_smoothing`` (0.0) — ``ε`` of the training loss.
``lambda_coverage`` (0.0) — ``λ`` of the coverage loss ``Σ_j min(α_tj, c_tj)`` (See et al. 2017; OpenNMT-py's
``lambda_coverage``) added to the training loss and reported as ``coverage_loss``; needs ``model.coverage``.
``coverage_start_step`` (0) — the coverage loss joins the training updates only after this many updates (See et
al. 2017 train without it, then add it for a final phase; from the first update the demo's attention never
locks on: experiments/coverage/README.md); validation always includes it. Needs ``lambda_coverage`` > 0.
``lambda_align`` (0.0) — weight of the guided-alignment loss (Chen et al. 2016; Garg et al. 2019;
:mod:`attn_jax.train._align`): the cross-entropy between each aligned target word's gold links (normalised to
sum 1) and the attention weights the model returns (RNNsearch's attention, GNMT's, the Transformer's last
decoder layer averaged over heads), averaged over the target words with at least one link and added to the
per-token translation loss; 0: the term is not computed at all. Needs a model with attention, word-level
vocabularies and gold alignments for the training split: the built-in corpus' own, or ``data.alignment_path``.
``mixed_precision`` (False) — bfloat16 compute; parameters and optimiser state stay float32.
``model.arch`` picks the model and with it the other ``model.*`` keys: the fields of its config class except the
vocabulary sizes (taken from the built vocabularies) and the dtypes (``mixed_precision``). ``rnnsearch`` /
``rnnenc`` (:class:`attn_jax.models.RNNConfig`): ``embed``, ``hidden``, ``maxout``, ``align``, ``scorer``,
``input_feeding``, ``local_window``, ``intra_attention``, ``attention_init``, ``normalizer`` (``softmax``,
``sparsemax`` or ``entmax15``: what turns the attention scores into weights), ``coverage`` (False; RNNsearch with
an additive scorer: the accumulated attention feeds the scorer, Tu et al. 2016 / See et al. 2017), ``copy`` (False;
RNNsearch: the pointer-generator of See et al. 2017, eq. 8-9, copies source words outside the target vocabulary by
attention; needs ``data.vocab=word`` and ``label_smoothing=0``); ``gnmt`` (:class:`attn_jax.models.GNMTConfig`): ``embed``, ``hidden``,
``encoder_layers``, ``decoder_layers``, ``residual_start``, ``attention``, ``align``, ``pipeline_stages``;
``transformer`` (:class:`attn_jax.models.TransformerConfig`): ``d_model``, ``heads``, ``d_ff``, ``encoder_layers``,
``decoder_layers``, ``dropout``, ``norm``, ``positions``, ``max_length``, ``share_embeddings``.
``transformer`` also takes ``num_kv_heads`` (grouped-query attention; 0 = ``heads``), ``normalizer``
(``softmax``, ``sparsemax`` or ``entmax15``, in every attention of both stacks); ``positions`` is
``sinusoidal``, ``learned``, ``rope``, ``alibi`` (Press et al. 2022) or ``relative`` (Shaw et al. 2018, clipped at
``max_relative_positions``, default 16; softmax only). Your own model:
``model.arch = "module:Class"`` names a frozen dataclass with ``src_vocab``/``tgt_vocab`` fields and a
``build(*, rngs)`` method (:func:`model_class`); its other fields are the ``model.*`` keys.
A config file for another architecture starts from ``default_config(arch)``.
``optimizer.*`` — the fields of :class:`attn_jax.train.OptimizerConfig` (default: the paper's Adadelta).
``data.corpus`` — ``synthetic`` (the built-in corpus), ``tfds``, ``plain`` or ``tsv``; then
``data.synthetic`` (``tiny``/``small``/``default``, or ``custom`` = ``data.synthetic_spec``: ``train_size``,
``validation_size``, ``test_per_bucket``, ``seed``, ``min_length``, ``max_length`` of the generator) and
``data.use_tfds`` (read the TFDS-built dataset instead of generating the same pairs in memory);
``data.tfds_name``/``source_key``/``target_key``/``data_dir``; ``data.source_path``/``target_path`` (plain
text, ``{split}`` replaced by the split name); ``data.tsv_path``; ``data.alignment_path`` (plain or tsv only:
a Pharaoh file ``i-j ...`` beside the text, one line per pair, ``{split}`` replaced as above; it gives the
validation split gold-hit diagnostics, ``evaluate`` its AER, and ``lambda_align`` its supervision). ``data.train_split``/``eval_split``
(``validation``; a file corpus without ``validation`` files reads its ``valid`` or ``dev`` ones, and says so;
``none`` or ``""``: no validation split, so no validation runs and the best checkpoint is the latest),
``data.max_train_examples``/``max_eval_examples`` (0: all), ``data.vocab`` (``word``: the paper's word shortlists;
``sentencepiece``: SentencePiece subwords trained on the training side of each language, of type
``data.sentencepiece_type``, ``unigram`` or ``bpe``), ``data.src_vocab_size``/``tgt_vocab_size`` (K words or
pieces; four specials are added; SentencePiece gives fewer when the corpus supports no more, and the start-up
output says how many), ``data.max_source_length``/``max_target_length`` (pairs longer are dropped; in words, or
in pieces with ``sentencepiece``), ``data.batch_size``/``eval_batch_size``, ``data.bucket_boundaries``,
``data.prefetch``. ``data.pack`` (False) — pack several training pairs into each row of one fixed width
(segment ids and per-pair positions, no attention across pairs; ``model.arch=transformer`` only); rows per
batch stay ``data.batch_size``, so a batch carries more pairs; validation stays unpacked.
``debug.inject_nan_at_step`` (-1: off) — make the parameters NaN just before update k, to exercise the
divergence guard.
``parallel.strategy`` (``none``) — ``none``: one device, the plain jitted step; ``data``, ``tensor``,
``pipeline``, ``data+pipeline``, ``data+tensor`` (any ``+``-join of data, tensor, pipeline): a device mesh
``data × model × stage`` over every process's devices, parameters and batches sharded by the logical-axis rules
of :func:`attn_jax.parallel.rules_for`. ``parallel.data``/``model``/``stage`` (0) — the mesh's axis sizes; an
axis the strategy does not use must be 0 or 1 (it becomes 1), and one used axis may be 0: it takes the devices
the others leave (``data = devices / (model · stage)``). The product must equal the number of devices (a
single-process run may use fewer: the first ones). ``data.batch_size`` and ``data.eval_batch_size`` must be
multiples of ``parallel.data``. Pipelining splits GNMT's residual stacks: ``parallel.stage`` must equal
``model.pipeline_stages`` (``parallel.stage=0`` takes it from the model), and ``model.pipeline_stages > 1``
needs a pipeline strategy; the model config is never changed behind the user's back.
``parallel.strict_sharding`` (False) — a parameter dim that does not divide by its mesh axes is an error
instead of being replicated.
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
from attn_jax.parallel import STRATEGIES, rules_for
from attn_jax.train._optim import OptimizerConfig

__all__ = [
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
    c.seed = 0
    c.num_train_steps = 1000
    c.log_every = 50
    c.eval_every = 500
    c.checkpoint_every = 500
    c.keep_checkpoints = 3
    c.keep_best = True
    c.async_checkpoints = True
    c.tensorboard = True
    c.label_smoothing = 0.0
    c.lambda_coverage = 0.0
    c.coverage_start_step = 0
    c.lambda_align = 0.0
    c.mixed_precision = False
    c.model = model_defaults(arch)
    c.optimizer = ml_collections.ConfigDict(dataclasses.asdict(OptimizerConfig()))
    spec = _SYNTHETIC_NAMED["small"]
    c.data = ml_collections.ConfigDict(
        dict(
            corpus="synthetic",
            synthetic="small",
            use_tfds=False,
            synthetic_spec=dict(
                train_size=spec.train_size,
                validation_size=spec.validation_size,
                test_per_bucket=spec.test_per_bucket,
                seed=spec.seed,
                min_length=spec.min_length,
                max_length=spec.max_length,
            ),
            tfds_name="",
            source_key="",
            target_key="",
            data_dir="",
            source_path="",
            target_path="",
            tsv_path="",
            alignment_path="",
            train_split="train",
            eval_split="validation",
            max_train_examples=0,
            max_eval_examples=0,
            vocab="word",
            sentencepiece_type="unigram",
            src_vocab_size=30000,
            tgt_vocab_size=30000,
            max_source_length=50,
            max_target_length=50,
            batch_size=80,
            eval_batch_size=80,
            bucket_boundaries=(16, 24, 32, 48, 64, 96, 128),
            prefetch=2,
            pack=False,
        )
    )
    c.debug = ml_collections.ConfigDict(dict(inject_nan_at_step=-1))
    c.parallel = ml_collections.ConfigDict(
        dict(strategy="none", data=0, model=0, stage=0, strict_sharding=False)
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


def batch_configs(config: ml_collections.ConfigDict) -> tuple[BatchConfig, BatchConfig]:
    """``(train, eval)`` batching: shuffled endless training batches; every validation pair once, in order."""
    d = config.data
    common = dict(
        bucket_boundaries=tuple(d.bucket_boundaries),
        max_source_length=d.max_source_length,
        max_target_length=d.max_target_length,
    )
    try:
        train = BatchConfig(
            batch_size=d.batch_size, shuffle=True, seed=config.seed, drop_remainder=True, **common
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
    _check_alignment(config)
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
    for key in ("max_train_examples", "max_eval_examples", "prefetch"):
        if d[key] < 0:
            raise ConfigError(f"data.{key} must be >= 0, got {d[key]}")
    if d.pack and config.model.arch != "transformer":
        raise ConfigError(
            f"data.pack=True needs model.arch=transformer (the only model that reads segment ids); got "
            f"model.arch={config.model.arch!r}"
        )
    batch_configs(config)
    optimizer_config(config)
    if config.optimizer.accumulate > 1 and config.lambda_align > 0:
        raise ConfigError(
            f"optimizer.accumulate={config.optimizer.accumulate} cannot be used with lambda_align > 0 (the "
            "guided-alignment loss has its own normaliser, summed over micro-batches it is not exact)"
        )
    model_config(config, src_vocab=8, tgt_vocab=8)
    _check_parallel(config)


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
_STRATEGY_AXES = {"data": "data", "tensor": "model", "pipeline": "stage"}
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
        except ValueError:
            raise ConfigError(
                f"parallel.strategy must be none or one of {', '.join(STRATEGIES)} (or another '+'-join of "
                f"data, tensor, pipeline); got {p.strategy!r}"
            ) from None
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
        for key in ("batch_size", "eval_batch_size"):
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
    return c
