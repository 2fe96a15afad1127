"""Imported Marian checkpoints against the reference implementation, ``transformers.MarianMTModel``.

Small ``MarianMTModel``s of two config shapes, trained briefly on a toy task, are saved with ``save_pretrained``, imported with
``attn_jax.pipeline.import_marian`` and compared: per-token log-probabilities, greedy and beam outputs token for
token, and ``attn-jax translate`` against ``generate``. Marian's own tokenizer gives the source ids.
"""

import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="the parity tests need PyTorch (make install brings the CPU wheel)"
)
transformers = pytest.importorskip(
    "transformers", reason="the parity tests need transformers (the peers extra)"
)
spm = pytest.importorskip("sentencepiece")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from attn_jax.data import marian_order  # noqa: E402
from attn_jax.pipeline import MarianImportError, import_marian, load_model  # noqa: E402
from tests.tolerance import assert_close_f32  # noqa: E402

# A toy word-for-word translation task: a briefly trained model ends its outputs at varied lengths, and beam
# search finds other outputs than greedy search, as a real model's do. Random weights end at once or loop.
LEXICON = {
    "the": "le", "cat": "chat", "sat": "assis", "on": "sur", "mat": "tapis", "a": "un", "dog": "chien",
    "ran": "court", "in": "dans", "park": "parc", "birds": "oiseaux", "fly": "volent", "over": "par",
    "hills": "collines", "we": "nous", "walk": "marchons", "to": "vers", "school": "ecole", "every": "chaque",
    "day": "jour",
}  # fmt: skip


def _pairs(n=400, seed=0):
    rng = np.random.default_rng(seed)
    words = list(LEXICON)
    out = []
    for _ in range(n):
        sentence = [words[i] for i in rng.integers(0, len(words), rng.integers(2, 8))]
        out.append((" ".join(sentence), " ".join(LEXICON[w] for w in sentence)))
    return out


PAIRS = _pairs()
SRC = [s for s, _ in PAIRS]
TGT = [t for _, t in PAIRS]
SENTENCES = [
    "the cat sat on the park",
    "birds walk to the mat",
    "a dog",
    "we fly over the school every day",
    "the hills",
    "a cat ran to school",
    "we sat on the dog",
    "birds fly in the park every day",
]
SHAPES = {
    # OPUS-MT's own settings: swish, scaled embeddings, tied output layer.
    "opus": dict(activation_function="swish", scale_embedding=True, encoder_layers=2, decoder_layers=2),
    # Another shape: exact GELU, unscaled embeddings, an untied lm_head, 1 + 3 layers, 2 heads.
    "gelu_untied": dict(
        activation_function="gelu",
        scale_embedding=False,
        tie_word_embeddings=False,
        encoder_layers=1,
        decoder_layers=3,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
    ),
}


def _spm(lines, size):
    m = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=m,
        vocab_size=size,
        minloglevel=2,
        hard_vocab_limit=False,
        bos_id=-1,
        eos_id=1,
        unk_id=0,
        pad_id=-1,
        num_threads=1,
    )
    return m.getvalue()


def build_marian(out, train_steps=150, **overrides):
    """A small MarianMTModel, trained ``train_steps`` steps, saved with its tokenizer files in ``out``.

    Returns ``(model, tokenizer)``.
    """
    os.makedirs(out, exist_ok=True)
    protos = _spm(SRC, 40), _spm(TGT, 40)
    pieces = {"</s>": 0, "<unk>": 1}
    for proto in protos:
        sp = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(sp.get_piece_size()):
            p = sp.id_to_piece(i)
            if p not in pieces and p not in ("<s>",):
                pieces[p] = len(pieces)
    pieces["<pad>"] = len(pieces)
    for name, proto in zip(("source.spm", "target.spm"), protos, strict=True):
        with open(os.path.join(out, name), "wb") as f:
            f.write(proto)
    with open(os.path.join(out, "vocab.json"), "w") as f:
        json.dump(pieces, f)
    v = len(pieces)
    cfg = dict(
        vocab_size=v,
        d_model=32,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
        pad_token_id=v - 1,
        decoder_start_token_id=v - 1,
        eos_token_id=0,
    )
    cfg.update(overrides)
    torch.manual_seed(0)
    model = transformers.MarianMTModel(transformers.MarianConfig(**cfg))
    with torch.no_grad():
        model.final_logits_bias.normal_(0, 0.5)  # a bias that matters: the import must carry it
    tok = _tokenizer(out)
    if train_steps:
        _train(model, tok, train_steps)
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return model, tok


def _tokenizer(out):
    return transformers.MarianTokenizer(
        source_spm=os.path.join(out, "source.spm"),
        target_spm=os.path.join(out, "target.spm"),
        vocab=os.path.join(out, "vocab.json"),
    )


