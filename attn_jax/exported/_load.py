"""Load an export written by ``attn-jax export`` and translate with it, with jax, numpy and the vocabulary files.

Nothing here imports Flax or a model: the search is the serialized StableHLO, the weights are arrays in
``weights.npz`` and tokenisation reads ``vocab/*/vocab.json`` (and ``spm.model`` for SentencePiece and for an
imported Marian model).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST", "ExportError", "ExportedModel", "LimitReport", "load"]

FORMAT = "attn-jax-export"  # the manifest's "format" field
FORMAT_VERSION = 1  # the manifest's "version": a reader refuses a newer one
MANIFEST = "manifest.json"
WEIGHTS_FILE = "weights.npz"
MODES = ("beam", "greedy")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3  # every attn-jax vocabulary's special ids
_MIN_WIDTH = 16  # the smallest padded source width, as attn_jax.decoding.padded_width


class ExportError(ValueError):
    """An export cannot be written, read or run here; the message is one line."""


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return (text[:300] + "...") if len(text) > 300 else text or type(error).__name__


def padded_width(tokens: int) -> int:
    """``attn_jax.decoding.padded_width``: a power of two, at least 16 (the source widths an export holds)."""
    return max(_MIN_WIDTH, 1 << max(0, tokens - 1).bit_length())


def _length_batches(lengths: Sequence[int], batch_size: int) -> list[tuple[list[int], int, int]]:
    """``attn_jax.decoding.length_batches``: ``(indices, width, rows)`` by padded width, rows a power of two
    for a last partial batch, so that an export decodes in the batches ``attn-jax translate`` uses."""
    by_width: dict[int, list[int]] = {}
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        by_width.setdefault(padded_width(lengths[i]), []).append(i)
    out = []
    for width, idx in sorted(by_width.items()):
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            out.append((chunk, width, min(batch_size, 1 << (len(chunk) - 1).bit_length())))
    return out


def _pad_rows(rows: list[list[int]], width: int, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``attn_jax.decoding.pad_rows``: each row's ids then ``</s>``; missing rows repeat the first."""
    ids = np.full((num_rows, width), PAD_ID, np.int32)
    mask = np.zeros((num_rows, width), bool)
    for r in range(num_rows):
        toks = rows[r] if r < len(rows) else rows[0]
        ids[r, : len(toks)] = toks
        ids[r, len(toks)] = EOS_ID
        mask[r, : len(toks) + 1] = True
    return ids, mask


def target_limit(rule: tuple[int, float, int], cap: int | None, source_tokens: int) -> int:
    """Target tokens with ``</s>`` for a source of ``source_tokens``: ``attn_jax.decoding.LengthLimit``'s rule
    ``(minimum, ratio, offset)``, cut to ``cap`` tokens without ``</s>`` (None: no cap), as ``attn-jax
    translate`` applies it."""
    minimum, ratio, offset = rule
    tokens = max(minimum, math.floor(ratio * source_tokens + 1e-4) + offset) + 1
    return tokens if cap is None else min(tokens, cap + 1)


class _Vocabulary:
    """A saved attn-jax vocabulary (``vocab.json``: word list or SentencePiece model), encode and decode only."""

    def __init__(self, directory: str) -> None:
        path = os.path.join(directory, "vocab.json")
        try:
            with open(path, encoding="utf-8") as f:
                meta = json.load(f)
            self.kind = meta["kind"]
            if self.kind == "word":
                self.tokens = list(meta["tokens"])
                self.lowercase = bool(meta["lowercase"])
                self._ids = {t: i for i, t in enumerate(self.tokens)}
            elif self.kind in ("sentencepiece", "marian"):
                import sentencepiece as spm

                with open(os.path.join(directory, meta["model"]), "rb") as f:
                    self._sp = spm.SentencePieceProcessor(model_proto=f.read())
                if self.kind == "marian":  # pieces in attn-jax's id order (attn_jax.data.MarianVocabulary)
                    self.tokens = list(meta["tokens"])
                    self._ids = {}
                    for i, t in enumerate(self.tokens):
                        self._ids.setdefault(t, i)
                    self._ids["<pad>"], self._ids["<s>"] = PAD_ID, BOS_ID
            else:
                raise ValueError(f"unknown vocabulary kind {self.kind!r}")
        except ImportError as e:
            raise ExportError(
                f"{path}: a SentencePiece vocabulary needs the sentencepiece package ({e})"
            ) from None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            raise ExportError(f"{path}: not a saved vocabulary ({_one_line(e)})") from None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no ``</s>``), as ``attn_jax.data``'s vocabularies encode it."""
        if self.kind == "word":
            return [self._ids.get(w, UNK_ID) for w in (text.lower() if self.lowercase else text).split()]
        if self.kind == "marian":
            head = []
            if text.startswith(">>") and (end := text.find("<<")) != -1 and text[: end + 2] in self._ids:
                head, text = [self._ids[text[: end + 2]]], text[end + 2 :]
            return head + [self._ids.get(p, UNK_ID) for p in self._sp.encode(text, out_type=str)]
        return list(self._sp.encode(text, out_type=int))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of target ids without ``</s>``: words joined by spaces, or SentencePiece's detokenisation."""
        if self.kind == "word":
            return " ".join(self.tokens[i] for i in ids)
        if self.kind == "marian":
            out, run = [], []
            for i in ids:
                if i in (PAD_ID, BOS_ID):
                    continue
                if i == UNK_ID:
                    out.append(self._sp.decode_pieces(run) + "<unk> ")
                    run = []
                else:
                    run.append(self.tokens[i])
            out.append(self._sp.decode_pieces(run))
            return "".join(out).replace("\u2581", " ").strip()
        return self._sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])


