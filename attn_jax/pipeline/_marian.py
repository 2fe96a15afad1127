"""Import a Hugging Face Marian (OPUS-MT) checkpoint as an attn-jax run directory.

A Marian checkpoint directory holds ``config.json``, ``model.safetensors``, ``source.spm``, ``target.spm`` and
``vocab.json`` (``transformers.MarianMTModel.save_pretrained`` plus the tokenizer's files). :func:`import_marian`
reads it with ``safetensors`` into NumPy (no PyTorch), maps it onto :class:`attn_jax.models.Transformer` and
writes an ordinary run: ``checkpoints/0``, ``vocab/`` and ``imported.json``. ``translate``, ``evaluate``,
``score``, ``export`` and ``serve`` then load it as they load a trained run.

How Marian maps onto the Transformer:

* post-LN layers, LayerNorm ``ε = 1e-5``, biased projections; the FFN's ``activation_function``;
* token embeddings times ``√d`` when ``scale_embedding`` is set;
* sinusoidal positions from 0, sines in the first half of the features and cosines in the second
  (``positions="sinusoidal_halves"``);
* ``logits = y Eᵀ + final_logits_bias`` with ``E`` the decoder's embedding (or ``lm_head`` when untied);
* ids renumbered into attn-jax's special-id layout (:class:`attn_jax.data.MarianVocabulary`): the embedding
  rows are permuted, and the decoder's start token gets a row of its own whose output bias is ``-1e9``, so it
  takes no probability and the log-softmax over the other ids is Marian's.

Nothing is dropped silently. A config field this module does not know, a value it does not support, a tensor
it does not use and a tensor it misses are each a one-line :class:`ImportError_` naming them. The fields that
only matter for training or generation (dropout rates, ``num_beams``, ``bad_words_ids``, ...) are listed in
``imported.json`` as not applied.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, NamedTuple

import numpy as np

__all__ = ["IMPORTED_JSON", "ImportedRun", "MarianImportError", "import_marian", "read_marian"]

IMPORTED_JSON = "imported.json"
_START_BIAS = -1e9  # the output bias of the duplicated start-token row: no probability, finite gradients

# Fields the import reads into the model.
_USED = frozenset(
    {
        "d_model",
        "encoder_layers",
        "decoder_layers",
        "encoder_attention_heads",
        "decoder_attention_heads",
        "encoder_ffn_dim",
        "decoder_ffn_dim",
        "activation_function",
        "scale_embedding",
        "vocab_size",
        "decoder_vocab_size",
        "share_encoder_decoder_embeddings",
        "tie_word_embeddings",
        "pad_token_id",
        "eos_token_id",
        "decoder_start_token_id",
        "max_position_embeddings",
        "dropout",
        "model_type",
        "architectures",
    }
)
# Fields whose value must be the one Marian's forward pass has (older configs spell them out).
_FIXED = {
    "normalize_before": False,
    "normalize_embedding": False,
    "add_final_layer_norm": False,
    "add_bias_logits": False,
    "static_position_embeddings": True,
    "is_encoder_decoder": True,
    "is_decoder": False,
    "encoder_layerdrop": 0.0,
    "decoder_layerdrop": 0.0,
}
# Fields that change training or generation, not the model's output: kept in imported.json as not applied.
_NOT_APPLIED = frozenset(
    {
        "attention_dropout",
        "activation_dropout",
        "classif_dropout",
        "classifier_dropout",
        "init_std",
        "bad_words_ids",
        "num_beams",
        "max_length",
        "min_length",
        "length_penalty",
        "early_stopping",
        "no_repeat_ngram_size",
        "forced_eos_token_id",
        "forced_bos_token_id",
        "bos_token_id",
        "num_return_sequences",
        "use_cache",
        "gradient_checkpointing",
        "extra_pos_embeddings",
    }
)
# Bookkeeping without any effect on the numbers.
_METADATA = frozenset(
    {
        "_name_or_path",
        "_num_labels",
        "num_labels",
        "id2label",
        "label2id",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "num_hidden_layers",
        "output_past",
        "return_dict",
        "output_hidden_states",
        "output_attentions",
    }
)
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
_ACTIVATIONS.update(swish="swish", silu="swish")


class MarianImportError(ValueError):
    """A Marian checkpoint cannot be imported; the message is one line and names the file and the problem."""


class ImportedRun(NamedTuple):
    """What :func:`import_marian` wrote: the run directory and the record kept in its ``imported.json``."""

    workdir: str
    record: dict


class _Read(NamedTuple):
    config: Any  # attn_jax.models.TransformerConfig
    params: dict
    src_vocab: Any  # attn_jax.data.MarianVocabulary
    tgt_vocab: Any
    record: dict


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise MarianImportError(
            f"{path}: no such file (a Marian checkpoint has config.json and vocab.json)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MarianImportError(f"{path}: not readable JSON ({' '.join(str(e).split())})") from None
    if not isinstance(value, dict):
        raise MarianImportError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise MarianImportError(
            f"{path}: no such file (a Marian checkpoint has source.spm and target.spm)"
        ) from None
    except OSError as e:
        raise MarianImportError(f"{path}: {e.strerror or e}") from None


def _check_config(path: str, hf: dict) -> dict:
    """The config's fields sorted into used and not applied; one line naming unknown or unsupported ones."""
    if hf.get("model_type") != "marian":
        raise MarianImportError(f"{path}: model_type is {hf.get('model_type')!r}, not 'marian'")
    known = _USED | _FIXED.keys() | _NOT_APPLIED | _METADATA
    unknown = sorted(k for k in hf if k not in known)
    if unknown:
        raise MarianImportError(
            f"{path}: unknown config fields {', '.join(unknown)} (attn-jax cannot tell whether they change the model)"
        )
    bad = [f"{k}={hf[k]!r} (supported: {v!r})" for k, v in _FIXED.items() if k in hf and hf[k] != v]
    act = hf.get("activation_function", "gelu")
    if act not in _ACTIVATIONS:
        bad.append(f"activation_function={act!r} (supported: {', '.join(_ACTIVATIONS)})")
    for a, b in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf.get(a) != hf.get(b):
            bad.append(f"{a}={hf.get(a)!r} != {b}={hf.get(b)!r} (the Transformer has one value for both)")
    dec_vocab = hf.get("decoder_vocab_size") or hf.get("vocab_size")
    if dec_vocab != hf.get("vocab_size"):
        bad.append(
            f"decoder_vocab_size={dec_vocab!r} != vocab_size={hf.get('vocab_size')!r} (separate vocabularies)"
        )
    if not hf.get("share_encoder_decoder_embeddings", True):
        bad.append("share_encoder_decoder_embeddings=False (separate vocabularies)")
    eos = hf.get("eos_token_id", 0)
    if not isinstance(eos, int):
        bad.append(f"eos_token_id={eos!r} (supported: one int)")
    if bad:
        raise MarianImportError(f"{path}: unsupported values: {'; '.join(bad)}")
    for key in ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "vocab_size"):
        if isinstance(hf.get(key), bool) or not isinstance(hf.get(key), int) or hf[key] < 1:
            raise MarianImportError(f"{path}: {key} must be a positive int, got {hf.get(key)!r}")
    return {
        "not_applied": {k: hf[k] for k in sorted(hf) if k in _NOT_APPLIED},
        "metadata": sorted(k for k in hf if k in _METADATA),
    }


