"""``attn-jax evaluate``: BLEU overall, by source length and without ``<unk>``, AER and attention heatmaps of a run.

    attn-jax evaluate --workdir runs/rnnsearch_cpu --split test
    attn-jax evaluate --workdir runs/rnnsearch_cpu --split test --beam 12 --max-examples 140 --out /tmp/eval

Decodes the split with beam search (the run's best checkpoint; ``--weights ema``: its moving average of the
weights), scores it with sacreBLEU (overall, per source length bucket 0-9 ... 60+ as in Bahdanau et al. 2015,
Figure 2, and on the sentences without ``<unk>``, Table 1's "No UNK"; chrF and TER overall and by length too),
measures the alignment error rate of the attention against the corpus' gold alignments (built-in corpus; overall
and on the sentences within the training lengths), draws attention heatmaps chosen as the paper's Figure 3 is
(the longest sentences within the training lengths that the model translates exactly, plus one beyond them as the
failure case: :func:`figure3_examples`), prints the tables and writes them to ``--out`` (default
``workdir/eval/<split>``):

    sources.txt  references.txt  hypotheses.txt     the sentences, line-aligned (BLEU can be recomputed)
    references.detok.txt  hypotheses.detok.txt     with --detokenize moses: the detokenised text BLEU scored
    alignments.txt                                  Pharaoh links from teacher-forced attention (AER's input)
    aer_by_head.{md,json}                           a multi-head model's AER per decoder layer and head
    bleu_by_length.{md,json}  summary.{md,json}     the tables (JSON: fractions, null for an empty bucket;
                                                    summary.json's <system>.chrf/.ter: chrF, TER by length)
    evaluation.json  evaluation.md                  everything: scores, options, checkpoint, timings, pictures
    bleu_by_length.png  attention_<k>.png  attention_<k>_reference.png  attention_<k>_head.png
    attention.npz                                   with --save-attention: every sentence's attention, every
                                                    layer and head (what ``attn-jax report`` draws)

The PNGs also go to the run's TensorBoard log, ``workdir/tensorboard/eval``, as images tagged
``eval/<split>/<file name without .png>`` at the evaluated checkpoint's step (unless the run was trained with
``--config.tensorboard=false``).

Length limit: the same rule and flags as ``attn-jax translate`` (:class:`attn_jax.decoding.LengthLimit`). The
translations it cut are counted on stderr and in the reports; ``docs/decoding.md`` says where.

Empty sides: pairs of the split whose source or reference is empty are skipped by the corpus reader; their
count is a warning on stderr (``warning: 1 pair of data/test.en | data/test.fr with an empty source or reference
skipped (not translated, not scored)``) and is kept in ``summary.json`` (``<system>.skipped_empty``, 0 when
none), ``evaluation.json`` (``skipped_empty``), ``summary.md`` and ``evaluation.md``.

BLEU on real text: sacreBLEU's standard score (``tok:13a``) is defined on raw, untokenised text. A corpus
that is Moses-tokenised (``l' ordinateur , dit-il .``) is scored either detokenised (``--detokenize moses
--detokenize-lang fr``: sacremoses joins hypotheses and references back into running text, so the BLEU equals
sacreBLEU's on the raw text; the signature ends in ``|detok:moses-fr``) or on its tokens exactly as given
(``--bleu-tokenize none``, ``tok:none``: the flag for pre-tokenised data sets, not comparable with scores of raw
text). When the references of a corpus other than the built-in one look tokenised and neither flag was given,
one warning line on stderr says so and names both flags; the choice is kept in ``summary.json``
(``<system>.bleu_options``), ``evaluation.json`` and the signature. The built-in corpus is defined on its tokens
and is scored as it always was (``tok:13a``, no detokenisation, no warning).

Progress: decoding shows the sentences done, their rate and an ETA on stderr, as ``attn-jax train`` does:
``--progress bar`` (one line redrawn in place; the default on a terminal) or ``lines`` (a line every 10 s; the
default otherwise).

AER uses attention from teacher forcing on the *reference* (the gold aligns source and reference words, so the
attention of a decoded hypothesis cannot be scored against it): each reference word is linked to its
most-attended source word (``argmax_alignment``). ``attention_<k>.png`` shows the attention while the model
produced its own translation (the paper's Figure 3); ``attention_<k>_reference.png`` the teacher-forced
attention on the reference with the gold links drawn as red squares. For a multi-head model (the Transformer)
both show the last decoder layer's cross-attention averaged over heads, and ``attention_<k>_head.png`` its
sharpest single head (lowest mean entropy) on the model's own translation.

Layers and heads: ``--attention-layer L`` and ``--attention-head H`` pick the decoder layer and head whose
teacher-forced attention gives ``alignments.txt``, the AER and the reference heatmaps (default: the last layer,
mean of heads). A multi-head model on a corpus with gold alignments also gets the AER of every layer and head in
``aer_by_head.{md,json}``. The user guide's evaluation page (``docs/evaluation.md``) explains both.

Exit status: 0 done; 1 a missing workdir or checkpoint, an unreadable corpus or split; 2 a bad flag.
"""

