"""The RNN models' configuration (a frozen dataclass) and its named presets: the paper's sizes and CPU sizes.

A preset is a plain function returning an :class:`RNNConfig`; any field can be overridden by keyword
(``paper_config("rnnsearch", hidden=500)``) or afterwards with ``config.replace(...)``. The trainer's
``ml_collections`` configs (``configs/*.py``) build one of these from their ``model`` section.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax.numpy as jnp

from attn_jax.attention import NORMALIZERS
from attn_jax.attention._checks import positive_int
from attn_jax.models.interface import check_remat

__all__ = ["ARCHS", "SCORERS", "RNNConfig", "paper_config", "small_config"]

Arch = Literal["rnnsearch", "rnnenc"]
Scorer = Literal["additive", "normed_additive", "dot", "general", "local-p"]
ARCHS: tuple[str, ...] = ("rnnsearch", "rnnenc")
SCORERS: tuple[str, ...] = ("additive", "normed_additive", "dot", "general", "local-p")
_FLOAT_DTYPES = ("float32", "bfloat16", "float16")


def canonicalize_dtypes(config, label: str) -> None:
    """Check a frozen model config's ``param_dtype``/``dtype`` and store their canonical names (one-line errors)."""
    for name in ("param_dtype", "dtype"):
        value = getattr(config, name)
        try:
            canonical = jnp.dtype(value).name
        except TypeError:
            canonical = None
        if canonical not in _FLOAT_DTYPES:
            raise ValueError(f"{label}: {name} must be one of {', '.join(_FLOAT_DTYPES)}; got {value!r}")
        object.__setattr__(config, name, canonical)