def _load_tensors(directory: str) -> tuple[str, dict[str, np.ndarray]]:
    path = os.path.join(directory, "model.safetensors")
    if not os.path.isfile(path):
        if os.path.isfile(os.path.join(directory, "pytorch_model.bin")):
            raise MarianImportError(
                f"{directory}: has pytorch_model.bin but no model.safetensors; attn-jax reads only safetensors "
                "(no PyTorch): convert it once with transformers' save_pretrained(safe_serialization=True)"
            )
        raise MarianImportError(f"{path}: no such file (a Marian checkpoint has model.safetensors)")
    try:
        from safetensors.numpy import load_file
    except ImportError as e:
        raise MarianImportError(
            f"importing a Marian checkpoint needs safetensors: pip install 'attn-jax[hf]' ({e})"
        ) from None
    try:
        return path, dict(load_file(path))
    except Exception as e:  # safetensors raises its own SafetensorError on a damaged file
        raise MarianImportError(
            f"{path}: not a readable safetensors file ({' '.join(str(e).split())[:200]})"
        ) from None


class _Tensors:
    """The checkpoint's tensors, each taken once; what is never taken is reported."""

    def __init__(self, path: str, tensors: dict[str, np.ndarray]):
        self.path, self.tensors, self.taken = path, tensors, set()

    def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.tensors:
            raise MarianImportError(f"{self.path}: missing tensor {name} (expected shape {list(shape)})")
        x = self.tensors[name]
        if tuple(x.shape) != shape:
            raise MarianImportError(
                f"{self.path}: tensor {name} has shape {list(x.shape)}, expected {list(shape)}"
            )
        self.taken.add(name)
        return np.asarray(x, np.float32)

    def tied(self, name: str, like: np.ndarray) -> None:
        """A copy of a tied tensor, if saved, must equal the table it is tied to."""
        if name in self.tensors:
            if not np.array_equal(np.asarray(self.tensors[name], np.float32), like):
                raise MarianImportError(f"{self.path}: {name} differs from the embedding it is tied to")
            self.taken.add(name)

    def left(self) -> list[str]:
        return sorted(set(self.tensors) - self.taken)


