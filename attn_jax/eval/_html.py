"""``attn-jax report``: one self-contained HTML page comparing evaluated systems, sentence by sentence.

It reads what ``attn-jax evaluate`` leaves in its output directory (``evaluation.json``, ``sources.txt``,
``references.txt``, ``hypotheses.txt``, their ``.detok`` forms, and ``attention.npz`` when evaluated with
``--save-attention``) and writes ``report.html``: scores overall and by source length, sacreBLEU's paired
bootstrap test between every two systems, a sortable and filterable sentence table, and an attention heatmap
per sentence drawn by the page's own script. The page loads nothing: its script, style and data are inline.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from attn_jax.eval._bleu import LengthBucket

__all__ = ["EvaluatedRun", "paired_bootstrap", "read_evaluated_run", "write_report_html"]

# A weight is stored as round(255 w): the page shows it to within 1/510.
_LEVELS = 255


def _deflate(data: bytes) -> bytes:
    """``data`` in the zlib format the page's ``DecompressionStream("deflate")`` reads, packed as tightly as
    zlib can: level 9 with its ``Z_FILTERED`` strategy, which suits bytes that are mostly small, as peaked
    attention weights are."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_FILTERED)
    return packer.compress(data) + packer.flush()


@dataclasses.dataclass(frozen=True)
class EvaluatedRun:
    """One ``attn-jax evaluate`` output directory, read back.

    Attributes:
      directory: where it was read from.
      evaluation: ``evaluation.json``.
      sources, references, hypotheses: the sentences as evaluated (``*.txt``).
      scored_references, scored_hypotheses: the strings BLEU scored (``.detok.txt`` when evaluate detokenised).
      attention: ``attention.npz``'s arrays, or None when evaluate did not save it.
    """

    directory: str
    evaluation: dict[str, Any]
    sources: list[str]
    references: list[str]
    hypotheses: list[str]
    scored_references: list[str]
    scored_hypotheses: list[str]
    attention: dict[str, Any] | None

    @property
    def system(self) -> str:
        return str(self.evaluation["system"])

    @property
    def tokenize(self) -> str:
        """sacreBLEU's tokeniser as evaluate scored BLEU (None there means 13a)."""
        return self.evaluation["options"].get("bleu_tokenize") or "13a"


def read_evaluated_run(path: str | os.PathLike, split: str = "test") -> EvaluatedRun:
    """Read an evaluate output directory, or a run directory's ``eval/<split>``.

    Raises:
      FileNotFoundError: no ``evaluation.json`` there.
      ValueError: the sentence files disagree with ``evaluation.json`` in length.
    """
    directory = os.fspath(path)
    if not os.path.isfile(os.path.join(directory, "evaluation.json")):
        inner = os.path.join(directory, "eval", split)
        if not os.path.isfile(os.path.join(inner, "evaluation.json")):
            raise FileNotFoundError(
                f"{directory}: no evaluation.json here nor in eval/{split}/ (run `attn-jax evaluate` first)"
            )
        directory = inner
    with open(os.path.join(directory, "evaluation.json"), encoding="utf-8") as f:
        evaluation = json.load(f)

    def lines(name: str) -> list[str]:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            out = f.read().split("\n")
        if out and out[-1] == "":
            out.pop()
        if len(out) != evaluation["num_sentences"]:
            raise ValueError(
                f"{directory}/{name}: {len(out)} lines but evaluation.json has {evaluation['num_sentences']}"
            )
        return out

    sources, references, hypotheses = lines("sources.txt"), lines("references.txt"), lines("hypotheses.txt")
    detok = evaluation["options"].get("detokenize", "none") != "none"
    attention = None
    npz = os.path.join(directory, "attention.npz")
    if os.path.isfile(npz):
        with np.load(npz, allow_pickle=False) as z:
            attention = {k: z[k] for k in z.files}
        attention["meta"] = json.loads(str(attention["meta"]))
    return EvaluatedRun(
        directory,
        evaluation,
        sources,
        references,
        hypotheses,
        lines("references.detok.txt") if detok else references,
        lines("hypotheses.detok.txt") if detok else hypotheses,
        attention,
    )