def _train(model, tok, steps, batch=32):
    """Adam steps on :data:`PAIRS`: 150 give outputs that end at varied lengths, far from a perfect model."""
    rng = np.random.default_rng(1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        rows = rng.integers(0, len(PAIRS), batch)
        b = tok([SRC[i] for i in rows], text_target=[TGT[i] for i in rows], return_tensors="pt", padding=True)
        b["labels"][b["labels"] == model.config.pad_token_id] = -100  # padding takes no loss
        loss = model(**b).loss
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The reference models are tiny: a second torch thread only spins against the other test worker's core."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=sorted(SHAPES))
def marian(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"marian_{request.param}")
    model, tok = build_marian(str(d / "hf"), **SHAPES[request.param])
    run = import_marian(str(d / "hf"), str(d / "run"))
    loaded = load_model(run.workdir)
    pad = model.config.pad_token_id
    order = marian_order(tok.encoder, pad_id=pad, start_id=pad, eos_id=0, unk_id=1)
    to_ours = {m: i for i, m in enumerate(order) if i != 1}
    return dict(
        dir=str(d / "hf"), run=run.workdir, model=model, tok=tok, loaded=loaded, order=order, ours=to_ours
    )


def _source(m):
    enc = m["tok"](SENTENCES, return_tensors="pt", padding=True)
    src = np.array([[m["ours"][i] for i in row] for row in enc["input_ids"].tolist()], np.int32)
    return enc, src, enc["attention_mask"].numpy().astype(bool)


def _strip(ids, eos, pad):
    out = []
    for i in ids:
        if i == eos:
            break
        if i != pad:
            out.append(int(i))
    return out


def test_source_ids_are_the_tokenizers(marian):
    enc, src, mask = _source(marian)
    for row, s, n in zip(src, SENTENCES, mask.sum(1), strict=True):
        assert marian["loaded"].src_vocab.encode(s) + [2] == row[:n].tolist()


@pytest.mark.numerics
def test_log_probs_equal_transformers(marian):
    enc, src, mask = _source(marian)
    pad = marian["model"].config.pad_token_id
    rng = np.random.default_rng(0)
    tgt = rng.integers(2, pad, size=(len(SENTENCES), 7))
    tgt[:, 0] = pad  # the decoder start token
    with torch.no_grad():
        ref = (
            marian["model"](**enc, decoder_input_ids=torch.tensor(tgt))
            .logits.log_softmax(-1)
            .double()
            .numpy()
        )
    tin = np.array([[1] + [marian["ours"][i] for i in row[1:]] for row in tgt], np.int32)
    logits, _ = marian["loaded"].model(jnp.asarray(src), jnp.asarray(mask), jnp.asarray(tin))
    ours = np.asarray(jax.nn.log_softmax(logits, -1))
    assert (ours[..., 1] < -1e8).all()  # <s> takes no probability
    keep = [i for i in range(len(marian["order"])) if i != 1]
    want = ref[..., [marian["order"][i] for i in keep]]
    assert_close_f32(
        ours[..., keep], want, reduction=4 * marian["model"].config.d_model, scale=float(np.abs(want).max())
    )


def _generate(m, beams):
    enc, src, mask = _source(m)
    pad = m["model"].config.pad_token_id
    with torch.no_grad():
        out = m["model"].generate(
            **enc,
            num_beams=beams,
            do_sample=False,
            max_new_tokens=40,
            length_penalty=0.0,
            early_stopping=False,
            bad_words_ids=[[pad]],
            forced_eos_token_id=None,
        )
    return [[m["ours"][i] for i in _strip(row[1:], 0, pad)] for row in out.tolist()], src, mask


@pytest.mark.parametrize("beams", [1, 4])
def test_search_equals_generate_token_for_token(marian, beams):
    """Greedy (beam 1) and beam search give ``generate``'s ids, for outputs that all end before the limit."""
    from attn_jax.pipeline import DecodeOptions, translate_sentences

    ref, _, _ = _generate(marian, beams)
    assert all(len(r) < 30 for r in ref)  # every reference ended: no cut hypothesis, scored otherwise
    options = DecodeOptions(beam_size=beams, alpha=0.0, max_length=40)
    ours = [best for [best] in translate_sentences(marian["loaded"], SENTENCES, options)]
    assert not any(t.truncated for t in ours)
    assert [t.ids for t in ours] == ref


def test_beam_search_differs_from_greedy_here(marian):
    """The fixture exercises the beam: on some sentence, 4 beams find another output than greedy search."""
    assert _generate(marian, 1)[0] != _generate(marian, 4)[0]


def test_translate_cli_equals_generate(marian, tmp_path):
    ref, _, _ = _generate(marian, 4)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES) + "\n")
    command = [
        sys.executable,
        "-m",
        "attn_jax.cli",
        "translate",
        "--workdir",
        marian["run"],
        "--input",
        str(src),
    ]
    out = subprocess.run(
        [*command, "--beam", "4", "--alpha", "0", "--max-length", "40"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    texts = marian["tok"].batch_decode(
        [[marian["order"][i] for i in r] for r in ref], skip_special_tokens=True
    )
    assert out == [t.strip() for t in texts]


def test_unsupported_config_is_one_line(tmp_path):
    d = tmp_path / "hf"
    build_marian(str(d), train_steps=0, encoder_layers=1, decoder_layers=1)
    cfg = json.loads((d / "config.json").read_text())
    cases = {
        "normalize_before": ("unsupported values: normalize_before=True", True),
        "some_new_field": ("unknown config fields some_new_field", 3),
    }
    for key, (message, value) in cases.items():
        (d / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(MarianImportError, match=message) as e:
            import_marian(str(d), str(tmp_path / f"run_{key}"))
        assert "\n" not in str(e.value) and not (tmp_path / f"run_{key}").exists()
    (d / "config.json").write_text(json.dumps(cfg))
    weights = d / "model.safetensors"
    shutil.move(weights, d / "pytorch_model.bin")
    proc = subprocess.run(
        [sys.executable, "-m", "attn_jax.cli", "import-hf", str(d), "--workdir", str(tmp_path / "run_bin")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert "pytorch_model.bin" in proc.stderr and "Traceback" not in proc.stderr