def _attention(t: _Tensors, prefix: str, d: int, h: int) -> dict:
    """One attention's projections: ``x Wᵀ + b`` with PyTorch's ``[out, in]`` weights → ``[D, H, K]`` kernels."""
    k = d // h
    out = {}
    for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        w = t.take(f"{prefix}.{theirs}.weight", (d, d))
        b = t.take(f"{prefix}.{theirs}.bias", (d,))
        out[ours] = {"kernel": w.T.reshape(d, h, k), "bias": b.reshape(h, k)}
    w = t.take(f"{prefix}.out_proj.weight", (d, d))
    out["out"] = {"kernel": w.T.reshape(h, k, d), "bias": t.take(f"{prefix}.out_proj.bias", (d,))}
    return out


def _norm(t: _Tensors, prefix: str, d: int) -> dict:
    return {"scale": t.take(f"{prefix}.weight", (d,)), "bias": t.take(f"{prefix}.bias", (d,))}


def _ffn(t: _Tensors, prefix: str, d: int, f: int) -> dict:
    return {
        "w_1": t.take(f"{prefix}.fc1.weight", (f, d)).T,
        "b_1": t.take(f"{prefix}.fc1.bias", (f,)),
        "w_2": t.take(f"{prefix}.fc2.weight", (d, f)).T,
        "b_2": t.take(f"{prefix}.fc2.bias", (d,)),
    }


def _stack(layers: list[dict]) -> dict:
    import jax

    return jax.tree.map(lambda *xs: np.stack(xs), *layers)


def _check_positions(t: _Tensors, name: str, n: int, d: int) -> None:
    """Old checkpoints save the sinusoid table; it must be the one the import computes."""
    if name not in t.tensors:
        return
    from attn_jax.attention import sinusoidal_positions

    table = t.take(name, (n, d))
    ours = np.asarray(sinusoidal_positions(n, d, layout="halves"))
    if not np.allclose(table, ours, atol=1e-4):
        raise MarianImportError(
            f"{t.path}: {name} is not Marian's sinusoidal table (learned positions are not supported)"
        )


