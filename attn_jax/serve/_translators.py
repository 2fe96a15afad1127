"""The model behind the server: a trained run (``attn-jax translate``'s code path) or an export."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Hashable, Sequence
from typing import Any

from attn_jax.serve._batcher import BatchResult
from attn_jax.serve._requests import RequestError

__all__ = ["ExportTranslator", "RunTranslator"]

# JSON key -> the DecodeOptions field it sets.
_FIELDS = {
    "beam": "beam_size",
    "alpha": "alpha",
    "beta": "beta",
    "max_length": "max_length",
    "max_length_ratio": "max_length_ratio",
    "max_length_offset": "max_length_offset",
    "no_repeat_ngram": "no_repeat_ngram",
    "min_length": "min_length",
    "replace_unk": "replace_unk",
}
_KEY_OF = {field: key for key, field in _FIELDS.items()}
_FIELD = re.compile(r"(?<![\w-])(" + "|".join(sorted(_KEY_OF, key=len, reverse=True)) + r")(?![\w-])")


class RunTranslator:
    """Translate with a trained run (or an ensemble) through ``attn_jax.pipeline.translate_sentences``, as
    ``attn-jax translate`` does: the same options, length limit and batching by length.

    Args:
      workdirs: the run directories (several: an ensemble).
      checkpoint: ``best``, ``last`` or a step.
      weights: ``raw`` or ``ema``.
      batch_size: sentences per decoding batch inside one model call.
    """

    def __init__(
        self,
        workdirs: Sequence[str],
        checkpoint: str | int = "best",
        weights: str = "raw",
        batch_size: int = 32,
    ) -> None:
        from attn_jax.pipeline import load_ensemble, quiet_checkpoint_logs

        quiet_checkpoint_logs()
        self.loaded = load_ensemble([os.fspath(w) for w in workdirs], checkpoint, weights)
        self.batch_size = batch_size
        self.description = f"{', '.join(map(str, workdirs))} step {self.loaded.step} ({weights} weights)"
        self.note = self.loaded.note

    def key(self, options: tuple[tuple[str, Any], ...]) -> Hashable:
        """The checked ``DecodeOptions`` of a request's options (translate's defaults for those not given).

        Raises:
          RequestError: 422 naming the option out of range, by its JSON key.
        """
        from attn_jax.pipeline import DecodeOptions, TranslateError

        decode = DecodeOptions(**{_FIELDS[k]: v for k, v in options})
        try:
            decode.check()
            decode.length_limit(self.loaded.config).check()
        except (TranslateError, ValueError) as e:
            message = _FIELD.sub(lambda m: _KEY_OF[m.group(1)], str(e))
            raise RequestError(422, "bad_option", message) from None
        return decode

    def check(self, sentences: Sequence[str]) -> None:
        """Nothing to check: a trained run takes sentences of any length."""

    def __call__(self, sentences: list[str], key: Hashable) -> BatchResult:
        from attn_jax.pipeline import translate_sentences

        results = translate_sentences(
            self.loaded,
            sentences,
            options=key,
            batch_size=self.batch_size,
            limit=key.length_limit(self.loaded.config),
        )
        return BatchResult(
            [hyps[0].text if hyps else "" for hyps in results],
            [bool(hyps and hyps[0].truncated) for hyps in results],
        )


class ExportTranslator:
    """Translate with an export (``attn_jax.exported.load``). Its options are fixed when it was exported:
    a request may only repeat them, or ask for greedy decoding with ``"beam": 1``."""

    def __init__(self, directory: str, batch_size: int | None = None) -> None:
        from attn_jax.exported import load

        self.model = load(directory)
        self.batch_size = batch_size
        decoding = self.model.manifest["decoding"]
        self.fixed = {
            "beam": decoding["beam_size"],
            "alpha": decoding["alpha"],
            "beta": decoding["beta"],
            "no_repeat_ngram": decoding["no_repeat_ngram"],
            "min_length": decoding["min_length"],
        }
        self.description = f"export {directory}"
        self.note = ""

    def key(self, options: tuple[tuple[str, Any], ...]) -> Hashable:
        """``"greedy"`` for ``"beam": 1``, else ``"beam"``; a RequestError for an option the export fixes
        to another value."""
        given = dict(options)
        greedy = given.get("beam") == 1 and self.fixed["beam"] != 1
        want = dict(self.fixed, beam=1, alpha=0.0, beta=0.0) if greedy else self.fixed
        for k, v in given.items():
            if k not in want:
                raise RequestError(422, "bad_option", f"option {k!r} is fixed in the export (export again)")
            if v != want[k]:
                raise RequestError(
                    422,
                    "bad_option",
                    f"option {k!r} is {want[k]!r} in the export, got {v!r} (beam 1 gives greedy decoding)",
                )
        return "greedy" if greedy else "beam"

    def check(self, sentences: Sequence[str]) -> None:
        """A RequestError (413) for a sentence longer than the export's widest source."""
        most = self.model.max_source_tokens
        for i, s in enumerate(sentences):
            n = self.model.source_length(s)
            if n > most:
                raise RequestError(
                    413,
                    "sentence_too_long",
                    f"sentence {i} has {n} source tokens, more than the {most} of the export",
                )

    def __call__(self, sentences: list[str], key: Hashable) -> BatchResult:
        with warnings.catch_warnings():
            # Counted instead: in /metrics and in each response's stopped_at_limit.
            warnings.simplefilter("ignore")
            out = self.model.translate(sentences, greedy=key == "greedy", batch_size=self.batch_size)
        return BatchResult(out, list(self.model.last_stopped_at_limit))
