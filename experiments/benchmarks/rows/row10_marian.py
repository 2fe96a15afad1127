"""Row 10: an imported Marian model: attn_jax beam search vs CTranslate2 and transformers' ``generate``."""

from __future__ import annotations

import io
import json
import os
import statistics
import tempfile
import time

from harness import Ctx, Section, fmt_spread, fmt_time, verdict

# Target (README.md says where it comes from). Met only at the aim: machines differ by 20-40 %.
CT2_RATIO_MIN = 1.0  # CTranslate2 float32 time / attn_jax time at batch 32, beam 4, 2 threads
TARGET_CASE = (32, 4)

# OPUS-MT en-de's shape (Helsinki-NLP/opus-mt-en-de config.json); --quick: a small one.
FULL_SHAPE = dict(vocab=58101, d_model=512, layers=6, heads=8, ffn=2048)
QUICK_SHAPE = dict(vocab=2000, d_model=64, layers=2, heads=4, ffn=128)
INIT_STD = 0.1  # decisive logits (std ≈ 2 over the vocabulary), so that equal searches give equal lines
SOURCE_WIDTH = 24  # source tokens, </s> included; true lengths in [width/2, width]
STEPS = (
    32  # decoding steps on every side: attn_jax max_length, generate max_new_tokens, CT2 max_decoding_length
)
BUDGET_S = 0.5  # a side's calls in one run repeat until this long; the run's time is their median


def row_marian(ctx: Ctx) -> Section:
    """Sentences/s of an imported Marian model: attn_jax vs CTranslate2 (float32, int8) and ``generate``."""
    try:
        import ctranslate2
        import transformers
    except ImportError as e:
        raise RuntimeError(f"row 10 needs the peers extra (transformers, ctranslate2): {e}") from e
    if ctx.torch is None:
        raise RuntimeError("row 10 needs PyTorch (transformers' model and CTranslate2's converter)")
    shape = QUICK_SHAPE if ctx.quick else FULL_SHAPE
    batches, beams = ((1, 32), (1, 4)) if not ctx.quick else ((1, 4), (1, 2))
    steps = STEPS if not ctx.quick else 8
    threads = sorted({1, min(2, ctx.torch.get_num_threads())})
    of_shape = "" if ctx.quick else " of OPUS-MT en-de's shape"
    sec = Section(
        "10. An imported Marian model: attn_jax vs CTranslate2 and transformers",
        f"A `MarianMTModel`{of_shape} (vocabulary {shape['vocab']:,}, d_model {shape['d_model']}, "
        f"{shape['layers']}+{shape['layers']} post-LN layers, {shape['heads']} heads, FFN {shape['ffn']}, swish, "
        f"scaled embeddings, tied output layer) with random parameters (std {INIT_STD}), saved with "
        "`save_pretrained`. attn_jax imports it (`attn-jax import-hf`) and runs `attn_jax.decoding.beam_search` "
        "on the loaded run, α = 0, on every usable core. CTranslate2 converts the same checkpoint with its own "
        "`TransformersConverter` (float32 and int8) and runs `Translator.translate_batch` with "
        "`length_penalty=0` at `intra_threads` 1 and 2. transformers runs `generate(num_beams=k, "
        "length_penalty=0)` at `torch.set_num_threads` 1 and 2. Every side decodes "
        f"{steps} steps (random parameters never end a sentence early) from the same token ids: sources of "
        f"width {SOURCE_WIDTH} with true lengths in [{SOURCE_WIDTH // 2}, {SOURCE_WIDTH}]. Each case is "
        f"measured in {ctx.sizes.runs} runs after one warm-up call per side; in a run the sides take turns and "
        f"each repeats for ~{BUDGET_S} s (its run time is their median). A time is the median of the runs; "
        "a ratio (after the time) is peer time / attn_jax time, the median with the runs' min–max in brackets. "
        "The second table counts a peer's lines equal to attn_jax's, token for token. Target: CTranslate2 float32 at 2 "
        f"threads / attn_jax ≥ {CT2_RATIO_MIN} at batch {TARGET_CASE[0]}, beam {TARGET_CASE[1]}.",
    )
    with tempfile.TemporaryDirectory(prefix="bench_marian_") as tmp:
        ctx.log(f"row 10: building a Marian model of shape {shape}")
        hf_dir = _build_marian(ctx, os.path.join(tmp, "hf"), shape)
        sides = _load_sides(ctx, ctranslate2, transformers, hf_dir, os.path.join(tmp, "run"), threads)
        rows, same = [], []
        for batch in batches:
            for k in beams:
                ctx.log(f"row 10: batch {batch}, beam {k}")
                row, equal = _case(ctx, sides, batch, k, steps, threads)
                rows.append(row)
                same.append(equal)
    names = _peer_names(threads)
    head = [
        "batch",
        "beam",
        "attn_jax sentences/s",
        "attn_jax time",
        "first call (compile)",
        *names,
        "target",
    ]
    sec.table(head, rows)
    sec.table(["batch", "beam", *(f"{n}: lines equal to attn_jax's" for n in names)], same)
    return sec