def read_marian(directory: str | os.PathLike) -> _Read:
    """Read a Marian checkpoint directory into a Transformer config, plain parameters and vocabularies.

    Raises:
      MarianImportError: a missing or damaged file, an unknown or unsupported config field, a tensor missing,
        misshapen or left unused.
    """
    from attn_jax.data import MarianVocabulary, marian_order
    from attn_jax.models import TransformerConfig

    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise MarianImportError(f"{directory}: no such checkpoint directory")
    cfg_path = os.path.join(directory, "config.json")
    hf = _read_json(cfg_path)
    fields = _check_config(cfg_path, hf)
    vocab_path = os.path.join(directory, "vocab.json")
    pieces = _read_json(vocab_path)
    d, h, f = hf["d_model"], hf["encoder_attention_heads"], hf["encoder_ffn_dim"]
    n_enc, n_dec, v = hf["encoder_layers"], hf["decoder_layers"], hf["vocab_size"]
    pad, eos = hf.get("pad_token_id", v - 1), hf.get("eos_token_id", 0)
    start = hf.get("decoder_start_token_id", pad)
    if len(pieces) != v or not all(isinstance(i, int) for i in pieces.values()):
        raise MarianImportError(f"{vocab_path}: {len(pieces)} pieces for vocab_size={v} in config.json")
    if "<unk>" not in pieces:
        raise MarianImportError(f"{vocab_path}: no <unk> piece")
    ids = dict(pad_id=pad, start_id=start, eos_id=eos, unk_id=pieces["<unk>"])
    try:
        order = np.asarray(marian_order(pieces, **ids))
        src_vocab = MarianVocabulary.from_marian(
            pieces, _read_bytes(os.path.join(directory, "source.spm")), **ids
        )
        tgt_vocab = MarianVocabulary.from_marian(
            pieces, _read_bytes(os.path.join(directory, "target.spm")), **ids
        )
    except (ValueError, RuntimeError) as e:  # RuntimeError: SentencePiece cannot parse a model
        raise MarianImportError(f"{vocab_path}: {' '.join(str(e).split())[:300]}") from None

    t = _Tensors(*_load_tensors(directory))
    shared = t.take("model.shared.weight", (v, d))
    tie = hf.get("tie_word_embeddings", True)
    # Tied checkpoints save one table; untied ones give the encoder, decoder and output layer their own.
    tables = {}
    for side in ("encoder", "decoder"):
        name = f"model.{side}.embed_tokens.weight"
        if tie or name not in t.tensors:
            t.tied(name, shared)
            tables[side] = shared
        else:
            tables[side] = t.take(name, (v, d))
    if tie:
        t.tied("lm_head.weight", tables["decoder"])
    lm_head = tables["decoder"] if tie else t.take("lm_head.weight", (v, d))
    bias = t.take("final_logits_bias", (1, v))[0]
    max_len = hf.get("max_position_embeddings", 1024)
    for side in ("encoder", "decoder"):
        _check_positions(t, f"model.{side}.embed_positions.weight", max_len, d)

    enc = [
        {
            "attention": _attention(t, f"model.encoder.layers.{i}.self_attn", d, h),
            "attention_norm": _norm(t, f"model.encoder.layers.{i}.self_attn_layer_norm", d),
            "ffn": _ffn(t, f"model.encoder.layers.{i}", d, f),
            "ffn_norm": _norm(t, f"model.encoder.layers.{i}.final_layer_norm", d),
        }
        for i in range(n_enc)
    ]
    dec = [
        {
            "self_attention": _attention(t, f"model.decoder.layers.{i}.self_attn", d, h),
            "self_attention_norm": _norm(t, f"model.decoder.layers.{i}.self_attn_layer_norm", d),
            "cross_attention": _attention(t, f"model.decoder.layers.{i}.encoder_attn", d, h),
            "cross_attention_norm": _norm(t, f"model.decoder.layers.{i}.encoder_attn_layer_norm", d),
            "ffn": _ffn(t, f"model.decoder.layers.{i}", d, f),
            "ffn_norm": _norm(t, f"model.decoder.layers.{i}.final_layer_norm", d),
        }
        for i in range(n_dec)
    ]
    left = t.left()
    if left:
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        raise MarianImportError(f"{t.path}: tensors the import does not use: {shown}")

    out_bias = bias[order].copy()
    out_bias[1] = _START_BIAS  # attn-jax's <s>: the start token's second row
    params = {
        "tgt_embed": tables["decoder"][order],
        "encoder": _stack(enc),
        "decoder": _stack(dec),
        "output": {"bias": out_bias},
    }
    sharing = "all"
    if not tie:
        sharing = "none"
        params["src_embed"] = tables["encoder"][order]
        params["output"]["kernel"] = lm_head[order].T.copy()
    try:
        config = TransformerConfig(
            src_vocab=len(order),
            tgt_vocab=len(order),
            d_model=d,
            heads=h,
            d_ff=f,
            encoder_layers=n_enc,
            decoder_layers=n_dec,
            dropout=float(hf.get("dropout", 0.1)),
            norm="post",
            positions="sinusoidal_halves",
            max_length=max_len,
            share_embeddings=sharing,
            activation=_ACTIVATIONS[hf.get("activation_function", "gelu")],
            layer_norm_eps=1e-5,
            scale_embeddings=bool(hf.get("scale_embedding", False)),
        )
    except ValueError as e:
        raise MarianImportError(f"{cfg_path}: {e}") from None
    record = {
        "source": os.path.abspath(directory),
        "format": "marian",
        "architectures": hf.get("architectures"),
        "marian_ids": {"pad": pad, "decoder_start": start, "eos": eos, "unk": ids["unk_id"]},
        "vocab_size": {"marian": v, "attn_jax": len(order)},
        "not_applied": fields["not_applied"],
        "note": (
            "attn-jax id i is Marian id marian_order[i]; <s> (id 1) is the decoder start token's row, "
            f"with output bias {_START_BIAS:g}"
        ),
    }
    return _Read(config, params, src_vocab, tgt_vocab, record)


