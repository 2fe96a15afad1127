"""Row 7: Transformer training tokens/s with and without packed sequences."""

from __future__ import annotations

import time

from harness import Ctx, Section, fmt_ratio, fmt_time


def row_packing(ctx: Ctx) -> Section:
    """Transformer train tokens/s with and without packing (data.pack), measured in the same run."""
    from attn_jax.data import (
        BatchConfig,
        SyntheticSpec,
        WordVocabulary,
        corpus_from_pairs,
        encode_corpus,
        generate_synthetic,
        make_batch_iterator,
    )
    from attn_jax.models import transformer_cpu_config
    from attn_jax.train import OptimizerConfig, StepConfig

    # configs/transformer_cpu.py's model, data and batch size (quick: a tiny corpus, 3 timed rounds)
    spec = SyntheticSpec(
        train_size=400 if ctx.quick else 4000,
        validation_size=1,
        test_per_bucket=1,
        seed=0,
        min_length=3,
        max_length=8 if ctx.quick else 30,
    )
    bounds, batch, rounds = ((16,), 8, 3) if ctx.quick else ((16, 24, 32), 32, 24)
    pairs = generate_synthetic(spec)["train"]
    corpus = corpus_from_pairs(pairs, name="bench")
    src_vocab = WordVocabulary.build(corpus.sources)
    tgt_vocab = WordVocabulary.build(corpus.targets)
    encoded = encode_corpus(corpus, src_vocab, tgt_vocab)
    config = BatchConfig(batch_size=batch, bucket_boundaries=bounds, seed=0)
    model = transformer_cpu_config(src_vocab.size, tgt_vocab.size, max_length=128)
    step_cfg = StepConfig(
        model=model,
        optimizer=OptimizerConfig(name="adam", learning_rate=1e-3, eps=1e-9, b2=0.98, clip_norm=1.0),
        label_smoothing=0.1,
    )
    iters = {
        "unpacked": make_batch_iterator(encoded, config, prefetch=0),
        "packed": make_batch_iterator(encoded, config, prefetch=0, pack=True),
    }
    packing = iters["packed"].plan.packing
    sec = Section(
        "7. Packed sequences: Transformer training tokens/s with and without data.pack",
        f"configs/transformer_cpu.py's model (d 64, 2+2 layers, dropout 0.1) and batches of {batch} rows on "
        f"{len(pairs):,} pairs of the built-in corpus ({spec.min_length}-{spec.max_length} words, buckets "
        f"{list(bounds)}). Unpacked: one pair a row, bucketed; packed: `make_batch_iterator(pack=True)`, "
        f"{packing.summary()}. Every batch shape is compiled before timing; then {rounds} rounds of one "
        "`train_step` of each (order alternating, metrics fetched as the training loop does). Tokens are real "
        "target tokens (labels), the loss's denominator. No target: the ratio is the measurement.",
    )
    seconds, tokens, positions = _timed_steps(ctx, iters, step_cfg, rounds)
    names = list(iters)
    tps = {k: tokens[k] / seconds[k] for k in names}
    rows = [
        [
            k,
            f"{tokens[k] / rounds:,.0f}",
            f"{tokens[k] / positions[k]:.1%}",
            fmt_time(seconds[k] / rounds),
            f"{tps[k]:,.0f}",
        ]
        for k in names
    ]
    sec.table(
        ["batches", "target tokens / batch", "real / padded positions", "time / step", "tokens/s"], rows
    )
    sec.notes.append(f"packed / unpacked tokens/s: {fmt_ratio(tps['packed'] / tps['unpacked'])}")
    return sec


def _timed_steps(ctx: Ctx, iters: dict, step_cfg, rounds: int):
    """Seconds, real target tokens and target positions of ``rounds`` steps of each iterator, interleaved.

    Each side first trains on four batches of each of its shapes, so that no timed step compiles.
    """
    from attn_jax.train import init_train_state, train_step

    jax = ctx.jax
    state = {k: jax.device_put(init_train_state(step_cfg, 0)) for k in iters}
    for k, it in iters.items():  # compile every shape this run meets
        for _ in range(len(it.plan.shapes) * 4):
            state[k], m = train_step(state[k], next(it), step_cfg)
            jax.device_get(m)
    seconds = {k: 0.0 for k in iters}
    tokens = {k: 0 for k in iters}
    positions = {k: 0 for k in iters}
    names = list(iters)
    for r in range(rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            b = next(iters[k])
            tic = time.perf_counter()
            state[k], m = train_step(state[k], b, step_cfg)
            jax.device_get(m)
            seconds[k] += time.perf_counter() - tic
            tokens[k] += int(b.tgt_len.sum())
            positions[k] += b.tgt_out.size
    return seconds, tokens, positions
