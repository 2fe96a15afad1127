"""Translation models behind one decoding-step interface: RNNsearch (Bahdanau 2015), RNNenc (Cho 2014).

``build_model(config, rngs=...)`` turns an :class:`RNNConfig` (see ``presets``) into a model; every model
implements ``encode`` / ``init_decoder_state`` / ``decode_step`` / ``__call__`` of
:mod:`attn_jax.models.interface`. Models import only ``attn_jax.nn`` and ``attn_jax.attention`` (never optax,
data or checkpoint code).
"""

from __future__ import annotations

from flax import nnx

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

__all__ = [
    "ARCHS",
    "SCORERS",
    "EncoderOutput",
    "RNNConfig",
    "RNNDecoderState",
    "RNNenc",
    "RNNsearch",
    "Seq2SeqModel",
    "build_model",
    "gather_batch",
    "paper_config",
    "repeat_batch",
    "small_config",
]


def build_model(config: RNNConfig, *, rngs: nnx.Rngs) -> RNNsearch | RNNenc:
    """The model ``config.arch`` names, initialised from ``rngs``.

    >>> build_model(small_config("rnnenc", src_vocab=10, tgt_vocab=10), rngs=nnx.Rngs(0)).__class__.__name__
    'RNNenc'
    """
    if config.arch == "rnnsearch":
        return RNNsearch(config, rngs=rngs)
    if config.arch == "rnnenc":
        return RNNenc(config, rngs=rngs)
    raise ValueError(f"unknown model arch {config.arch!r}; expected one of {', '.join(ARCHS)}")