def _run_config(model_config) -> dict:
    """The run's full config: the trainer's defaults for a Transformer, with the imported model's fields."""
    import dataclasses

    from attn_jax.train import default_config

    c = default_config("transformer")
    fields = dataclasses.asdict(model_config)
    for key in c.model.keys():
        if key in fields:
            c.model[key] = fields[key]
    c.data.vocab = "sentencepiece"
    c.data.src_vocab_size = model_config.src_vocab
    c.data.tgt_vocab_size = model_config.tgt_vocab
    c.data.joint_vocab = True
    c.data.max_source_length = model_config.max_length
    c.data.max_target_length = 0  # no trained length: the ratio rule alone sets the limit
    c.train_steps = 0
    return c.to_dict()


def import_marian(checkpoint_dir: str | os.PathLike, workdir: str | os.PathLike) -> ImportedRun:
    """Import a Marian (OPUS-MT) checkpoint directory as the run directory ``workdir``.

    ``workdir`` gets ``checkpoints/0`` (the parameters and the run's config), ``vocab/source`` and
    ``vocab/target`` (:class:`attn_jax.data.MarianVocabulary`), ``imported.json`` (the source, the id mapping
    and the config fields not applied) and ``hf_config.json`` (the checkpoint's config, copied). It is written
    to a temporary sibling and renamed into place when complete, so a crash leaves no partial run.

    Args:
      checkpoint_dir: the directory of ``save_pretrained``: ``config.json``, ``model.safetensors``,
        ``vocab.json``, ``source.spm``, ``target.spm``.
      workdir: the run directory to create; it must not exist.

    Raises:
      MarianImportError: ``workdir`` exists, or :func:`read_marian`'s errors, or writing fails.

    Returns:
      An :class:`ImportedRun`.
    """
    from attn_jax.data import save_vocabularies
    from attn_jax.train import CheckpointManager, CheckpointSaveError
    from attn_jax.train._checkpoint import failure_reason

    workdir = os.path.abspath(os.fspath(workdir))
    if os.path.lexists(workdir):
        raise MarianImportError(f"{workdir} already exists (never overwritten): choose another --workdir")
    read = read_marian(checkpoint_dir)
    parent = os.path.dirname(workdir)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(workdir)}.tmp-", dir=parent)
    except OSError as e:
        raise MarianImportError(f"cannot write {workdir}: {e.strerror or e}") from None
    try:
        save_vocabularies(os.path.join(tmp, "vocab"), read.src_vocab, read.tgt_vocab)
        shutil.copy2(
            os.path.join(os.fspath(checkpoint_dir), "config.json"), os.path.join(tmp, "hf_config.json")
        )
        manager = CheckpointManager(
            os.path.join(tmp, "checkpoints"), keep=1, keep_best=False, async_save=False
        )
        try:
            state = {"params": read.params, "step": np.asarray(0, np.int32)}
            manager.save(0, state, {}, _run_config(read.config), None)
        finally:
            manager.close()
        with open(os.path.join(tmp, IMPORTED_JSON), "w", encoding="utf-8") as f:
            json.dump(read.record, f, indent=2)
            f.write("\n")
        os.rename(tmp, workdir)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError | CheckpointSaveError):
            raise MarianImportError(f"cannot write {workdir}: {failure_reason(e)}") from None
        raise
    return ImportedRun(workdir, read.record)