@dataclasses.dataclass(frozen=True)
class RNNConfig:
    """Sizes and options of RNNsearch (Bahdanau et al. 2015) and RNNenc (Cho et al. 2014).

    Attributes:
      src_vocab: ``K_x``, source vocabulary size (ids ``0 .. K_x - 1``).
      tgt_vocab: ``K_y``, target vocabulary size.
      arch: ``"rnnsearch"`` (bidirectional encoder + attention) or ``"rnnenc"`` (fixed context vector).
      embed: ``m``, word-embedding width (paper: 620).
      hidden: ``n``, GRU state width of encoder and decoder (paper: 1000).
      maxout: ``l``, units after the maxout of the deep output (paper: 500; ``2l`` before pooling).
      align: ``n'``, alignment width of the additive scorer, of local-p's position predictor and of the
        intra-attention scorer (paper: 1000).
      scorer: RNNsearch's attention score: ``additive`` (the paper), ``normed_additive`` (weight-normalised
        ``v``), ``dot``, ``general`` (Luong et al. 2015), ``local-p`` (Luong's predictive local attention with
        the general score). Ignored by RNNenc.
      input_feeding: Luong-style input feeding (RNNsearch only): the previous step's maxout readout
        ``t_{i-1}`` is an extra input of the decoder GRU. See ``attn_jax.models.rnnsearch``.
      intra_attention: an LSTMN-style intra-attention encoder (Cheng, Dong & Lapata 2016, with a GRU): at each
        source position the encoder GRU's previous state is replaced by an additive-attention summary of the
        states it has already produced (RNNsearch: in both directions; RNNenc: in its one encoder). Its scorer
        has width ``align``. Off (the default) leaves both models exactly as the papers'. See
        ``attn_jax.nn.intra``.
      coverage: the attention accumulated over the previous target words, ``c_ij = Σ_{i'<i} α_{i'j}``, is
        carried in the decoder state and read by the additive scorer, ``vᵀ tanh(W_a s_{i-1} + U_a h_j +
        w_c c_ij + b)`` (Tu et al. 2016; See, Liu & Manning 2017, eq. 11): RNNsearch with ``scorer="additive"``
        or ``"normed_additive"`` only. Off (the default) leaves the model exactly as the paper's. Train it with
        the coverage loss (the trainer's ``lambda_coverage``).
      copy: the pointer-generator of See, Liu & Manning (2017, eq. 8-9; after Gu et al. 2016's CopyNet):
        RNNsearch only. A gate ``p_gen = σ(w_hᵀ c_i + w_sᵀ s_{i-1} + w_xᵀ E y_{i-1} + b)`` mixes the output
        softmax with the attention weights scattered onto the source words, over the target vocabulary extended
        by each sentence's out-of-vocabulary source words; teacher forcing then takes the source ids in that
        extended vocabulary (``src_ext``) and returns log-probabilities ``[B, T, V + S]``. Off (the default)
        leaves the model exactly as the paper's. Decoding takes ``encode(src, src_mask, src_ext)``
        and returns log-probabilities ``[B, V + S]`` per step.
      local_window: ``D``, half-width of the local-p window (Luong: 10).
      attention_init: initialisation of the additive scorer (``scorer="additive"``): ``"fan_in"``
        (fan-in-scaled normals) or ``"paper"`` (appendix B.1: ``W_a, U_a ~ N(0, 0.001²)``, ``v_a = 0``); see
        ``attn_jax.attention.init_additive_params``.
      normalizer: what turns RNNsearch's scores into attention weights: ``"softmax"`` (the paper),
        ``"sparsemax"`` (Martins & Astudillo 2016) or ``"entmax15"`` (1.5-entmax, Peters et al. 2019), which
        can give source words exactly zero weight (``attn_jax.masked_normalize``); every scorer, local-p
        included. The intra-attention encoder keeps its softmax. RNNenc has no attention: only ``"softmax"``.
      remat: what each time step of the encoder and decoder scans keeps for the backward pass
        (``jax.checkpoint``): ``"none"``, ``"full"`` (only the step's state: its gates and attention scores are
        recomputed), ``"dots_saveable"`` or ``"dots_with_no_batch_dims_saveable"`` (see
        ``attn_jax.models.interface.REMAT_POLICIES``).
      param_dtype: dtype the parameters are stored in.
      dtype: compute dtype of matmul operands and activations (``"bfloat16"`` for mixed precision; recurrent
        states, attention logits, softmax and output logits stay float32).
    """

    src_vocab: int = 30000
    tgt_vocab: int = 30000
    arch: Arch = "rnnsearch"
    embed: int = 620
    hidden: int = 1000
    maxout: int = 500
    align: int = 1000
    scorer: Scorer = "additive"
    input_feeding: bool = False
    intra_attention: bool = False
    coverage: bool = False
    copy: bool = False
    local_window: int = 10
    attention_init: str = "fan_in"
    normalizer: str = "softmax"
    remat: str = "none"
    param_dtype: str = "float32"
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("src_vocab", "tgt_vocab", "embed", "hidden", "maxout", "align", "local_window"):
            object.__setattr__(self, name, positive_int(f"model config: {name}", getattr(self, name)))
        if self.arch not in ARCHS:
            raise ValueError(f"model config: arch must be one of {', '.join(ARCHS)}; got {self.arch!r}")
        if self.scorer not in SCORERS:
            raise ValueError(f"model config: scorer must be one of {', '.join(SCORERS)}; got {self.scorer!r}")
        if not isinstance(self.input_feeding, bool):
            raise ValueError(f"model config: input_feeding must be a bool, got {self.input_feeding!r}")
        if not isinstance(self.intra_attention, bool):
            raise ValueError(f"model config: intra_attention must be a bool, got {self.intra_attention!r}")
        if not isinstance(self.coverage, bool):
            raise ValueError(f"model config: coverage must be a bool, got {self.coverage!r}")
        if self.coverage and (self.arch != "rnnsearch" or self.scorer not in ("additive", "normed_additive")):
            raise ValueError(
                "model config: coverage feeds the additive scorer (arch='rnnsearch', scorer='additive' or "
                f"'normed_additive'); got arch={self.arch!r}, scorer={self.scorer!r}"
            )
        if not isinstance(self.copy, bool):
            raise ValueError(f"model config: copy must be a bool, got {self.copy!r}")
        if self.copy and self.arch != "rnnsearch":
            raise ValueError(
                f"model config: copy copies source words by attention (arch='rnnsearch'); got {self.arch!r}"
            )
        if self.attention_init not in ("fan_in", "paper"):
            raise ValueError(
                f"model config: attention_init must be 'fan_in' or 'paper', got {self.attention_init!r}"
            )
        if self.attention_init == "paper" and self.scorer == "normed_additive":
            raise ValueError("model config: attention_init='paper' (v_a = 0) cannot be weight-normalised")
        if self.normalizer not in NORMALIZERS:
            raise ValueError(
                f"model config: normalizer must be one of {', '.join(NORMALIZERS)}; got {self.normalizer!r}"
            )
        if self.normalizer != "softmax" and self.arch != "rnnsearch":
            raise ValueError(
                f"model config: normalizer={self.normalizer!r} needs attention (arch='rnnsearch'); RNNenc has none"
            )
        if self.input_feeding and self.arch != "rnnsearch":
            raise ValueError(
                "model config: input_feeding needs attention (arch='rnnsearch'); RNNenc has none"
            )
        check_remat("model config", self.remat)
        canonicalize_dtypes(self, "model config")

    def replace(self, **changes) -> RNNConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


def paper_config(
    arch: Arch = "rnnsearch", *, src_vocab: int = 30000, tgt_vocab: int = 30000, **overrides
) -> RNNConfig:
    """Bahdanau et al. (2015), §4.2 / appendix A: ``m = 620``, ``n = 1000``, ``l = 500``, ``n' = 1000``,
    30 000-word vocabularies; RNNenc uses the same sizes (1000 hidden units in encoder and decoder).

    >>> paper_config("rnnenc").hidden
    1000
    """
    base = dict(embed=620, hidden=1000, maxout=500, align=1000)
    return RNNConfig(src_vocab=src_vocab, tgt_vocab=tgt_vocab, arch=arch, **{**base, **overrides})


def small_config(arch: Arch = "rnnsearch", *, src_vocab: int, tgt_vocab: int, **overrides) -> RNNConfig:
    """A CPU-sized preset for the built-in corpus and demos: ``m = 64``, ``n = 128``, ``l = 64``, ``n' = 64``.

    >>> small_config(src_vocab=100, tgt_vocab=120).embed
    64
    """
    base = dict(embed=64, hidden=128, maxout=64, align=64)
    return RNNConfig(src_vocab=src_vocab, tgt_vocab=tgt_vocab, arch=arch, **{**base, **overrides})
