"""Translation models behind one decoding-step interface: RNNsearch (Bahdanau 2015), RNNenc (Cho 2014), GNMT
(Wu et al. 2016), the Transformer (Vaswani et al. 2017).

``build_model(config, rngs=...)`` turns a model config (:class:`RNNConfig`, see ``presets``, or
:class:`GNMTConfig`, :class:`TransformerConfig`) into a model; every model
implements ``encode`` / ``init_decoder_state`` / ``decode_step`` / ``__call__`` of
:mod:`attn_jax.models.interface`. Models import only ``attn_jax.nn`` and ``attn_jax.attention`` (never optax,
data or checkpoint code).
"""

from __future__ import annotations

from flax import nnx

from attn_jax.models.gnmt import GNMT, GNMTConfig, GNMTDecoderState, gnmt_cpu_config, gnmt_wmt14_config
from attn_jax.models.interface import (
    EncoderOutput,
    RNNDecoderState,
    Seq2SeqModel,
    gather_batch,
    repeat_batch,
)
from attn_jax.models.presets import ARCHS, SCORERS, RNNConfig, paper_config, small_config
from attn_jax.models.rnnenc import RNNenc
from attn_jax.models.rnnsearch import RNNsearch
from attn_jax.models.transformer import (
    Transformer,
    TransformerConfig,
    TransformerDecoderLayer,
    TransformerDecoderState,
    TransformerDecodingState,
    TransformerEncoderLayer,
    transformer_base_config,
    transformer_cpu_config,
)

__all__ = [
    "ARCHS",
    "SCORERS",
    "GNMT",
    "EncoderOutput",
    "GNMTConfig",
    "GNMTDecoderState",
    "ModelConfig",
    "RNNConfig",
    "RNNDecoderState",
    "RNNenc",
    "RNNsearch",
    "Seq2SeqModel",
    "Transformer",
    "TransformerConfig",
    "TransformerDecoderLayer",
    "TransformerDecoderState",
    "TransformerDecodingState",
    "TransformerEncoderLayer",
    "build_model",
    "gather_batch",
    "gnmt_cpu_config",
    "gnmt_wmt14_config",
    "paper_config",
    "repeat_batch",
    "small_config",
    "transformer_base_config",
    "transformer_cpu_config",
]


ModelConfig = RNNConfig | GNMTConfig | TransformerConfig
"""Any model config :func:`build_model` accepts (frozen dataclasses: hashable, usable as static jit args)."""


def build_model(config: ModelConfig, *, rngs: nnx.Rngs) -> RNNsearch | RNNenc | GNMT | Transformer:
    """The model ``config`` describes (its type, then ``config.arch``), initialised from ``rngs``.

    >>> build_model(small_config("rnnenc", src_vocab=10, tgt_vocab=10), rngs=nnx.Rngs(0)).__class__.__name__
    'RNNenc'
    """
    if not isinstance(config, RNNConfig | GNMTConfig | TransformerConfig) and callable(
        getattr(config, "build", None)
    ):
        return config.build(rngs=rngs)  # your own model: its config builds it (attn_jax.train.model_class)
    if isinstance(config, GNMTConfig):
        return GNMT(config, rngs=rngs)
    if isinstance(config, TransformerConfig):
        return Transformer(config, rngs=rngs)
    if config.arch == "rnnsearch":
        return RNNsearch(config, rngs=rngs)
    if config.arch == "rnnenc":
        return RNNenc(config, rngs=rngs)
    raise ValueError(f"unknown model arch {config.arch!r}; expected one of {', '.join(ARCHS)}")