def _peer_names(threads: list[int]) -> list[str]:
    return [f"{peer} {n}t" for peer in ("CT2 f32", "CT2 int8", "generate") for n in threads]


def _build_marian(ctx: Ctx, out: str, shape: dict) -> str:
    """A random ``MarianMTModel`` with tokenizer files in ``out``: SentencePiece models trained on a few
    words, and a ``vocab.json`` filled to ``shape['vocab']`` pieces (the decoder may produce any of them)."""
    import sentencepiece as spm
    import transformers

    torch, np = ctx.torch, ctx.np
    os.makedirs(out, exist_ok=True)
    words = "the cat sat on mat a dog ran in park birds fly over hills we walk to school every day".split()
    rng = np.random.default_rng(0)
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(" ".join(rng.choice(words, 8)) for _ in range(300)),
        model_writer=proto,
        vocab_size=40,
        minloglevel=2,
        hard_vocab_limit=False,
        bos_id=-1,
        eos_id=1,
        unk_id=0,
        pad_id=-1,
        num_threads=1,
    )
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    pieces = {"</s>": 0, "<unk>": 1}
    for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size())):
        pieces.setdefault(p, len(pieces))
    while len(pieces) < shape["vocab"] - 1:
        pieces[f"\u2581w{len(pieces)}"] = len(pieces)
    pad = len(pieces)
    pieces["<pad>"] = pad
    for name in ("source.spm", "target.spm"):
        with open(os.path.join(out, name), "wb") as f:
            f.write(proto.getvalue())
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(pieces, f)
    config = transformers.MarianConfig(
        vocab_size=shape["vocab"],
        d_model=shape["d_model"],
        encoder_layers=shape["layers"],
        decoder_layers=shape["layers"],
        encoder_attention_heads=shape["heads"],
        decoder_attention_heads=shape["heads"],
        encoder_ffn_dim=shape["ffn"],
        decoder_ffn_dim=shape["ffn"],
        max_position_embeddings=512,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        activation_function="swish",
        scale_embedding=True,
        init_std=INIT_STD,
    )
    torch.manual_seed(0)
    transformers.MarianMTModel(config).eval().save_pretrained(out)
    return out


