"""``attn-jax translate``: translate sentences with a trained run's checkpoint (beam search), optionally aligned.

    attn-jax translate --workdir runs/rnnsearch_cpu --input test.en --output test.out
    echo "the dog slept ." | attn-jax translate --workdir runs/rnnsearch_cpu --beam 12 --alpha 0.6
    attn-jax translate --workdir runs/X --input - --nbest 4              # Moses n-best: i ||| text ||| score
    attn-jax translate --workdir runs/X --alignment pharaoh               # text ||| 0-0 1-2 ...
    attn-jax translate --workdir runs/X --alignment json                  # one JSON object per input line
    attn-jax translate --workdir runs/X --sample --top-p 0.9 --seed 1     # a random translation per line

Input: one sentence per line (UTF-8, already tokenised as the training corpus: whitespace tokens); a blank line
gives a blank translation (nothing is decoded), so output line ``k`` always belongs to input line ``k``. Lines
end at ``\\n`` only, as in the corpus reader (``\\r\\n`` works too); any other line or paragraph separator inside a
line (``\\r``, ``\\f``, ``\\v``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028, U+2029) is whitespace between tokens. The
checkpoint is the run's best one by its ``checkpoint.best_metric``, validation loss by default
(``--checkpoint best``, the default; the latest, with a warning on stderr, when no kept checkpoint has been
evaluated), the latest (``last``) or a given step; the
vocabularies are the run's own (``workdir/vocab``). A best or latest checkpoint that cannot be read (a truncated
or deleted file) is skipped for the next best or newest one that loads, with a warning on stderr naming the
damaged step; when none loads, or the step asked for cannot be read, the error names each step and why.
``--weights ema`` translates with the checkpoint's moving average of the weights (a run trained with
``optimizer.ema_decay > 0``); on a checkpoint without one it is a one-line error.

Streaming: the model is loaded first; then standard input from a terminal or a pipe is read as it arrives: a line
typed at a terminal (or written to the pipe) is translated, and its output written and flushed, before the next one
is read. Lines that have already arrived are translated together, up to ``--batch-size`` at a time, but a pending
line never waits for more input, so ``cat big.txt | attn-jax translate`` still decodes in full batches. A file
(``--input FILE``, or standard input redirected from a regular file) is read whole and batched by length;
``--progress bar`` or ``lines`` then shows the sentences done, their rate and an ETA on stderr (``auto``, the
default: a bar when stderr is a terminal, nothing otherwise), as ``attn-jax evaluate`` does. Either way the
length-limit summary comes once, at the end of the input.

Output formats:

* plain: the best translation, one line per input line;
* ``--nbest K``: Moses n-best lists, ``K`` lines per input line ``i ||| translation ||| score ||| log_prob``
  (``i`` 0-based, best first; ``score`` is the normalised beam score ``log P / lp + cp``);
* ``--alignment pharaoh``: ``translation ||| i-j i-j ...`` (with ``--nbest`` appended as a fifth field): for
  every target word ``j`` the source word ``i`` it attends to most (0-based token positions, ``</s>`` on
  either side left out; word positions for the word-level vocabularies of the built-in corpus);
* ``--alignment json``: one JSON object per input line, ``{"index", "source", "translation", "source_tokens",
  "source_unk", "hypotheses": [{"translation", "tokens", "score", "log_prob", "alignment", "attention", "limit", "stopped_at_limit"}]}``
  with ``attention`` the ``[m + 1, n + 1]`` weights (rows: the ``m`` target words then ``</s>``; columns: the
  ``n`` source tokens then ``</s>``), ``limit`` the most tokens the sentence could have and
  ``stopped_at_limit`` whether this hypothesis was cut there; ``source_tokens`` are the source tokens as the model
  reads them and ``source_unk`` the positions among them that the source vocabulary maps to ``<unk>``.

Layers and heads: a multi-head model's alignments are its last decoder layer's cross-attention, averaged over
heads. ``--attention-layer L`` and ``--attention-head H`` (with ``--alignment``) pick another layer or one head,
read by teacher-forcing each decoded hypothesis. The user guide's evaluation page (``docs/evaluation.md``)
explains both.

Length limit: ``--max-length``, ``--max-length-ratio`` and ``--max-length-offset`` bound each translation, as
in ``attn-jax evaluate``. The rule and its defaults are :class:`attn_jax.decoding.LengthLimit`'s; the user
guide's decoding page (``docs/decoding.md``) explains the flags and the warning for a cut translation.

Forced output: ``--prefix FILE`` gives each input line a target prefix that its translation starts with, and
``--constraints FILE`` phrases (separated by tabs) that its translation must contain; each file has one line
per input line, and the input is then read whole. The user guide's decoding page explains both.

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
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from attn_jax.cli._errors import error_line
from attn_jax.pipeline import (
    WEIGHTS,
    AttentionChoiceError,
    LengthLimitReport,
    LoadedModel,
    TranslateError,
    Translation,
    choose_attention,
    decode_progress,
    length_limit_report,
    load_ensemble,
    merge_length_limit_reports,
    quiet_checkpoint_logs,
    translate_sentences,
)

__all__ = [
    "LineStream",
    "add_length_limit_flags",
    "add_translate_parser",
    "format_translations",
    "parse_checkpoint",
    "run_translate",
    "split_lines",
    "stream_fd",
]

_BEAM = 12  # the default beam size


def parse_checkpoint(value: str) -> str | int:
    """``best``, ``last`` or a non-negative step number (argparse type)."""
    if value in ("best", "last"):
        return value
    if value.isdigit():
        return int(value)
    raise argparse.ArgumentTypeError(f"expected best, last or a step number, got {value!r}")


def add_translate_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``translate`` subcommand to an ``argparse`` subparsers object; its handler is :func:`run_translate`."""
    from attn_jax.cli._help import summary

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
    from attn_jax.cli._options import add_workdir_flag

    add_workdir_flag(p)
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
        "--beam", type=int, default=None, metavar="K", help=f"beam size (default: {_BEAM}; 1: greedy)"
    )
    p.add_argument(
        "--alpha", type=float, default=0.6, help="GNMT length-normalisation weight α (default: %(default)s)"
    )
    p.add_argument(
        "--beta", type=float, default=0.0, help="GNMT coverage-penalty weight β (default: %(default)s)"
    )
    p.add_argument("--nbest", type=int, default=1, metavar="N", help="write the N best (Moses n-best format)")
    add_repetition_flags(p)
    add_sampling_flags(p)
    add_forcing_flags(p)
    p.add_argument(
        "--alignment", choices=("pharaoh", "json"), default=None, help="also write attention alignments"
    )
    from attn_jax.cli._options import add_attention_flags

    add_attention_flags(p, "--alignment")
    p.add_argument(
        "--checkpoint",
        type=parse_checkpoint,
        default="best",
        metavar="best|last|STEP",
        help="which checkpoint (default: %(default)s = best by the run's checkpoint.best_metric, lowest "
        "validation loss by default; the latest, with a warning on stderr, when no kept checkpoint has been "
        "evaluated)",
    )
    p.add_argument(
        "--weights",
        choices=WEIGHTS,
        default="raw",
        help="the checkpoint's trained parameters (raw, the default) or their moving average (ema: a run "
        "trained with optimizer.ema_decay > 0)",
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


def _non_negative_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {n}")
    return n


def add_repetition_flags(p: argparse.ArgumentParser) -> None:
    """The repetition-control flags ``translate`` and ``evaluate`` share (``attn_jax.decoding.beam_search``)."""
    p.add_argument(
        "--no-repeat-ngram",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="never repeat an N-gram within a translation (its completing word gets probability 0; "
        "default: 0, off)",
    )
    p.add_argument(
        "--min-length",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="no </s> before N target tokens; the length limit still ends a translation (default: 0, off)",
    )


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """The flags that draw translations instead of searching (``attn_jax.decoding.sample_decode``)."""
    g = p.add_argument_group(
        "sampling",
        "--sample draws each translation word by word from the model (temperature, then top-k, then top-p) "
        "instead of beam search (--alpha and --beta do not apply); the same --seed gives the same output",
    )
    g.add_argument(
        "--sample", action="store_true", help="sample translations (not with --beam > 1 or --nbest)"
    )
    g.add_argument(
        "--temperature",
        type=float,
        default=None,
        metavar="T",
        help="divide the log-probabilities by T > 0: below 1 sharpens, above 1 flattens (default: 1)",
    )
    g.add_argument(
        "--top-k",
        type=int,
        default=None,
        metavar="K",
        help="draw among the K most probable words (default: 0, all)",
    )
    g.add_argument(
        "--top-p",
        type=float,
        default=None,
        metavar="P",
        help="draw from the fewest most probable words whose probability sums to P, in (0, 1] "
        "(default: 1, all)",
    )
    g.add_argument("--seed", type=int, default=None, metavar="S", help="the seed of the draws (default: 0)")
    g.add_argument(
        "--num-samples",
        type=int,
        default=None,
        metavar="N",
        help="N samples per input line, written as an n-best list, most probable first (default: 1)",
    )


def resolve_sampling_flags(args: argparse.Namespace) -> str | None:
    """Check the sampling flags: a one-line problem naming the flag, or None.

    Without ``--sample`` the sampling flags are refused and ``--beam`` defaults to 12. With it, ``--beam``
    (at most 1) and ``--nbest`` (not given) become ``--num-samples``: the hypotheses per line written.
    """
    flags = ("--temperature", "--top-k", "--top-p", "--seed", "--num-samples")
    given = [f for f in flags if getattr(args, f[2:].replace("-", "_")) is not None]
    if not args.sample:
        if given:
            return f"{given[0]} applies to sampling only: add --sample"
        args.beam = _BEAM if args.beam is None else args.beam
        return None
    if args.beam is not None and args.beam != 1:
        return f"--beam {args.beam} cannot be combined with --sample (sampling draws, it does not search)"
    if args.nbest != 1:
        return "--nbest cannot be combined with --sample: use --num-samples N"
    checks = (
        ("--temperature", args.temperature, lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
        ("--top-k", args.top_k, lambda v: v >= 0, "an int >= 0"),
        ("--top-p", args.top_p, lambda v: 0 < v <= 1, "a number in (0, 1]"),
        ("--seed", args.seed, lambda v: v >= 0, "an int >= 0"),
        ("--num-samples", args.num_samples, lambda v: v >= 1, "an int >= 1"),
    )
    for flag, value, ok, rule in checks:
        if value is not None and not ok(value):
            return f"{flag} must be {rule}, got {value}"
    args.beam = args.nbest = args.num_samples or 1
    return None


def _sampling_options(args: argparse.Namespace) -> dict[str, Any]:
    """``translate_sentences``' ``sampling`` keyword from the flags (empty without ``--sample``)."""
    if not args.sample:
        return {}
    from attn_jax.decoding import Sampling

    defaults = Sampling()
    return {
        "sampling": Sampling(
            temperature=defaults.temperature if args.temperature is None else args.temperature,
            top_k=defaults.top_k if args.top_k is None else args.top_k,
            top_p=defaults.top_p if args.top_p is None else args.top_p,
            seed=defaults.seed if args.seed is None else args.seed,
        )
    }


def add_forcing_flags(p: argparse.ArgumentParser) -> None:
    """``--prefix`` and ``--constraints``: per-line target prefixes and lexical constraints (docs/decoding.md)."""
    g = p.add_argument_group(
        "forced output",
        "files with one line per input line (the input is then read whole, and the line counts must match)",
    )
    g.add_argument(
        "--prefix",
        default=None,
        metavar="FILE",
        help="target prefixes: each translation starts with its line's prefix and goes on from there "
        "(a blank line: no prefix)",
    )
    g.add_argument(
        "--constraints",
        default=None,
        metavar="FILE",
        help="lexical constraints: phrases, separated by tabs, that must appear in the line's translation "
        "(dynamic beam allocation; a blank line: none); translations the length limit left without a "
        "constraint are counted on stderr",
    )


def _forcing_options(args: argparse.Namespace, lines: list[str]) -> dict[str, Any]:
    """``translate_sentences``' ``prefixes`` and ``constraints`` from ``--prefix``/``--constraints``, or a
    TranslateError naming both files when a file's line count differs from the input's."""
    options: dict[str, Any] = {}
    for flag, key in (("--prefix", "prefixes"), ("--constraints", "constraints")):
        path = getattr(args, flag[2:])
        if path is None:
            continue
        try:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8").removeprefix("\ufeff")
        except (OSError, UnicodeDecodeError) as e:
            raise TranslateError(f"{flag} {path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
        # Split on \n only; tabs separate constraints, so lines are not stripped of them here.
        rows = text[:-1].split("\n") if text.endswith("\n") else text.split("\n") if text else []
        if len(rows) != len(lines):
            source = "stdin" if args.input == "-" else args.input
            raise TranslateError(
                f"{flag} {path} has {len(rows)} lines but the input {source} has {len(lines)}: one per input line"
            )
        if key == "prefixes":
            options[key] = [row.strip() for row in rows]
        else:
            options[key] = [[c.strip() for c in row.rstrip("\r").split("\t") if c.strip()] for row in rows]
    return options


def _warn_constraints(results) -> None:
    """One stderr line counting the best translations that lack lexical constraints (never silent)."""
    decoded = [hyps[0] for hyps in results if hyps and hyps[0].limit is not None]
    lacking = [h.unmet_constraints for h in decoded if h.unmet_constraints]
    if lacking:
        print(
            f"attn-jax translate: warning: {len(lacking)} of {len(decoded)} translations lack {sum(lacking)} "
            "of their constraints (the length limit left no room for them): raise --max-length or "
            "--max-length-ratio",
            file=sys.stderr,
        )


def _error(message: object, status: int = 1) -> int:
    return error_line("translate", message, status)


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
            # the source tokens as the model read them, and which of them the vocabulary made <unk>
            "source_tokens": hyps[0].source_tokens if hyps else [],
            "source_unk": list(hyps[0].source_unk) if hyps else [],
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
                    "unmet_constraints": h.unmet_constraints,
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
    problem = resolve_sampling_flags(args)
    if problem:
        return _error(problem, 2)
    if args.sample and (args.prefix is not None or args.constraints is not None):
        flag = "--prefix" if args.prefix is not None else "--constraints"
        return _error(f"{flag} cannot be combined with --sample (forced output is a beam-search option)", 2)
    from attn_jax.cli._options import attention_choice, decode_options, flag_worded

    try:
        decode = decode_options(args)
    except TranslateError as e:
        return _error(e, 2)
    choice = attention_choice(args)
    if not choice.is_default and args.alignment is None:
        flag = "--attention-head" if choice.head is not None else "--attention-layer"
        return _error(f"{flag} chooses the attention of alignments: add --alignment pharaoh or json", 2)
    if args.batch_size < 1:
        return _error(f"--batch-size must be >= 1, got {args.batch_size}", 2)
    quiet_checkpoint_logs()
    fd = None
    try:
        # A file is read before the (slow) model load, so that its errors come at once; stdin after it, so that
        # the first line typed is answered without waiting for the load.
        lines = None if args.input == "-" else _read_lines(args.input)
        loaded = load_ensemble(args.workdir, args.checkpoint, args.weights)
        try:
            choice.check(loaded)
        except AttentionChoiceError as e:
            return _error(flag_worded(str(e)), 2)
        if loaded.note:
            print(f"attn-jax translate: warning: {loaded.note}", file=sys.stderr)
        rule = decode.length_limit(loaded.config)
        if lines is None:
            # Prefix and constraint lines pair with the input's, so the input is read whole.
            whole = args.prefix is not None or args.constraints is not None
            fd = None if whole else stream_fd(sys.stdin)
            if fd is None:
                lines = _read_lines("-")
        forcing = {} if lines is None else _forcing_options(args, lines)
    except TranslateError as e:
        return _error(e)
    options = dict(options=decode, batch_size=args.batch_size, limit=rule)
    options.update(_sampling_options(args))
    if fd is not None:
        return _translate_stream(args, loaded, rule, options, LineStream(fd), choice)
    bar = _progress_line(args.progress)
    try:
        progress = None
        if bar is not None:
            progress = decode_progress(bar)
            progress(0, sum(bool(s) for s in lines), 0.0)
        results = translate_sentences(loaded, lines, progress=progress, **options, **forcing)
        results = choose_attention(loaded, lines, results, choice, batch_size=args.batch_size)
    except TranslateError as e:
        return _error(e)
    finally:
        if bar is not None:
            bar.close()
    _warn_length_limit(length_limit_report(loaded, lines, results, rule))
    _warn_constraints(results)
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
    args: argparse.Namespace, loaded: LoadedModel, rule, options: dict[str, Any], source: LineStream, choice
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
            results = translate_sentences(loaded, batch, **options, first_index=done)
            results = choose_attention(loaded, batch, results, choice, batch_size=args.batch_size)
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