def paired_bootstrap(
    references: Sequence[str],
    baseline: tuple[str, Sequence[str]],
    system: tuple[str, Sequence[str]],
    *,
    tokenize: str = "13a",
    n_samples: int = 1000,
) -> dict[str, dict[str, Any]]:
    """sacreBLEU's paired bootstrap resampling (``sacrebleu.significance.PairedTest``, ``test_type="bs"``) of
    ``system`` against ``baseline`` on BLEU, chrF and TER: per metric its name, both scores, the p-value, the
    95 % confidence interval of each score and sacreBLEU's signature. The seed is sacreBLEU's
    (``SACREBLEU_SEED``, 12345 by default), so that ``sacrebleu -i A B --paired-bs`` gives the same numbers."""
    from sacrebleu.metrics import BLEU, CHRF, TER
    from sacrebleu.significance import PairedTest

    metrics = {"BLEU": BLEU(tokenize=tokenize), "chrF": CHRF(), "TER": TER()}
    test = PairedTest(
        [(baseline[0], list(baseline[1])), (system[0], list(system[1]))],
        metrics,
        references=[list(references)],
        test_type="bs",
        n_samples=n_samples,
    )
    signatures, scores = test()
    out = {}
    for name in scores:
        if name == "System":
            continue
        base, other = scores[name]
        out[name] = {
            "a": _num(base.score),
            "b": _num(other.score),
            "a_mean": _num(base.mean),
            "b_mean": _num(other.mean),
            "a_ci": _num(base.ci),
            "b_ci": _num(other.ci),
            "p": _num(other.p_value),
            "signature": str(signatures[name]),
        }
    return out


class _TokenisedWarning(logging.Filter):
    """Holds back sacreBLEU's three-line "forgot to detokenize" warning and counts it, so a report says it once.

    The paired bootstrap scores every pair of systems, and sacreBLEU repeats the warning at each scoring.
    Every other sacreBLEU record passes.
    """

    _LINES = ("tokenized period", "forgot to detokenize", "suppress this message with the `force` parameter")

    def __init__(self):
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not any(line in message for line in self._LINES):
            return True
        self.count += self._LINES[0] in message
        return False


def write_report_html(
    runs: Sequence[EvaluatedRun],
    path: str | os.PathLike,
    *,
    title: str | None = None,
    bootstrap_samples: int = 1000,
) -> dict[str, Any]:
    """Write the report page for ``runs`` (evaluated on the same sentences) to ``path``.

    Returns:
      A dict: ``path``, ``bytes`` (the page's size), ``sentences``, ``systems`` and ``significance`` (per pair
      of systems, :func:`paired_bootstrap`'s result).

    Raises:
      ValueError: no run, or runs evaluated on different sources or references.
    """
    if not runs:
        raise ValueError("no evaluated run to report")
    first = runs[0]
    for r in runs[1:]:
        if r.sources != first.sources or r.references != first.references:
            raise ValueError(
                f"{r.directory} and {first.directory} were evaluated on different sentences: "
                "a report compares systems on the same pairs (evaluate them on the same split and --max-examples)"
            )
    names = _unique([r.system for r in runs])
    data = {
        "title": title
        or f"{' vs '.join(names)} on {first.evaluation['corpus']} ({first.evaluation['split']})",
        "systems": [_system_data(name, r) for name, r in zip(names, runs, strict=True)],
        "sentences": _sentence_data(first),
        "significance": [],
    }
    held = _TokenisedWarning()
    sacrebleu_log = logging.getLogger("sacrebleu")
    sacrebleu_log.addFilter(held)
    try:
        for i in range(len(runs)):
            for j in range(i + 1, len(runs)):
                a, b = runs[i], runs[j]
                data["significance"].append(
                    {
                        "a": names[i],
                        "b": names[j],
                        "metrics": paired_bootstrap(
                            a.scored_references,
                            (names[i], a.scored_hypotheses),
                            (names[j], b.scored_hypotheses),
                            tokenize=a.tokenize,
                            n_samples=bootstrap_samples,
                        ),
                    }
                )
    finally:
        sacrebleu_log.removeFilter(held)
    if held.count:
        sacrebleu_log.warning(
            f"sacreBLEU warned {held.count} times that 100 or more hypotheses end in a tokenized period ('.'): "
            "the outputs look tokenized; the page scores them as evaluate did (its --detokenize option)"
        )
    from attn_jax.eval._html_page import PAGE

    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    # Inside <script>, "</" could close the tag early: JSON allows the escaped form.
    payload = payload.replace("<", "\\u003c")
    html = PAGE.replace("__TITLE__", _escape(data["title"])).replace("__DATA__", payload)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(html)
    return {
        "path": path,
        "bytes": os.path.getsize(path),
        "sentences": len(first.sources),
        "systems": names,
        "significance": data["significance"],
    }


