"""The decoding, attention and BLEU options of ``translate`` and ``evaluate``, built from their flags and checked.

The library checks (``DecodeOptions.check``, ``BleuSettings.check``) name each option by its field; here
those names become the flags the user typed.
"""

from __future__ import annotations

import argparse
import re

from attn_jax.eval import BleuSettings
from attn_jax.pipeline import AttentionChoice, DecodeOptions, TranslateError

__all__ = [
    "FLAGS",
    "add_attention_flags",
    "add_workdir_flag",
    "attention_choice",
    "bleu_settings",
    "decode_options",
    "flag_worded",
]

# Option field -> the flag that sets it.
FLAGS = {
    "beam_size": "--beam",
    "alpha": "--alpha",
    "beta": "--beta",
    "nbest": "--nbest",
    "max_length": "--max-length",
    "max_length_ratio": "--max-length-ratio",
    "max_length_offset": "--max-length-offset",
    "no_repeat_ngram": "--no-repeat-ngram",
    "min_length": "--min-length",
    "tokenize": "--bleu-tokenize",
    "detokenize": "--detokenize",
    "detokenize_lang": "--detokenize-lang",
    "attention_layer": "--attention-layer",
    "attention_head": "--attention-head",
}
_FIELD = re.compile(r"(?<![\w-])(" + "|".join(sorted(FLAGS, key=len, reverse=True)) + r")(?![\w-])")


def flag_worded(message: str) -> str:
    """``message`` with each option field named by its flag; the value after ``, got`` is left as given."""
    head, got, value = str(message).rpartition(", got ")
    if not got:
        head, value = value, ""
    return _FIELD.sub(lambda m: FLAGS[m.group(1)], head) + got + value


def add_workdir_flag(p: argparse.ArgumentParser) -> None:
    """``--workdir DIR``, repeatable: several runs decode or score as an ensemble (``pipeline.load_ensemble``)."""
    p.add_argument(
        "--workdir",
        required=True,
        action="append",
        metavar="DIR",
        help="the training run's directory; repeat it for an ensemble, whose runs must share their "
        "vocabularies (their log-probabilities are averaged)",
    )


def _head(value: str) -> int | None:
    """``--attention-head``: ``mean`` (None) or a head index."""
    if value == "mean":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a head index or 'mean', got {value!r}") from None


def add_attention_flags(p: argparse.ArgumentParser, what: str) -> None:
    """``--attention-layer L`` and ``--attention-head H|mean``: a multi-head model's attention for ``what``."""
    p.add_argument(
        "--attention-layer",
        type=int,
        default=-1,
        metavar="L",
        help=f"the decoder layer whose cross-attention gives {what}: 0-based, negative counts from the end "
        "(default: %(default)s, the last); multi-head models (the Transformer) only",
    )
    p.add_argument(
        "--attention-head",
        type=_head,
        default=None,
        metavar="H|mean",
        help=f"the head of that layer that gives {what}, 0-based, or 'mean' of its heads (default: mean); "
        "multi-head models only",
    )


def attention_choice(args: argparse.Namespace) -> AttentionChoice:
    """The :class:`AttentionChoice` of ``--attention-layer`` and ``--attention-head`` (checked on the model)."""
    return AttentionChoice(layer=args.attention_layer, head=args.attention_head)


def decode_options(args: argparse.Namespace) -> DecodeOptions:
    """The checked :class:`DecodeOptions` of the flags; a TranslateError worded with the flags."""
    options = DecodeOptions(
        beam_size=args.beam,
        alpha=args.alpha,
        beta=args.beta,
        nbest=getattr(args, "nbest", 1),
        max_length=args.max_length,
        max_length_ratio=args.max_length_ratio,
        max_length_offset=args.max_length_offset,
        no_repeat_ngram=args.no_repeat_ngram,
        min_length=args.min_length,
        replace_unk=args.replace_unk,
    )
    try:
        return options.check()
    except TranslateError as e:
        raise TranslateError(flag_worded(str(e))) from None


def bleu_settings(args: argparse.Namespace) -> BleuSettings:
    """The checked ``BleuSettings`` of ``evaluate``'s flags; a TranslateError worded with the flags."""
    settings = BleuSettings(args.bleu_tokenize, args.detokenize, args.detokenize_lang)
    try:
        return settings.check()
    except ValueError as e:
        raise TranslateError(flag_worded(str(e))) from None