def _load_sides(ctx: Ctx, ctranslate2, transformers, hf_dir: str, run_dir: str, threads: list[int]) -> dict:
    """The imported attn_jax run, transformers' model, CT2 translators per (quantization, threads), vocab."""
    from attn_jax.data import marian_order
    from attn_jax.pipeline import import_marian, load_model

    import_marian(hf_dir, run_dir)
    loaded = load_model(run_dir)
    with open(os.path.join(hf_dir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    pad = len(vocab) - 1
    order = marian_order(vocab, pad_id=pad, start_id=pad, eos_id=0, unk_id=1)
    translators = {}
    for quantization in ("float32", "int8"):
        out = os.path.join(os.path.dirname(run_dir), f"ct2_{quantization}")
        ctranslate2.converters.TransformersConverter(hf_dir).convert(out, quantization=quantization)
        for n in threads:
            translators[quantization, n] = ctranslate2.Translator(
                out, device="cpu", inter_threads=1, intra_threads=n
            )
    return dict(
        loaded=loaded,
        hf=transformers.MarianMTModel.from_pretrained(hf_dir).eval(),
        ct2=translators,
        vocab=vocab,
        pieces={i: p for p, i in vocab.items()},
        ours={m: i for i, m in enumerate(order) if i != 1},  # Marian id -> attn_jax id
        pad=pad,
    )


def source_batch(np, batch: int, pad: int, ours: dict[int, int]):
    """Row 10's random sources of ``batch`` rows, seeded by the batch size.

    Returns the Marian ids (padded with ``pad``, ``</s>`` ending each source), the lengths, the mask, and the
    attn_jax ids from the Marian-to-attn_jax map ``ours`` (0 where padded).
    """
    rng = np.random.default_rng(10 + batch)
    lens = rng.integers(SOURCE_WIDTH // 2, SOURCE_WIDTH + 1, batch)
    ids = rng.integers(2, pad, (batch, SOURCE_WIDTH))  # Marian ids, no specials
    ids[np.arange(batch), lens - 1] = 0  # </s> ends each source
    mask = np.arange(SOURCE_WIDTH)[None, :] < lens[:, None]
    ids = np.where(mask, ids, pad)
    return ids, lens, mask, np.where(mask, np.vectorize(ours.get)(ids), 0)


def _case(
    ctx: Ctx, sides: dict, batch: int, k: int, steps: int, threads: list[int]
) -> tuple[list[str], list[str]]:
    """Two table rows: every side's time on the same batch with its ratio and the verdict; equal lines."""
    from attn_jax.decoding import beam_search

    jax, jnp, np, torch = ctx.jax, ctx.jnp, ctx.np, ctx.torch
    ids, lens, mask, ours = source_batch(np, batch, sides["pad"], sides["ours"])
    src, jmask = jnp.asarray(ours, jnp.int32), jnp.asarray(mask)
    tokens = [[sides["pieces"][i] for i in row[:n]] for row, n in zip(ids.tolist(), lens, strict=True)]
    usable = torch.get_num_threads()
    outputs = {}

    def attn_jax():
        r = beam_search(
            sides["loaded"].model,
            src,
            jmask,
            beam_size=k,
            max_length=steps,
            max_length_ratio=None,
            length_penalty_alpha=0.0,
        )
        outputs["attn_jax"] = jax.block_until_ready(r).tokens[:, 0]

    def ct2(quantization, n):
        def call():
            r = sides["ct2"][quantization, n].translate_batch(
                tokens, beam_size=k, max_decoding_length=steps, length_penalty=0.0, max_batch_size=0
            )
            outputs[f"CT2 {'f32' if quantization == 'float32' else 'int8'} {n}t"] = [
                [sides["ours"][sides["vocab"][p]] for p in x.hypotheses[0]] for x in r
            ]

        return call

    def generate(n):
        def call():
            torch.set_num_threads(n)
            try:
                with torch.no_grad():
                    r = sides["hf"].generate(
                        input_ids=torch.as_tensor(ids),
                        attention_mask=torch.as_tensor(mask),
                        num_beams=k,
                        do_sample=False,
                        max_new_tokens=steps,
                        length_penalty=0.0,
                        early_stopping=False,
                        bad_words_ids=[[sides["pad"]]],
                        forced_eos_token_id=None,
                    )
            finally:
                torch.set_num_threads(usable)
            outputs[f"generate {n}t"] = [[sides["ours"][i] for i in row[1:]] for row in r.tolist()]

        return call

    calls = {"attn_jax": attn_jax}
    for n in threads:
        calls[f"CT2 f32 {n}t"] = ct2("float32", n)
    for n in threads:
        calls[f"CT2 int8 {n}t"] = ct2("int8", n)
    for n in threads:
        calls[f"generate {n}t"] = generate(n)
    t0 = time.perf_counter()
    attn_jax()
    first = time.perf_counter() - t0
    runs = _timed_runs(calls, ctx.sizes.runs)
    median = {name: statistics.median(r[name] for r in runs) for name in calls}
    ours_lines = [_line(row, steps - 1) for row in np.asarray(outputs["attn_jax"]).tolist()]
    row = [str(batch), str(k), f"{batch / median['attn_jax']:,.1f}", fmt_time(median["attn_jax"])]
    row.append(fmt_time(first))
    target = "—"
    equal = [str(batch), str(k)]
    for name in _peer_names(threads):
        ratios = [r[name] / r["attn_jax"] for r in runs]
        same = sum(a == _line(b, steps - 1) for a, b in zip(ours_lines, outputs[name], strict=True))
        row.append(f"{fmt_time(median[name])} · {fmt_spread(ratios)}")
        equal.append(f"{same} of {batch}")
        if (batch, k) == TARGET_CASE and name == f"CT2 f32 {max(threads)}t":
            target = verdict(statistics.median(ratios) >= CT2_RATIO_MIN)
    row.append(target)
    return row, equal


def _line(ids, length: int = STEPS - 1) -> list[int]:
    """A hypothesis as attn_jax ids up to ``</s>`` (2) or ``<pad>`` (0), cut to ``length`` words: attn_jax
    spends its last step on ``</s>``, the peers may spend theirs on a word."""
    out = []
    for i in ids:
        if i in (0, 2):
            break
        out.append(int(i))
    return out[:length]


def _timed_runs(calls: dict, runs: int) -> list[dict[str, float]]:
    """``runs`` rounds in which every side (after one warm-up call each) repeats its call for ~BUDGET_S
    seconds, the order rotating from round to round; each side's time in a round is its calls' median."""
    for call in calls.values():
        call()
    names = list(calls)
    out = []
    for r in range(runs):
        times = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples = []
            while not samples or (sum(samples) < BUDGET_S and len(samples) < 20):
                t0 = time.perf_counter()
                calls[name]()
                samples.append(time.perf_counter() - t0)
            times[name] = statistics.median(samples)
        out.append(times)
    return out