def _num(x) -> float | None:
    """A NumPy or Python number as a JSON float (None stays None)."""
    return None if x is None else float(x)


def _unique(names: Sequence[str]) -> list[str]:
    """Names made distinct: a repeated one gets `` (2)``, `` (3)``..."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} ({seen[n]})")
    return out


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _system_data(name: str, run: EvaluatedRun) -> dict[str, Any]:
    """One system's scores (evaluate's, overall and by length), its outputs, sentence scores and attention."""
    from sacrebleu.metrics import BLEU, CHRF

    ev = run.evaluation

    def by_length(d: dict[str, Any], key: str) -> dict[str, Any]:
        return {
            "score": d["overall"][key] if "overall" in d else d["score"],
            "signature": d["overall"]["signature"] if "overall" in d else d["signature"],
            "buckets": [[b["bucket"], b["sentences"], b.get(key, b.get("score"))] for b in d["buckets"]],
        }

    bleu = BLEU(tokenize=run.tokenize, effective_order=True)
    chrf = CHRF()
    pairs = zip(run.scored_hypotheses, run.scored_references, strict=True)
    sentence = [(bleu.sentence_score(h, [r]).score, chrf.sentence_score(h, [r]).score) for h, r in pairs]
    return {
        "name": name,
        "directory": run.directory,
        "step": ev.get("step"),
        "bleu": by_length(ev["bleu_by_length"], "bleu"),
        "chrf": by_length(ev["chrf_by_length"], "score"),
        "ter": by_length(ev["ter_by_length"], "score"),
        "stopped_at_limit": ev.get("length_limit", {}).get("stopped_at_limit"),
        "hypotheses": run.hypotheses,
        "sentence_bleu": [round(float(b), 2) for b, _ in sentence],
        "sentence_chrf": [round(float(c), 2) for _, c in sentence],
        "attention": _attention_data(run.attention),
    }


def _sentence_data(run: EvaluatedRun) -> dict[str, Any]:
    """Sources, references, source lengths (whitespace tokens, as evaluate buckets them) and bucket labels."""
    buckets = [
        LengthBucket(b["low"], b["high"], b["bucket"]) for b in run.evaluation["bleu_by_length"]["buckets"]
    ]
    lengths = [len(s.split()) for s in run.sources]
    return {
        "source": run.sources,
        "reference": run.references,
        "length": lengths,
        "bucket": [next((k for k, b in enumerate(buckets) if n in b), -1) for n in lengths],
        "bucket_labels": [b.label for b in buckets],
    }


def _attention_data(attention: dict[str, Any] | None) -> dict[str, Any] | None:
    """``attention.npz`` for the page: per view and sentence the ``[L, H, T, S]`` weights as ``round(255 w)``
    bytes, deflated and base64-encoded (the page inflates one sentence when it draws it)."""
    if attention is None:
        return None
    meta = attention["meta"]
    out: dict[str, Any] = {
        "layers": meta["layers"],
        "heads": meta["heads"],
        "note": meta["note"],
        "source_tokens": meta["source_tokens"],
        "gold": meta["gold"],
        "views": {},
    }
    for view in meta["views"]:
        shapes = attention[f"{view}_shapes"]
        flat = attention[f"{view}_weights"].astype(np.float32)
        q = np.clip(np.rint(flat * _LEVELS), 0, _LEVELS).astype(np.uint8)
        ends = np.cumsum(np.prod(shapes, axis=1))
        blobs = [
            base64.b64encode(_deflate(chunk.tobytes())).decode("ascii") if chunk.size else ""
            for chunk in np.split(q, ends[:-1])
        ]
        out["views"][view] = {
            "shapes": shapes[:, 2:].tolist(),
            "target_tokens": meta["target_tokens"][view],
            "blobs": blobs,
        }
    return out
