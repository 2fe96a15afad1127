"""The RNNsearch model, optimiser and random batches that rows 4, 5 and 6 share."""

from __future__ import annotations

from harness import Ctx

# Rows 4-6: Adam as in the paper's successors, with the paper's gradient-norm clipping at 1.
LEARNING_RATE = 1e-3
ADAM_EPS = 1e-8
CLIP_NORM = 1.0


def step_config(ctx: Ctx):
    """The RNNsearch + Adam configuration rows 4, 5 and 6 share (so they share compiled programs:
    ``init_train_state`` compiles once per run)."""
    from attn_jax.models import RNNConfig
    from attn_jax.train import OptimizerConfig, StepConfig

    s = ctx.sizes
    model = RNNConfig(
        src_vocab=s.vocab,
        tgt_vocab=s.vocab,
        embed=s.embed,
        hidden=s.hidden,
        maxout=s.maxout,
        align=s.align,
    )
    optimizer = OptimizerConfig(name="adam", learning_rate=LEARNING_RATE, eps=ADAM_EPS, clip_norm=CLIP_NORM)
    return StepConfig(model=model, optimizer=optimizer)


def random_batches(ctx: Ctx, count: int, batch: int, length: int, vocab: int, seed: int):
    """Fixed-shape token batches ``[batch, length]`` with random true lengths in ``[length/2, length]``."""
    from attn_jax.data import BOS_ID, EOS_ID, PAD_ID, Batch

    np = ctx.np
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        pos = np.arange(length)[None, :]
        src_len = rng.integers(length // 2, length + 1, batch).astype(np.int32)
        tgt_len = rng.integers(length // 2, length + 1, batch).astype(np.int32)  # labels incl. </s>
        src = np.where(pos < src_len[:, None], rng.integers(4, vocab, (batch, length)), PAD_ID).astype(
            np.int32
        )
        words = rng.integers(4, vocab, (batch, length))
        tgt_out = np.where(pos < tgt_len[:, None] - 1, words, PAD_ID)
        tgt_out[np.arange(batch), tgt_len - 1] = EOS_ID
        tgt_in = np.concatenate([np.full((batch, 1), BOS_ID), words[:, :-1]], axis=1)
        tgt_in = np.where(pos < tgt_len[:, None], tgt_in, PAD_ID)
        out.append(
            Batch(
                src=src,
                src_len=src_len,
                tgt_in=tgt_in.astype(np.int32),
                tgt_out=tgt_out.astype(np.int32),
                tgt_len=tgt_len,
                example_id=np.arange(batch, dtype=np.int32),
            )
        )
    return out