class LimitReport(NamedTuple):
    """How many translations of the last :meth:`ExportedModel.translate` call stopped at their length limit.

    Attributes:
      translations: sentences decoded (blank lines are not).
      stopped_at_limit: best translations whose ``</s>`` was forced at the limit.
      rule: the length-limit rule in words (``manifest["length_limit"]["rule"]``).
    """

    translations: int
    stopped_at_limit: int
    rule: str

    def message(self) -> str | None:
        """One warning line, or None when nothing was cut."""
        if not self.stopped_at_limit:
            return None
        return (
            f"{self.stopped_at_limit} of {self.translations} translations stopped at the length limit "
            f"({self.rule}) instead of ending with </s>: export again with a larger --max-length or --max-length-ratio"
        )


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _current_platform() -> str:
    """The platform this process computes on, in ``jax.export``'s names (``gpu`` is ``cuda`` or ``rocm``)."""
    import jax

    backend = jax.default_backend()
    if backend != "gpu":
        return backend
    client = getattr(jax.devices()[0], "client", None)
    version = str(getattr(client, "platform_version", "")).lower()
    return "rocm" if "rocm" in version else "cuda"


class ExportedModel:
    """A translation model read back from an export directory; see :func:`load`.

    Attributes:
      directory: the export directory.
      manifest: its ``manifest.json`` (platforms, shapes, dtypes, the run and step, decoding options).
      platforms: the platforms the search was lowered for.
      max_source_tokens: the longest source sentence (tokens, ``</s>`` not counted) the export can take.
      last_report: the :class:`LimitReport` of the last :meth:`translate` call (None before the first).
      last_stopped_at_limit: for each line of the last :meth:`translate` call, whether its translation stopped
        at the length limit (False for a blank line).
    """

    def __init__(self, directory: str, manifest: dict[str, Any], functions: dict, params: list) -> None:
        self.directory = directory
        self.manifest = manifest
        self.platforms = tuple(manifest["platforms"])
        self.max_source_tokens = max(manifest["source_widths"]) - 1
        self.last_report: LimitReport | None = None
        self.last_stopped_at_limit: list[bool] = []
        self._functions = functions  # {(mode, width): jitted call of the deserialized search}
        self._params = params
        vocab = manifest["vocab"]
        self._src = _Vocabulary(os.path.join(directory, vocab["source"]))
        self._tgt = _Vocabulary(os.path.join(directory, vocab["target"]))
        rule = manifest["length_limit"]
        self._rule = (int(rule["minimum"]), float(rule["ratio"]), int(rule["offset"]))
        self._cap = rule["model_cap"]

    def source_length(self, line: str) -> int:
        """Source tokens of ``line`` as :meth:`translate` reads it (``</s>`` not counted)."""
        return len(self._src.encode(line))

    def translate(
        self, lines: Sequence[str], *, greedy: bool = False, batch_size: int | None = None
    ) -> list[str]:
        """The best translation of each line, by the exported beam search (or greedy decoding).

        Lines are tokenised by the run's vocabularies as ``attn-jax translate`` does, sorted by length and
        decoded in the same padded batches, so the translations equal its output with the options baked into
        the export (``manifest["decoding"]``; ``greedy``: ``--beam 1 --alpha 0``). A blank line gives ``""``.
        Translations that stop at their length limit are counted in :attr:`last_report` and warned about.

        Args:
          lines: source sentences, one per item, tokenised like the training corpus.
          greedy: decode greedily instead of by beam search.
          batch_size: sentences per batch; None: the export's (``manifest["decoding"]["batch_size"]``).

        Returns:
          One string per line.

        Raises:
          ExportError: a sentence longer than the export's largest source width, a mode the export does not
            hold, or a bad ``batch_size``.
        """
        mode = "greedy" if greedy else "beam"
        size = self.manifest["decoding"]["batch_size"] if batch_size is None else batch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ExportError(f"batch_size must be an int >= 1, got {size!r}")
        if isinstance(lines, str):
            raise ExportError("translate takes a sequence of lines, got one str")
        if mode not in self.manifest["functions"]:
            raise ExportError(f"{self.directory}: this export holds no {mode} search")
        encoded = [self._src.encode(s) for s in lines]
        todo = [i for i, ids in enumerate(encoded) if ids]
        for i in todo:
            if len(encoded[i]) > self.max_source_tokens:
                raise ExportError(
                    f"line {i + 1} has {len(encoded[i])} source tokens, more than the {self.max_source_tokens} "
                    f"this export takes (export again with --max-source-length {len(encoded[i])} or more)"
                )
        out = [""] * len(lines)
        cut = [False] * len(lines)
        for members, width, rows in _length_batches([len(encoded[i]) + 1 for i in todo], size):
            sentences = [encoded[todo[c]] for c in members]
            src, mask = _pad_rows(sentences, width, rows)
            limits = [target_limit(self._rule, self._cap, len(s)) for s in sentences]
            limits += [limits[0]] * (rows - len(members))
            tokens, lengths, _, truncated = self._functions[mode, width](
                self._params, src, mask, np.asarray(limits, np.int32)
            )
            tokens, lengths, truncated = np.asarray(tokens), np.asarray(lengths), np.asarray(truncated)
            for r, c in enumerate(members):
                n = int(lengths[r, 0])
                out[todo[c]] = self._tgt.decode([int(t) for t in tokens[r, 0, : max(n - 1, 0)]])
                cut[todo[c]] = bool(truncated[r, 0])
        self.last_stopped_at_limit = cut
        self.last_report = LimitReport(len(todo), sum(cut), self.manifest["length_limit"]["rule"])
        message = self.last_report.message()
        if message:
            warnings.warn(message, stacklevel=2)
        return out


