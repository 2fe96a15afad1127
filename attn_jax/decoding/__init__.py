"""Decoding translations from any model with the step interface (``attn_jax.models.interface``).

* :func:`beam_search` — batched, jit-compiled beam search with GNMT's length normalisation and coverage
  penalty, n-best lists, ensembles, and the attention matrix of every returned hypothesis.
* :func:`greedy_decode` — beam search with one hypothesis and no penalties (the argmax loop).
* :func:`sample_decode` — batched, jit-compiled sampling with temperature, top-k and top-p (:class:`Sampling`),
  each sentence drawing independently from a seed; length limits as in beam search.
* Forced output, in both: a target prefix per sentence (``prefix``), and lexical constraints (``constraints``)
  met by dynamic beam allocation (Post & Vilar 2018), each hypothesis counting those it lacks.
* :func:`search_batches` — many sentences at once: length-sorted batches at a few padded widths (few compiled
  shapes), each sentence with its own length limit; ``translate``, ``evaluate`` and validation use it.
* :class:`LengthLimit` — how long a translation may grow: the one rule ``attn-jax translate`` and ``evaluate``
  share, defined in its docstring. Beam search flags each hypothesis it cut there (``BeamResult.truncated``).
* :func:`length_penalty`, :func:`coverage_penalty`, :func:`normalized_score` — Wu et al. (2016), eq. 14.

Decoding imports only the models' step interface (never data or training code).
"""

from __future__ import annotations

from attn_jax.decoding._batches import (
    SearchBatch,
    length_batches,
    model_length_cap,
    pad_rows,
    padded_width,
    search_batches,
)
from attn_jax.decoding._beam import BeamResult, beam_search, greedy_decode, output_length
from attn_jax.decoding._limits import DEFAULT_MAX_LENGTH_OFFSET, DEFAULT_MAX_LENGTH_RATIO, LengthLimit
from attn_jax.decoding._penalties import coverage_penalty, length_penalty, normalized_score
from attn_jax.decoding._sampling import Sampling, sample_decode

__all__ = [
    "DEFAULT_MAX_LENGTH_OFFSET",
    "DEFAULT_MAX_LENGTH_RATIO",
    "BeamResult",
    "LengthLimit",
    "Sampling",
    "SearchBatch",
    "beam_search",
    "coverage_penalty",
    "greedy_decode",
    "length_batches",
    "length_penalty",
    "model_length_cap",
    "normalized_score",
    "output_length",
    "pad_rows",
    "padded_width",
    "sample_decode",
    "search_batches",
]
