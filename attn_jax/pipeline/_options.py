"""How a run's sentences are decoded, and which attention gives their alignments: the options that
``translate`` and ``evaluate`` share."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from attn_jax.pipeline._load import TranslateError

__all__ = ["AttentionChoice", "AttentionChoiceError", "DecodeOptions"]


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """The options of :func:`translate_sentences` and :func:`evaluate_workdir`'s beam search.

    :meth:`check` refuses a value out of range with a :class:`TranslateError` that names the field, so a
    command line can reword it with its flag names.

    Attributes:
      beam_size: hypotheses kept per sentence (1: greedy).
      alpha: GNMT's length-normalisation weight α (0: raw log-probability).
      beta: GNMT's coverage-penalty weight β (0: off; needs attention).
      nbest: hypotheses returned per sentence, at most ``beam_size`` (:func:`evaluate_workdir` scores the best).
      max_length: every sentence may have this many tokens; not with a ratio or an offset.
      max_length_ratio, max_length_offset: the limit that grows with the source (:func:`length_limit`; None:
        the defaults of ``attn_jax.decoding.LengthLimit``).
      no_repeat_ngram: block any word that would repeat an n-gram of this size in a hypothesis (0: off).
      min_length: forbid ``</s>`` before this many target tokens; the length limit still wins (0: off).
      replace_unk: replace a produced ``<unk>`` with the most-attended source word (word-level vocabularies
        and models with attention only).

    >>> DecodeOptions(beam_size=4, nbest=2).check().nbest
    2
    >>> DecodeOptions(beam_size=2, nbest=3).check()
    Traceback (most recent call last):
    ...
    attn_jax.pipeline._load.TranslateError: nbest must be between 1 and beam_size 2, got 3
    """

    beam_size: int = 12
    alpha: float = 0.6
    beta: float = 0.0
    nbest: int = 1
    max_length: int | None = None
    max_length_ratio: float | None = None
    max_length_offset: int | None = None
    no_repeat_ngram: int = 0
    min_length: int = 0
    replace_unk: bool = False

    def check(self) -> DecodeOptions:
        """``self``, or a one-line :class:`TranslateError` naming the first field out of range."""
        from attn_jax.pipeline._length import _check_length_options

        if not _is_int(self.beam_size) or self.beam_size < 1:
            raise TranslateError(f"beam_size must be >= 1, got {self.beam_size}")
        if not _is_int(self.nbest) or not 1 <= self.nbest <= self.beam_size:
            raise TranslateError(f"nbest must be between 1 and beam_size {self.beam_size}, got {self.nbest}")
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise TranslateError(f"{name} must be a finite number >= 0, got {value}")
        _check_length_options(self.max_length, self.max_length_ratio, self.max_length_offset)
        for name in ("no_repeat_ngram", "min_length"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise TranslateError(f"{name} must be an int >= 0, got {value}")
        return self

    def length_limit(self, config):
        """The run's length limit with these options (:func:`length_limit`)."""
        from attn_jax.pipeline._length import length_limit

        return length_limit(
            config,
            max_length=self.max_length,
            max_length_ratio=self.max_length_ratio,
            max_length_offset=self.max_length_offset,
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields by name (``evaluation.json``'s ``options`` holds them)."""
        return dataclasses.asdict(self)


class AttentionChoiceError(TranslateError):
    """An :class:`AttentionChoice` that the model cannot give (a bad option, not a broken run)."""


@dataclasses.dataclass(frozen=True)
class AttentionChoice:
    """Which cross-attention gives a multi-head model's alignments and AER: one decoder layer, one head or
    the mean of the layer's heads.

    The default (last layer, mean of heads) is the attention the decoder reports while it decodes. Any other
    choice is read from a teacher-forced pass (``cross_attention_weights``). A model with a single attention
    (RNNsearch, GNMT) and an ensemble take only the default.

    Attributes:
      layer: the decoder layer, 0-based; negative counts from the end (-1: the last).
      head: the head index, 0-based; None: the mean over the layer's heads.

    >>> AttentionChoice().is_default, AttentionChoice(head=2).describe()
    (True, 'last layer, head 2')
    """

    layer: int = -1
    head: int | None = None

    @property
    def is_default(self) -> bool:
        """Whether this is the last layer's mean of heads (the decoder's own attention)."""
        return self.layer == -1 and self.head is None

    def describe(self) -> str:
        """``last layer, mean of heads``, ``layer 0, head 3``: the words of reports and titles."""
        layer = "last layer" if self.layer == -1 else f"layer {self.layer}"
        return f"{layer}, {'mean of heads' if self.head is None else f'head {self.head}'}"

    def check(self, loaded) -> tuple[int, int | None]:
        """``(layer, head)`` with the layer counted from 0, or an :class:`AttentionChoiceError` naming the
        field: a non-default choice for a model with one attention or an ensemble, or a value out of range."""
        if not _is_int(self.layer) or not (self.head is None or _is_int(self.head)):
            raise AttentionChoiceError(f"attention_layer and attention_head must be ints, got {self}")
        model = loaded.model
        field = "attention_layer" if self.head is None else "attention_head"
        value = self.layer if self.head is None else self.head
        models = model if isinstance(model, tuple) else (model,)
        if not self.is_default and not any(hasattr(m, "cross_attention_weights") for m in models):
            raise AttentionChoiceError(
                f"{field} needs a multi-head model (a Transformer); {_model_kind(loaded)} has a single "
                f"attention, got {value}"
            )
        if isinstance(model, tuple):
            if self.is_default:
                return -1, None
            raise AttentionChoiceError(
                f"{field} needs one run: the heads of an ensemble's {len(model)} runs do not correspond, "
                f"got {value}"
            )
        if not hasattr(model, "cross_attention_weights"):
            return -1, None
        layers, heads = int(model.config.decoder_layers), int(model.config.heads)
        if not -layers <= self.layer < layers:
            raise AttentionChoiceError(
                f"attention_layer must be between {-layers} and {layers - 1} ({_model_kind(loaded)} has "
                f"{layers} decoder layers), got {self.layer}"
            )
        if self.head is not None and not 0 <= self.head < heads:
            raise AttentionChoiceError(
                f"attention_head must be mean or between 0 and {heads - 1} ({heads} heads), got {self.head}"
            )
        return self.layer % layers, self.head

    def to_dict(self) -> dict[str, Any]:
        """``{"layer": -1, "head": "mean"}``: ``evaluation.json``'s ``options`` and the AER table hold it."""
        return {"layer": self.layer, "head": "mean" if self.head is None else self.head}


def _model_kind(loaded) -> str:
    """``RNNsearch``, ``GNMT``, ``Transformer``: the run's ``model.arch``, else the module's class name."""
    names = {"rnnsearch": "RNNsearch", "rnnenc": "RNNenc", "gnmt": "GNMT", "transformer": "Transformer"}
    arch = getattr(getattr(getattr(loaded, "config", None), "model", None), "arch", None)
    return names.get(str(arch), str(arch)) if arch is not None else type(loaded.model).__name__


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