def _read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, MANIFEST)
    if not os.path.isdir(directory):
        raise ExportError(f"{directory}: no such export directory")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ExportError(f"{path}: missing (not an attn-jax export, or an incomplete one)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExportError(f"{path}: unreadable ({_one_line(e)})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ExportError(f'{path}: not an attn-jax export manifest (no "format": "{FORMAT}")')
    version = manifest.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ExportError(
            f"{path}: export format version {version!r}; this attn-jax reads up to {FORMAT_VERSION} (upgrade it)"
        )
    missing = [
        k
        for k in (
            "platforms",
            "source_widths",
            "functions",
            "length_limit",
            "decoding",
            "vocab",
            "weights",
            "files",
        )
        if k not in manifest
    ]
    if missing:
        raise ExportError(f"{path}: damaged manifest (no {', '.join(missing)})")
    return manifest


def _check_files(directory: str, manifest: dict[str, Any]) -> None:
    """Every file the manifest lists exists and has its checksum: a truncated copy fails here, by name."""
    for name, digest in manifest["files"].items():
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise ExportError(f"{path}: missing (the export is incomplete)")
        if _sha256(path) != digest:
            raise ExportError(
                f"{path}: damaged (its SHA-256 differs from the manifest's; copy the export again)"
            )


def load(directory: str | os.PathLike) -> ExportedModel:
    """Read an export written by ``attn-jax export`` (:func:`export_run`) for translating in this process.

    It checks the manifest, each file's SHA-256 and that the search was lowered for this process's platform,
    then deserializes the search functions and puts the weights on the default device. Only jax, numpy and
    (for a SentencePiece vocabulary) sentencepiece are imported.

    >>> model = load("exports/rnnsearch")                  # doctest: +SKIP
    >>> model.translate(["the dog slept ."])               # doctest: +SKIP
    ['le chien a dormi .']

    Args:
      directory: the export directory (``manifest.json``, ``weights.npz``, ``*.jaxexport``, ``vocab/``).

    Returns:
      An :class:`ExportedModel`.

    Raises:
      ExportError: in one line: no such directory, a missing or foreign manifest, a missing or damaged file,
        an export lowered for other platforms only, or one this jax cannot deserialize.
    """
    import jax

    directory = os.fspath(directory)
    manifest = _read_manifest(directory)
    here = _current_platform()
    platforms = [str(p) for p in manifest["platforms"]]
    if here not in platforms:
        raise ExportError(
            f"{directory}: exported for {', '.join(platforms)} only, but this process runs on {here} "
            f"(export again with --platforms {','.join([*platforms, here])})"
        )
    _check_files(directory, manifest)
    try:
        with np.load(os.path.join(directory, manifest["weights"]["file"]), allow_pickle=False) as arrays:
            params = [jax.device_put(arrays[f"p{i:05d}"]) for i in range(int(manifest["weights"]["arrays"]))]
    except (OSError, ValueError, KeyError) as e:
        raise ExportError(f"{directory}: cannot read the weights ({_one_line(e)})") from None
    functions = {}
    for mode, by_width in manifest["functions"].items():
        for width, entry in by_width.items():
            path = os.path.join(directory, entry["file"])
            try:
                with open(path, "rb") as f:
                    exported = jax.export.deserialize(bytearray(f.read()))
            except Exception as e:  # noqa: BLE001 - any failure of a foreign format is one line
                raise ExportError(f"{path}: cannot deserialize ({_one_line(e)})") from None
            if here not in exported.platforms:
                raise ExportError(
                    f"{path}: lowered for {', '.join(exported.platforms)} only, but this process runs on {here}"
                )
            functions[mode, int(width)] = jax.jit(exported.call)
    return ExportedModel(directory, manifest, functions, params)