from __future__ import annotations

import argparse
import os
import sys

from attn_jax.cli._errors import error_line
from attn_jax.cli._translate import add_length_limit_flags, add_repetition_flags, parse_checkpoint
from attn_jax.pipeline import (
    WEIGHTS,
    AttentionChoiceError,
    TranslateError,
    decode_progress,
    evaluate_workdir,
    quiet_checkpoint_logs,
)

__all__ = ["add_evaluate_parser", "run_evaluate"]


def add_evaluate_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``evaluate`` subcommand to an ``argparse`` subparsers object; its handler is :func:`run_evaluate`."""
    from attn_jax.cli._help import summary

    p = subparsers.add_parser(
        "evaluate",
        help="BLEU (overall, by length, No UNK), AER and attention heatmaps of a trained run",
        description=summary(__doc__),
        epilog=(
            "Writes sources/references/hypotheses.txt, bleu_by_length.{md,json}, summary.{md,json}, "
            "evaluation.{md,json} and PNGs to --out (default WORKDIR/eval/SPLIT). Exit status: 0 done, "
            "1 missing run/checkpoint or unreadable corpus, 2 bad flag."
        ),
    )
    from attn_jax.cli._options import add_workdir_flag

    add_workdir_flag(p)
    p.add_argument("--split", default="test", help="corpus split (default: %(default)s)")
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="output directory (default: WORKDIR/eval/SPLIT; an ensemble: the first run's eval/SPLIT-ensemble)",
    )
    p.add_argument("--beam", type=int, default=12, metavar="K", help="beam size (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=0.6, help="length-normalisation α (default: %(default)s)")
    p.add_argument("--beta", type=float, default=0.0, help="coverage-penalty β (default: %(default)s)")
    add_repetition_flags(p)
    p.add_argument(
        "--max-examples",
        type=int,
        default=None,
        metavar="N",
        help="at most N pairs, spread over length buckets",
    )
    p.add_argument(
        "--checkpoint",
        type=parse_checkpoint,
        default="best",
        metavar="best|last|STEP",
        help="(default: best)",
    )
    p.add_argument(
        "--weights",
        choices=WEIGHTS,
        default="raw",
        help="the checkpoint's trained parameters (raw, the default) or their moving average (ema: a run "
        "trained with optimizer.ema_decay > 0)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default: %(default)s)")
    p.add_argument(
        "--heatmaps", type=int, default=3, metavar="N", help="attention heatmaps (default: %(default)s)"
    )
    p.add_argument(
        "--heatmap-sentences",
        type=_indices,
        default=None,
        metavar="I,J,...",
        help="draw these sentences (0-based indices in the split) instead of the Figure 3 rule's choice",
    )
    p.add_argument(
        "--save-attention",
        action="store_true",
        help="also write attention.npz: every sentence's attention on its translation and its reference, "
        "every decoder layer and head, for `attn-jax report` (two teacher-forced passes more)",
    )
    p.add_argument(
        "--replace-unk", action="store_true", help="replace produced <unk> by the most-attended source word"
    )
    p.add_argument(
        "--progress",
        choices=("auto", "bar", "lines"),
        default="auto",
        help="decoding progress on stderr: a bar (redrawn in place) or a line every 10 s, with rate and ETA "
        "(default: %(default)s = bar on a terminal)",
    )
    p.add_argument(
        "--detokenize",
        choices=("none", "moses"),
        default="none",
        help="detokenise hypotheses and references before BLEU: 'moses' (sacremoses) for a Moses-tokenised corpus "
        "(\"l' ordinateur , dit-il .\"), so that the BLEU is sacreBLEU's standard score of the raw text; the "
        "signature then ends in |detok:moses-LANG (default: %(default)s)",
    )
    p.add_argument(
        "--detokenize-lang",
        default="en",
        metavar="LANG",
        help="the target language's Moses code for --detokenize moses: en, fr, de, ... (default: %(default)s)",
    )
    p.add_argument(
        "--bleu-tokenize",
        default=None,
        metavar="TOK",
        help="sacreBLEU's tokeniser: 13a, none, intl, char, ... (default: 13a); 'none' scores pre-tokenised "
        "text on its tokens exactly as given (tok:none; not comparable with scores of raw text). Without this "
        "flag or --detokenize, references that look tokenised get a one-line warning",
    )
    from attn_jax.cli._options import add_attention_flags

    add_attention_flags(p, "alignments.txt, the AER and the reference heatmaps")
    add_length_limit_flags(p)
    p.set_defaults(func=run_evaluate)
    return p


def _indices(value: str) -> list[int]:
    """``--heatmap-sentences``: comma-separated non-negative ints."""
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated sentence indices, got {value!r}"
        ) from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated sentence indices >= 0, got {value!r}")
    return out


def _error(message: object, status: int = 1) -> int:
    return error_line("evaluate", message, status)


def run_evaluate(args: argparse.Namespace) -> int:
    """Run ``attn-jax evaluate`` with parsed arguments; returns the exit status."""
    from attn_jax.cli._options import attention_choice, bleu_settings, decode_options, flag_worded

    try:
        decode, bleu = decode_options(args), bleu_settings(args)
    except TranslateError as e:
        return _error(e, 2)
    if args.max_examples is not None and args.max_examples < 1:
        return _error(f"--max-examples must be >= 1, got {args.max_examples}", 2)
    if args.batch_size < 1 or args.heatmaps < 0:
        return _error("--batch-size must be >= 1 and --heatmaps >= 0", 2)

    from attn_jax.data import CorpusError
    from attn_jax.train import ProgressLine

    quiet_checkpoint_logs()
    tty = {"auto": None, "bar": True, "lines": False}[args.progress]
    line = ProgressLine(sys.stderr, tty=tty, label="decoding", every_s=10.0)
    try:
        r = evaluate_workdir(
            args.workdir[0] if len(args.workdir) == 1 else args.workdir,
            split=args.split,
            decode=decode,
            bleu=bleu,
            max_examples=args.max_examples,
            out_dir=args.out,
            checkpoint=args.checkpoint,
            weights=args.weights,
            batch_size=args.batch_size,
            num_heatmaps=args.heatmaps,
            heatmap_sentences=args.heatmap_sentences,
            log=lambda *a: line.log(" ".join(str(x) for x in a)),
            progress=decode_progress(line),
            attention=attention_choice(args),
            save_attention=args.save_attention,
        )
    except AttentionChoiceError as e:
        line.close()
        return _error(flag_worded(str(e)), 2)
    except (TranslateError, CorpusError) as e:
        line.close()
        return _error(e)
    line.close()
    from attn_jax import eval as ev

    steps = [m["step"] for m in r.get("ensemble", [])] or [r["step"]]
    print(
        f"{r['system']} on {r['corpus']} ({r['split']}), checkpoint step{'s' if len(steps) > 1 else ''} "
        f"{', '.join(map(str, steps))}, beam {args.beam}"
    )
    print(
        f"\nBLEU by source length:\n\n{ev.bleu_by_length_markdown({r['system']: r['bleu_by_length_result']})}"
    )
    print(f"Summary:\n\n{ev.summary_markdown({r['system']: r['system_scores']})}")
    print(r["bleu_by_length_result"].overall)
    for m in ("chrf", "ter"):
        by_length = r[f"{m}_by_length"]
        print(
            f"{by_length['metric']} = {r[m]:.2f} ({r['num_sentences']} sentences; {by_length['signature']})"
        )
    if r["system_scores"].aer is not None:
        layer, head = r["options"]["attention_layer"], r["options"]["attention_head"]
        which = "" if (layer, head) == (-1, "mean") else f" (decoder layer {layer}, head {head})"
        print(f"{r['system_scores'].aer}{which}")
    print(f"\nwritten to {os.path.dirname(r['files']['evaluation.json'])}/")
    if r["tensorboard"]:
        tb = r["tensorboard"]
        print(
            f"TensorBoard: {len(tb['tags'])} images and {len(tb['scalars'])} scalars at step {tb['step']} "
            f"in {tb['logdir']}/"
        )
    return 0
