"""``attn-jax translate``: translate sentences with a trained run's checkpoint (beam search), optionally aligned.

    attn-jax translate --workdir runs/rnnsearch_cpu --input test.en --output test.out
    echo "the dog slept ." | attn-jax translate --workdir runs/rnnsearch_cpu --beam 12 --alpha 0.6
    attn-jax translate --workdir runs/X --input - --nbest 4              # Moses n-best: i ||| text ||| score
    attn-jax translate --workdir runs/X --alignment pharaoh               # text ||| 0-0 1-2 ...
    attn-jax translate --workdir runs/X --alignment json                  # one JSON object per input line

Input: one sentence per line (UTF-8, already tokenised as the training corpus: whitespace tokens); a blank line
gives a blank translation (nothing is decoded), so output line ``k`` always belongs to input line ``k``. Lines
end at ``\\n`` only, as in the corpus reader (``\\r\\n`` works too); any other line or paragraph separator inside a
line (``\\r``, ``\\f``, ``\\v``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028, U+2029) is whitespace between tokens. The
checkpoint is the run's best one by validation loss (``--checkpoint best``, the default; the latest, with a
warning on stderr, when no kept checkpoint has been evaluated), the latest (``last``) or a given step; the
vocabularies are the run's own (``workdir/vocab``). A best or latest checkpoint that cannot be read (a truncated
or deleted file) is skipped for the next best or newest one that loads, with a warning on stderr naming the
damaged step; when none loads, or the step asked for cannot be read, the error names each step and why.

Streaming: the model is loaded first; then standard input from a terminal or a pipe is read as it arrives: a line
typed at a terminal (or written to the pipe) is translated, and its output written and flushed, before the next one
is read. Lines that have already arrived are translated together, up to ``--batch-size`` at a time, but a pending
line never waits for more input, so ``cat big.txt | attn-jax translate`` still decodes in full batches. A file
(``--input FILE``, or standard input redirected from a regular file) is read whole and batched by length;
``--progress bar`` or ``lines`` then shows the sentences done, their rate and an ETA on stderr (``auto``, the
default: a bar when stderr is a terminal, nothing otherwise), as ``attn-jax evaluate`` does. Either way the
length-limit summary below comes once, at the end of the input.

Output formats:

* plain: the best translation, one line per input line;
* ``--nbest K``: Moses n-best lists, ``K`` lines per input line ``i ||| translation ||| score ||| log_prob``
  (``i`` 0-based, best first; ``score`` is the normalised beam score ``log P / lp + cp``);
* ``--alignment pharaoh``: ``translation ||| i-j i-j ...`` (with ``--nbest`` appended as a fifth field): for
  every target word ``j`` the source word ``i`` it attends to most (0-based token positions, ``</s>`` on
  either side left out; word positions for the word-level vocabularies of the built-in corpus);
* ``--alignment json``: one JSON object per input line, ``{"index", "source", "translation", "hypotheses":
  [{"translation", "tokens", "score", "log_prob", "alignment", "attention", "limit", "stopped_at_limit"}]}``
  with ``attention`` the ``[m + 1, n + 1]`` weights (rows: the ``m`` target words then ``</s>``; columns: the
  ``n`` source tokens then ``</s>``), ``limit`` the most tokens the sentence could have and
  ``stopped_at_limit`` whether this hypothesis was cut there.

Length limit: a translation of a source of ``n`` tokens may have at most ``max(T, ⌊2·n⌋ + 10)`` tokens, ``T``
the longest target the run trained on (``data.max_target_length``), so no sentence gets less room than the
training targets had; ``--max-length-ratio`` and ``--max-length-offset`` change 2 and 10, ``--max-length N``
gives every sentence ``N`` tokens instead (a Transformer cannot exceed its decoder's ``model.max_length``
positions). ``attn-jax evaluate`` takes the same flags and derives the same limit (:func:`length_limit`). A
translation cut at the limit (its ``</s>`` forced where the model wanted another word) is never silent: stderr
says ``attn-jax translate: warning: N of M translations stopped at the length limit (...) instead of ending
with </s>: raise --max-length or --max-length-ratio``.

Unknown words: the shortlist vocabularies map rare words to ``<unk>``, and the model may produce ``<unk>``. By
default it is passed through as the literal token ``<unk>`` (the paper's setting; BLEU counts it as a wrong
word). ``--replace-unk`` replaces each produced ``<unk>`` by the source word that received the most attention
when it was produced (Luong et al. 2015, "Addressing the Rare Word Problem in Neural Machine Translation",
with attention as the alignment, as in Jean et al. 2015): useful for names and numbers copied verbatim. It
needs a model with attention and word-level vocabularies (otherwise ``<unk>`` stays).

Exit status: 0 done; 1 a missing workdir, checkpoint or vocabulary, no checkpoint that can be read, an
unreadable or empty input (one line on stderr, no traceback; for streamed input after the lines before it
were answered); 2 a bad flag.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "LengthLimitReport",
    "LineStream",
    "LoadedModel",
    "TranslateError",
    "Translation",
    "add_length_limit_flags",
    "add_translate_parser",
    "length_limit",
    "length_limit_report",
    "load_model",
    "merge_length_limit_reports",
    "model_length_cap",
    "run_translate",
    "stream_fd",
    "translate_sentences",
]

UNK_TOKEN = "<unk>"
_MIN_WIDTH = 16  # padded source widths are powers of two from here: few compiled shapes


class TranslateError(ValueError):
    """A run cannot be loaded or an input cannot be translated; the message is one line."""


class LoadedModel(NamedTuple):
    """A trained model restored from a run directory, with its vocabularies and config."""

    model: Any  # flax.nnx.Module with the step interface
    src_vocab: Any  # attn_jax.data.Vocabulary
    tgt_vocab: Any
    config: Any  # ml_collections.ConfigDict of the run
    step: int
    workdir: str
    note: str = ""  # one line when another checkpoint than the one asked for was loaded (print it)


class Translation(NamedTuple):
    """One hypothesis for one source sentence.

    Attributes:
      text: the translation (``<unk>`` replaced when asked).
      tokens: its target tokens (words for word-level vocabularies), without ``</s>``.
      ids: the target token ids, without ``</s>``.
      score: normalised beam score ``log P / lp + cp``.
      log_prob: ``log P(Y | X)`` including ``</s>``.
      attention: ``[m + 1, n + 1]`` float32 weights (rows: ``m`` target tokens then ``</s>``; columns: ``n``
        source tokens then ``</s>``), or None for a model without attention.
      source_tokens: the ``n`` source tokens.
      truncated: True when the hypothesis stopped at its length limit, its ``</s>`` forced where the model's
        most probable next token was another word (``attn_jax.decoding.BeamResult.truncated``).
      limit: the most tokens (without ``</s>``) this sentence could have: :func:`length_limit`'s rule, cut to
        what the model can produce (:func:`model_length_cap`); None for a blank line (nothing decoded).
    """

    text: str
    tokens: list[str]
    ids: list[int]
    score: float
    log_prob: float
    attention: np.ndarray | None
    source_tokens: list[str]
    truncated: bool = False
    limit: int | None = None

    def alignment(self) -> str:
        """Pharaoh ``i-j`` links: each target token ``j`` to its most-attended source token ``i`` (no ``</s>``)."""
        if self.attention is None or not self.tokens or not self.source_tokens:
            return ""
        w = self.attention[: len(self.tokens), : len(self.source_tokens)]
        return " ".join(f"{int(np.argmax(w[j]))}-{j}" for j in range(w.shape[0]) if w[j].max() > 0)


# ------------------------------------------------------------------------------------------------ loading


def parse_checkpoint(value: str) -> str | int:
    """``best``, ``last`` or a non-negative step number (argparse type)."""
    if value in ("best", "last"):
        return value
    if value.isdigit():
        return int(value)
    raise argparse.ArgumentTypeError(f"expected best, last or a step number, got {value!r}")


def load_model(workdir: str | os.PathLike, checkpoint: str | int = "best") -> LoadedModel:
    """Restore the model of a training run: its checkpoint (``best``, ``last`` or a step), vocabularies, config.

    ``best`` falls back to the latest finished checkpoint when none of the kept ones has validation metrics
    (a run stopped before its first evaluation), and ``best``/``last`` to the next best/newest checkpoint that
    loads when theirs cannot be read (a truncated or deleted file); :attr:`LoadedModel.note` then says so, for
    the caller to print.

    Raises:
      TranslateError: no such workdir, no (such) checkpoint, none that can be read (or the step asked for
        cannot be), missing vocabularies or an unusable config.
    """
    import ml_collections

    from attn_jax import data
    from attn_jax.train import CheckpointUnreadable, build_module, load_checkpoint, model_config

    workdir = os.fspath(workdir)
    if not os.path.isdir(workdir):
        raise TranslateError(f"{workdir}: no such run directory")
    ckpt_dir = os.path.join(workdir, "checkpoints")
    steps = (
        sorted(
            int(d) for d in os.listdir(ckpt_dir) if d.isdigit() and os.path.isdir(os.path.join(ckpt_dir, d))
        )
        if os.path.isdir(ckpt_dir)
        else []
    )
    if not steps:
        raise TranslateError(f"{workdir}: no checkpoint (expected {ckpt_dir}/<step>; train first)")
    if isinstance(checkpoint, int) and checkpoint not in steps:
        raise TranslateError(f"{workdir}: no checkpoint at step {checkpoint} (kept: {steps})")
    try:
        step = checkpoint if isinstance(checkpoint, int) else None
        restored = load_checkpoint(workdir, step, best=checkpoint == "best")
    except (FileNotFoundError, CheckpointUnreadable) as e:
        raise TranslateError(str(e)) from None
    try:
        src_vocab, tgt_vocab = data.load_vocabularies(os.path.join(workdir, "vocab"))
    except (ValueError, OSError) as e:
        raise TranslateError(f"{workdir}: cannot read the vocabularies: {e}") from None
    config = ml_collections.ConfigDict(restored.config)
    try:
        model = build_module(model_config(config, src_vocab.size, tgt_vocab.size), restored.state["params"])
    except (ValueError, KeyError, TypeError) as e:
        raise TranslateError(f"{workdir}: checkpoint {restored.step} does not fit its config: {e}") from None
    return LoadedModel(model, src_vocab, tgt_vocab, config, int(restored.step), workdir, restored.note)


# ------------------------------------------------------------------------------------------- length limit


def length_limit(
    config,
    *,
    max_length: int | None = None,
    max_length_ratio: float | None = None,
    max_length_offset: int | None = None,
):
    """The decoding length limit of a run, the one rule ``attn-jax translate`` and ``evaluate`` share.

    ``max(T, ⌊ratio · n⌋ + offset)`` target tokens (without ``</s>``) for a source of ``n`` tokens, with ``T``
    the longest target the run trained on (``config.data.max_target_length``; 0 when it sets none or
    ``config`` is None), ``ratio`` 2 and ``offset`` 10 unless given; ``max_length`` instead gives every
    sentence that many tokens (and cannot be combined with a ratio or an offset).

    Returns:
      An ``attn_jax.decoding.LengthLimit``.

    Raises:
      TranslateError: a value out of range, or ``max_length`` together with a ratio or an offset.
    """
    from attn_jax.decoding import DEFAULT_MAX_LENGTH_OFFSET, DEFAULT_MAX_LENGTH_RATIO, LengthLimit

    problem = length_flags_problem(max_length, max_length_ratio, max_length_offset)
    if problem:
        raise TranslateError(problem)
    if max_length is not None:
        return LengthLimit.fixed(max_length)
    data = getattr(config, "data", None) if config is not None else None
    trained = data.get("max_target_length") if data is not None else None
    return LengthLimit(
        int(trained or 0),
        DEFAULT_MAX_LENGTH_RATIO if max_length_ratio is None else float(max_length_ratio),
        DEFAULT_MAX_LENGTH_OFFSET if max_length_offset is None else int(max_length_offset),
    ).check()


def length_flags_problem(
    max_length: int | None, max_length_ratio: float | None, max_length_offset: int | None
) -> str | None:
    """What is wrong with the length flags, in one line, or None (checked before a run is loaded: exit 2)."""
    if max_length is not None and (max_length_ratio is not None or max_length_offset is not None):
        return (
            "give --max-length (the same limit for every sentence) or --max-length-ratio/--max-length-offset "
            "(a limit that grows with the source), not both"
        )
    if max_length is not None and max_length < 1:
        return f"--max-length must be >= 1, got {max_length}"
    if max_length_ratio is not None and not (math.isfinite(max_length_ratio) and max_length_ratio >= 0):
        return f"--max-length-ratio must be a finite number >= 0, got {max_length_ratio}"
    if max_length_offset is not None and max_length_offset < 0:
        return f"--max-length-offset must be >= 0, got {max_length_offset}"
    if max_length_ratio == 0 and max_length_offset == 0:
        return "--max-length-ratio 0 with --max-length-offset 0 leaves no room; use --max-length N"
    return None


def model_length_cap(model) -> int | None:
    """The most target tokens (with ``</s>``) a model can produce: a Transformer's decoder cache holds
    ``model.config.max_length`` positions; None for a model without such a bound (the RNNs)."""
    cap = getattr(getattr(model, "config", None), "max_length", None)
    return int(cap) if cap else None


class LengthLimitReport(NamedTuple):
    """How many translations the length limit cut, for stderr, ``summary.json`` and the reports.

    Attributes:
      rule: the ``attn_jax.decoding.LengthLimit`` asked for.
      translations: sentences decoded (blank lines are not).
      stopped: of those, how many best translations stopped at their limit instead of ending with ``</s>``.
      shortest, longest: the smallest and largest limit the sentences had (tokens without ``</s>``).
      model_cap: the most tokens (without ``</s>``) the model can produce, when it cut the rule's limit for
        some sentence (a Transformer's ``model.max_length``); None otherwise.
    """

    rule: Any
    translations: int
    stopped: int
    shortest: int | None
    longest: int | None
    model_cap: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``stopped_at_limit`` of ``translations``, the rule (``minimum``, ``ratio``, ``offset``
        and in words), the smallest and largest limit applied (tokens without ``</s>``) and ``model_cap``."""
        return {
            "stopped_at_limit": self.stopped,
            "translations": self.translations,
            "fraction_stopped": self.stopped / self.translations if self.translations else 0.0,
            "rule": self.rule.describe(),
            "minimum": self.rule.minimum,
            "ratio": self.rule.ratio,
            "offset": self.rule.offset,
            "shortest_limit": self.shortest,
            "longest_limit": self.longest,
            "model_cap": self.model_cap,
        }

    def describe_limit(self) -> str:
        """The limit as applied: ``'26 tokens'``, or the rule with the range it gave (``'...; 16-40 here'``)."""
        text = self.rule.describe()
        if self.shortest is not None and not self.rule.is_fixed:
            here = f"{self.shortest}" if self.shortest == self.longest else f"{self.shortest}-{self.longest}"
            text += f", {here} here"
        if self.model_cap is not None:
            text += f", at most {self.model_cap} for this model (its decoder holds {self.model_cap + 1} positions)"
        return text

    def message(self) -> str | None:
        """The warning line for stderr (without the command's prefix), or None when nothing was cut."""
        if not self.stopped:
            return None
        advice = "raise --max-length or --max-length-ratio"
        if self.model_cap is not None:
            advice += f" (the model stops at {self.model_cap} tokens whatever the flags)"
        return (
            f"{self.stopped} of {self.translations} translations stopped at the length limit "
            f"({self.describe_limit()}) instead of ending with </s>: {advice}"
        )


def length_limit_report(loaded: LoadedModel, sentences: Sequence[str], results, rule) -> LengthLimitReport:
    """Count the best translations of :func:`translate_sentences` that stopped at their length limit."""
    decoded = [hyps[0] for hyps in results if hyps and hyps[0].limit is not None]
    limits = [h.limit for h in decoded]
    cap = model_length_cap(loaded.model)
    capped = None
    if cap is not None:
        wanted = max(
            (rule.tokens(len(loaded.src_vocab.encode(s))) for s in sentences if s.split()), default=0
        )
        capped = cap - 1 if wanted > cap - 1 else None
    return LengthLimitReport(
        rule,
        len(decoded),
        sum(h.truncated for h in decoded),
        min(limits, default=None),
        max(limits, default=None),
        capped,
    )


def merge_length_limit_reports(a: LengthLimitReport | None, b: LengthLimitReport) -> LengthLimitReport:
    """The report of two groups of sentences from the reports of each (``a`` None: ``b``): streamed input is
    translated a batch at a time and its length-limit summary given once, at the end."""
    if a is None:
        return b

    def pick(f, x, y):
        return x if y is None else y if x is None else f(x, y)

    return LengthLimitReport(
        a.rule,
        a.translations + b.translations,
        a.stopped + b.stopped,
        pick(min, a.shortest, b.shortest),
        pick(max, a.longest, b.longest),
        pick(max, a.model_cap, b.model_cap),
    )


# ----------------------------------------------------------------------------------------------- decoding


def padded_width(tokens: int) -> int:
    """The padded length for ``tokens`` positions: a power of two, at least 16 (few compiled shapes)."""
    return max(_MIN_WIDTH, 1 << max(0, tokens - 1).bit_length())


def length_batches(lengths: Sequence[int], batch_size: int) -> list[tuple[list[int], int, int]]:
    """Group sentence indices by padded width: ``(indices, width, rows)`` with ``rows`` the padded batch size.

    ``rows`` is ``batch_size`` for full batches and the next power of two for a last partial one, so a width
    compiles at most ``log2(batch_size) + 1`` shapes.
    """
    by_width: dict[int, list[int]] = {}
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        by_width.setdefault(padded_width(lengths[i]), []).append(i)
    out = []
    for width, idx in sorted(by_width.items()):
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            out.append((chunk, width, min(batch_size, 1 << (len(chunk) - 1).bit_length())))
    return out


def pad_rows(rows: list[list[int]], width: int, num_rows: int, eos_id: int, pad_id: int):
    """``(ids [R, width] int32, mask [R, width] bool)``: each row's tokens then ``</s>``; missing rows repeat
    the first (their results are dropped)."""
    ids = np.full((num_rows, width), pad_id, np.int32)
    mask = np.zeros((num_rows, width), bool)
    for r in range(num_rows):
        toks = rows[r] if r < len(rows) else rows[0]
        ids[r, : len(toks)] = toks
        ids[r, len(toks)] = eos_id
        mask[r, : len(toks) + 1] = True
    return ids, mask


def _token_strings(vocab, ids: Sequence[int]) -> list[str]:
    """One display string per target id (the word itself for word-level vocabularies)."""
    if getattr(vocab, "word_level", False):
        return [vocab.tokens[i] for i in ids]
    return [vocab.decode([i]) or "?" for i in ids]


def translate_sentences(
    loaded: LoadedModel,
    sentences: Sequence[str],
    *,
    beam_size: int = 12,
    alpha: float = 0.6,
    beta: float = 0.0,
    nbest: int = 1,
    batch_size: int = 32,
    limit=None,
    replace_unk: bool = False,
    progress: Callable[[int, int, float], None] | None = None,
) -> list[list[Translation]]:
    """Beam-search translations of ``sentences``: for each, its ``nbest`` best hypotheses, best first.

    Sentences are sorted by length and batched at a few padded widths (:func:`length_batches`), each source
    ending in ``</s>`` as in training. A sentence of ``n`` tokens may produce ``limit.tokens(n)`` tokens (then
    ``</s>``), no more than the model can (:func:`model_length_cap`); each :class:`Translation` says its limit
    and whether it stopped there (:func:`length_limit_report` counts them). A blank sentence gets ``nbest``
    empty hypotheses (score 0) without decoding, so that an n-best list has ``nbest`` lines for it too.

    Args:
      loaded: the model and vocabularies (:func:`load_model`).
      sentences: source sentences, whitespace-tokenised like the training corpus.
      beam_size, alpha, beta: beam size and GNMT's length-normalisation / coverage-penalty weights.
      nbest: hypotheses returned per sentence (``<= beam_size``).
      batch_size: sentences per decoding batch.
      limit: an ``attn_jax.decoding.LengthLimit``; None: the run's default, :func:`length_limit`.
      replace_unk: replace a produced ``<unk>`` with the most-attended source token (word-level vocabularies
        and models with attention only; otherwise ``<unk>`` stays).
      progress: called after each batch with the sentences decoded so far, their total and the fraction of
        the work done (source tokens, the longer sentences come last).

    Returns:
      ``len(sentences)`` lists of :class:`Translation`.
    """
    from attn_jax.decoding import beam_search

    rule = length_limit(loaded.config) if limit is None else limit
    try:
        rule.check()
    except ValueError as e:
        raise TranslateError(str(e)) from None
    # A model with a fixed-size decoder cache (the Transformer's ``max_length``) cannot emit more tokens.
    cap = model_length_cap(loaded.model)
    if not 1 <= nbest <= beam_size:
        raise TranslateError(f"--nbest must be between 1 and the beam size {beam_size}, got {nbest}")
    if batch_size < 1:
        raise TranslateError(f"batch size must be >= 1, got {batch_size}")
    src_vocab, tgt_vocab = loaded.src_vocab, loaded.tgt_vocab
    word_level = getattr(src_vocab, "word_level", False) and getattr(tgt_vocab, "word_level", False)
    encoded = [src_vocab.encode(s) for s in sentences]
    if word_level:
        source_tokens = [s.split() for s in sentences]
    else:
        source_tokens = [_token_strings(src_vocab, ids) for ids in encoded]
    results: list[list[Translation]] = [[] for _ in sentences]
    todo = [i for i, ids in enumerate(encoded) if ids]
    for i in range(len(sentences)):
        if not encoded[i]:
            results[i] = [Translation("", [], [], 0.0, 0.0, None, [])] * nbest
    lengths = [len(encoded[i]) + 1 for i in todo]
    work_total, work_done, done = max(sum(lengths), 1), 0, 0
    for chunk, width, rows in length_batches(lengths, batch_size):
        members = [todo[c] for c in chunk]
        src, mask = pad_rows([encoded[i] for i in members], width, rows, src_vocab.eos_id, src_vocab.pad_id)
        # Tokens with </s>: per sentence, and the static width from the padded width (few compiled shapes).
        width_limit = rule.tokens(width - 1) + 1
        limits = [rule.tokens(len(encoded[i])) + 1 for i in members]
        limits += [limits[0]] * (rows - len(members))  # the padding rows repeat the first sentence
        if cap:
            width_limit, limits = min(width_limit, cap), [min(n, cap) for n in limits]
        try:
            out = beam_search(
                loaded.model,
                src,
                mask,
                beam_size=beam_size,
                num_return=nbest,
                max_length=width_limit,
                limits=np.asarray(limits, np.int32),
                length_penalty_alpha=alpha,
                coverage_penalty_beta=beta,
                bos_id=tgt_vocab.bos_id,
                eos_id=tgt_vocab.eos_id,
                pad_id=tgt_vocab.pad_id,
            )
        except ValueError as e:
            raise TranslateError(str(e).splitlines()[0]) from None
        tokens, lens = np.asarray(out.tokens), np.asarray(out.lengths)
        scores, log_probs = np.asarray(out.scores), np.asarray(out.log_probs)
        truncated = np.asarray(out.truncated)
        attention = None if out.attention is None else np.asarray(out.attention)
        for r, i in enumerate(members):
            n = len(encoded[i])
            hyps = []
            for k in range(nbest):
                length = int(lens[r, k])
                if length == 0:  # an empty n-best slot (too few hypotheses fit the length limit)
                    continue
                ids = [int(t) for t in tokens[r, k, : length - 1]]
                words = _token_strings(tgt_vocab, ids)
                attn = None if attention is None else attention[r, k, :length, : n + 1]
                if replace_unk and word_level and attn is not None:
                    words = [
                        source_tokens[i][int(np.argmax(attn[j, :n]))] if t == tgt_vocab.unk_id else w
                        for j, (t, w) in enumerate(zip(ids, words, strict=True))
                    ]
                text = " ".join(words) if word_level else tgt_vocab.decode(ids)
                hyps.append(
                    Translation(
                        text,
                        words,
                        ids,
                        float(scores[r, k]),
                        float(log_probs[r, k]),
                        attn,
                        source_tokens[i],
                        bool(truncated[r, k]),
                        limits[r] - 1,
                    )
                )
            results[i] = hyps
        done += len(members)
        work_done += sum(lengths[c] for c in chunk)
        if progress is not None:
            progress(done, len(todo), work_done / work_total)
    return results


# -------------------------------------------------------------------------------------------------- CLI


def add_translate_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``translate`` subcommand to an ``argparse`` subparsers object; its handler is :func:`run_translate`."""
    from attn_jax._help import summary

    p = subparsers.add_parser(
        "translate",
        help="translate sentences with a trained run (beam search), optionally with alignments",
        description=summary(__doc__),
        epilog=(
            "Output: one line per input line (blank in, blank out); --nbest K: K Moses n-best lines "
            "'i ||| text ||| score ||| log_prob' per input; --alignment pharaoh appends ' ||| i-j ...' "
            "(source i, target j, 0-based); --alignment json writes one JSON object per input line. <unk> is "
            "passed through unless --replace-unk copies the most-attended source word. Standard input from a "
            "terminal or pipe is read as it arrives: each typed line is answered at once (lines already there "
            "are batched, up to --batch-size); a file is read whole and batched. Exit status: 0 done, "
            "1 missing run/checkpoint or empty input, 2 bad flag."
        ),
    )
    p.add_argument("--workdir", required=True, metavar="DIR", help="the training run's directory")
    p.add_argument(
        "--input",
        default="-",
        metavar="FILE",
        help="source sentences, one a line ('-': stdin, the default; from a terminal or pipe each line is "
        "translated as soon as it arrives); lines end at \\n only (a trailing \\r is dropped); "
        "\\f, \\v, \\r, U+2028 and other separators inside a line are whitespace",
    )
    p.add_argument("--output", default="-", metavar="FILE", help="where to write ('-': stdout)")
    p.add_argument(
        "--beam", type=int, default=12, metavar="K", help="beam size (default: %(default)s; 1: greedy)"
    )
    p.add_argument(
        "--alpha", type=float, default=0.6, help="GNMT length-normalisation weight α (default: %(default)s)"
    )
    p.add_argument(
        "--beta", type=float, default=0.0, help="GNMT coverage-penalty weight β (default: %(default)s)"
    )
    p.add_argument("--nbest", type=int, default=1, metavar="N", help="write the N best (Moses n-best format)")
    p.add_argument(
        "--alignment", choices=("pharaoh", "json"), default=None, help="also write attention alignments"
    )
    p.add_argument(
        "--checkpoint",
        type=parse_checkpoint,
        default="best",
        metavar="best|last|STEP",
        help="which checkpoint (default: %(default)s = lowest validation loss; the latest, with a warning on "
        "stderr, when no kept checkpoint has been evaluated)",
    )
    p.add_argument(
        "--replace-unk",
        action="store_true",
        help="replace a produced <unk> by the most-attended source word (Luong et al. 2015)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="sentences per decoding batch (default: %(default)s); streamed stdin: at most this many of the "
        "lines already there, never waiting for more",
    )
    p.add_argument(
        "--progress",
        choices=("auto", "bar", "lines"),
        default="auto",
        help="decoding progress of a file on stderr: a bar (redrawn in place) or a line every 10 s, with rate "
        "and ETA (default: %(default)s = a bar when stderr is a terminal, nothing otherwise; never for "
        "streamed stdin)",
    )
    add_length_limit_flags(p)
    p.set_defaults(func=run_translate)
    return p


def add_length_limit_flags(p: argparse.ArgumentParser) -> None:
    """The length-limit flags ``translate`` and ``evaluate`` share (resolved by :func:`length_limit`)."""
    # Defaults stay None here (so that giving --max-length with a ratio can be refused); the numbers in the
    # help are attn_jax.decoding.DEFAULT_MAX_LENGTH_RATIO / _OFFSET (tests/test_decode_limits.py checks).
    g = p.add_argument_group(
        "length limit",
        "a translation of a source of n tokens may have max(T, floor(ratio*n) + offset) tokens (then </s>), "
        "T = the longest target the run trained on (data.max_target_length); translations that stop at the "
        "limit instead of </s> are counted on stderr",
    )
    g.add_argument(
        "--max-length",
        type=int,
        default=None,
        metavar="N",
        help="give every sentence N tokens instead (not with --max-length-ratio/--max-length-offset)",
    )
    g.add_argument(
        "--max-length-ratio",
        type=float,
        default=None,
        metavar="R",
        help="tokens per source token (default: 2)",
    )
    g.add_argument(
        "--max-length-offset",
        type=int,
        default=None,
        metavar="C",
        help="tokens added to floor(ratio*n) (default: 10)",
    )


def quiet_checkpoint_logs() -> None:
    """Silence orbax's read-only-directory warnings on stderr (the CLI's stderr carries only its own errors)."""
    try:
        from absl import logging as absl_logging
    except ImportError:  # pragma: no cover - absl comes with orbax
        return
    absl_logging.set_verbosity(absl_logging.ERROR)


def _error(message: str, status: int = 1) -> int:
    print(f"attn-jax translate: error: {' '.join(str(message).split())}", file=sys.stderr)
    return status


def split_lines(text: str) -> list[str]:
    """Input lines as the corpus reader sees them: split on ``\\n`` only, each stripped of surrounding whitespace.

    A trailing ``\\r`` (CRLF files) goes with the stripping. Every other character Python counts as a line
    break (``\\r``, ``\\v``, ``\\f``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028, U+2029) stays inside its line, where
    it separates tokens like a space (tokenisation is ``str.split()``, as in training): so line ``k`` of the
    output always belongs to line ``k`` of the input. A final ``\\n`` ends the last line; it does not start one.
    """
    if not text:
        return []
    if text.endswith("\n"):
        text = text[:-1]
    return [line.strip() for line in text.split("\n")]


def _read_lines(path: str) -> list[str]:
    """Lines of ``path`` (``-``: stdin) by :func:`split_lines`, without a byte-order mark."""
    try:
        if path == "-":
            raw = getattr(sys.stdin, "buffer", None)  # bytes: no universal-newline translation of a lone \r
            data = raw.read() if raw is not None else sys.stdin.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except FileNotFoundError:
        raise TranslateError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise TranslateError(
            f"{path}: invalid UTF-8 (byte {e.object[e.start]:#04x} at offset {e.start})"
        ) from None
    except OSError as e:
        raise TranslateError(f"{path}: {e.strerror or e}") from None
    lines = split_lines(text.removeprefix("\ufeff"))
    if not any(lines):
        raise TranslateError(f"{'stdin' if path == '-' else path}: no sentences to translate (empty input)")
    return lines


def stream_fd(stream) -> int | None:
    """The file descriptor to read ``stream`` (stdin) from as lines arrive, or None to read it whole: a regular
    file (``< big.txt``: batched by length, with progress) or a stream without one (a ``StringIO``)."""
    try:
        fd = stream.fileno()
        return None if stat.S_ISREG(os.fstat(fd).st_mode) else fd
    except (AttributeError, OSError, ValueError):
        return None


class LineStream:
    """Lines of a terminal or pipe as they arrive, by :func:`split_lines`' rules (``\\n`` ends a line; each is
    stripped; a byte-order mark at the start is dropped), in groups that never wait for more input.

    The descriptor is read directly (not through ``sys.stdin``'s buffer), so that ``select`` tells truly
    whether more input is there: :meth:`batches` waits for a first line, then adds only lines that have
    already arrived, so a line typed at a terminal is answered at once and a fast pipe still fills batches.
    """

    def __init__(self, fd: int, name: str = "stdin"):
        self.fd, self.name = fd, name
        self.sentences = 0  # non-blank lines read
        self._buf = bytearray()
        self._eof = False
        self._offset = 0  # bytes of the stream before _buf (for the offset of invalid UTF-8)

    def _fill(self, wait: bool) -> bool:
        """Append what the descriptor has (without ``wait``: only if that cannot block); False if nothing."""
        if not wait:
            try:
                ready, _, _ = select.select([self.fd], [], [], 0)
            except (OSError, ValueError):  # no select for this descriptor: answer what is pending
                return False
            if not ready:
                return False
        try:
            chunk = os.read(self.fd, 1 << 16)
        except OSError as e:
            raise TranslateError(f"{self.name}: {e.strerror or e}") from None
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    def _next_line(self) -> str | None:
        """The next complete line in the buffer (at the end of input, also an unterminated last one), or None."""
        end = self._buf.find(b"\n")
        if end < 0:
            if not (self._eof and self._buf):
                return None
            end = len(self._buf)
        raw, start = bytes(self._buf[:end]), self._offset
        del self._buf[: end + 1]
        self._offset += end + 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TranslateError(
                f"{self.name}: invalid UTF-8 (byte {e.object[e.start]:#04x} at offset {start + e.start})"
            ) from None
        line = (text.removeprefix("\ufeff") if start == 0 else text).strip()
        self.sentences += bool(line)
        return line

    def batches(self, most: int) -> Iterator[list[str]]:
        """Groups of at most ``most`` lines, in order, until the end of input: each waits for its first line,
        then takes only the lines already there."""
        failure = None
        while failure is None:
            batch: list[str] = []
            try:
                while len(batch) < most:
                    line = self._next_line()
                    if line is not None:
                        batch.append(line)
                    elif self._eof or not (self._fill(wait=not batch) or self._eof):
                        break
            except TranslateError as e:  # the lines before an unreadable one are still answered
                failure = e
            if batch:
                yield batch
            elif failure is None:
                return
        raise failure


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def format_translations(
    index: int, source: str, hyps: list[Translation], *, nbest: bool, alignment: str | None
) -> list[str]:
    """The output lines for one input sentence (see the module docstring for the formats)."""
    if alignment == "json":
        obj = {
            "index": index,
            "source": source,
            "translation": hyps[0].text if hyps else "",
            "hypotheses": [
                {
                    "translation": h.text,
                    "tokens": h.tokens,
                    "score": _finite(h.score),
                    "log_prob": _finite(h.log_prob),
                    "alignment": h.alignment(),
                    "attention": None if h.attention is None else np.round(h.attention, 6).tolist(),
                    "limit": h.limit,
                    "stopped_at_limit": h.truncated,
                }
                for h in hyps
            ],
        }
        # json leaves \x85, U+2028 and U+2029 raw; escape them so no line-splitting reader breaks the line.
        line = json.dumps(obj, ensure_ascii=False, allow_nan=False)
        return [line.replace("\x85", "\\u0085").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")]
    if not nbest:
        h = hyps[0] if hyps else Translation("", [], [], 0.0, 0.0, None, [])
        return [h.text if alignment is None else f"{h.text} ||| {h.alignment()}"]
    lines = []
    for h in hyps:
        fields = [str(index), h.text, f"{h.score:.6f}", f"{h.log_prob:.6f}"]
        if alignment == "pharaoh":
            fields.append(h.alignment())
        lines.append(" ||| ".join(fields))
    return lines


def run_translate(args: argparse.Namespace) -> int:
    """Run ``attn-jax translate`` with parsed arguments; returns the exit status."""
    if args.beam < 1:
        return _error(f"--beam must be >= 1, got {args.beam}", 2)
    if not 1 <= args.nbest <= args.beam:
        return _error(f"--nbest must be between 1 and --beam {args.beam}, got {args.nbest}", 2)
    for flag, value in (("--alpha", args.alpha), ("--beta", args.beta)):
        if not (math.isfinite(value) and value >= 0):
            return _error(f"{flag} must be a finite number >= 0, got {value}", 2)
    if args.batch_size < 1:
        return _error(f"--batch-size must be >= 1, got {args.batch_size}", 2)
    problem = length_flags_problem(args.max_length, args.max_length_ratio, args.max_length_offset)
    if problem:
        return _error(problem, 2)
    quiet_checkpoint_logs()
    fd = None
    try:
        # A file is read before the (slow) model load, so that its errors come at once; stdin after it, so that
        # the first line typed is answered without waiting for the load.
        lines = None if args.input == "-" else _read_lines(args.input)
        loaded = load_model(args.workdir, args.checkpoint)
        if loaded.note:
            print(f"attn-jax translate: warning: {loaded.note}", file=sys.stderr)
        rule = length_limit(
            loaded.config,
            max_length=args.max_length,
            max_length_ratio=args.max_length_ratio,
            max_length_offset=args.max_length_offset,
        )
        if lines is None:
            fd = stream_fd(sys.stdin)
            if fd is None:
                lines = _read_lines("-")
    except TranslateError as e:
        return _error(e)
    options = dict(
        beam_size=args.beam,
        alpha=args.alpha,
        beta=args.beta,
        nbest=args.nbest,
        batch_size=args.batch_size,
        limit=rule,
        replace_unk=args.replace_unk,
    )
    if fd is not None:
        return _translate_stream(args, loaded, rule, options, LineStream(fd))
    bar = _progress_line(args.progress)
    try:
        progress = None
        if bar is not None:
            from attn_jax.cli_evaluate import decode_progress

            progress = decode_progress(bar)
            progress(0, sum(bool(s) for s in lines), 0.0)
        results = translate_sentences(loaded, lines, progress=progress, **options)
    except TranslateError as e:
        return _error(e)
    finally:
        if bar is not None:
            bar.close()
    _warn_length_limit(length_limit_report(loaded, lines, results, rule))
    text = _format(lines, results, 0, args)
    if args.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            return _error(f"{args.output}: cannot write: {e.strerror or e}")
    return 0


def _progress_line(progress: str):
    """A ``ProgressLine`` on stderr for ``--progress`` (``auto``: a bar on a terminal, else None: the stderr of
    a script carries only errors and warnings)."""
    if progress == "auto" and not getattr(sys.stderr, "isatty", lambda: False)():
        return None
    from attn_jax.train import ProgressLine

    return ProgressLine(sys.stderr, tty=progress != "lines", label="decoding", every_s=10.0)


def _warn_length_limit(report: LengthLimitReport | None) -> None:
    warning = report.message() if report is not None else None
    if warning:
        print(f"attn-jax translate: warning: {warning}", file=sys.stderr)


def _format(sources: Sequence[str], results, first: int, args: argparse.Namespace) -> str:
    """The output text of ``sources`` (input lines ``first``, ``first + 1``, ...) and their translations."""
    return "".join(
        line + "\n"
        for i, (source, hyps) in enumerate(zip(sources, results, strict=True), first)
        for line in format_translations(i, source, hyps, nbest=args.nbest > 1, alignment=args.alignment)
    )


def _translate_stream(
    args: argparse.Namespace, loaded: LoadedModel, rule, options: dict[str, Any], source: LineStream
) -> int:
    """Translate stdin as it arrives, writing and flushing each group's output before reading on; the
    length-limit summary comes at the end (also when an unreadable line stops the stream)."""
    try:
        if args.output == "-":
            out = sys.stdout
        else:
            os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
            out = open(args.output, "w", encoding="utf-8")  # closed below
    except OSError as e:
        return _error(f"{args.output}: cannot write: {e.strerror or e}")
    report, done = None, 0
    try:
        for batch in source.batches(args.batch_size):
            results = translate_sentences(loaded, batch, **options)
            report = merge_length_limit_reports(report, length_limit_report(loaded, batch, results, rule))
            out.write(_format(batch, results, done, args))
            out.flush()
            done += len(batch)
        if not source.sentences:
            raise TranslateError(f"{source.name}: no sentences to translate (empty input)")
    except TranslateError as e:
        _warn_length_limit(report)
        return _error(e)
    except OSError as e:
        return _error(f"{'stdout' if args.output == '-' else args.output}: cannot write: {e.strerror or e}")
    finally:
        if out is not sys.stdout:
            out.close()
    _warn_length_limit(report)
    return 0
