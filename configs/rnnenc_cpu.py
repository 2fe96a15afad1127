"""RNNenc (Cho et al. 2014, the paper's RNNencdec baseline) at CPU size on the built-in corpus, the other half of
the `make demo` run: rnnsearch_cpu's twin without attention, so the two can be compared.

    attn-jax train --config configs/rnnenc_cpu.py --workdir runs/rnnenc_cpu
    attn-jax train --config configs/rnnenc_cpu.py:smoke --workdir /tmp/smoke_enc      # ~30 s on a CPU, mostly compiling

Same sizes (embedding 64, hidden 128, maxout 64), data (built-in `small` corpus, pairs up to 30 words), optimiser
(Adam 2e-3, 100 warm-up steps, clipping at 1) and number of updates (1,500) as configs/rnnsearch_cpu.py.

Expected (measured, seed 0): 1,500 updates in 2m15s of training (2m43s with start-up) on 2 CPU cores, 467k
parameters. Train loss 6.48 at step 50, 4.44 at 200, 3.98 at 500, 3.83 at 1000, 3.71 at 1500; validation loss
4.29 / 3.97 / 3.85 / 3.84 at steps 250 / 500 / 1000 / 1500 (perplexity 73 → 46): it plateaus where RNNsearch
goes on to 2.58 (configs/rnnsearch_cpu.py), as expected of a model that sees the source only through one
128-unit vector. No attention diagnostics (the model has none).
Smoke (`:smoke`): 30 updates on 300 short pairs, ~30 s wall (mostly compilation).
"""

from attn_jax.train import default_config, smoke_config


def get_config(arg: str | None = None):
    c = default_config()
    c.seed = 0
    c.num_train_steps = 3000
    c.log_every = 50
    c.eval_every = 500
    c.checkpoint_every = 500
    c.model.update(arch="rnnenc", embed=64, hidden=128, maxout=64, align=64)
    c.optimizer.update(name="adam", learning_rate=6e-3, eps=1e-8, clip_norm=1.0, warmup_steps=100)
    # 20,000 generated pairs of 3-30 words (requested; a clause may overshoot, pairs over 30 words are dropped).
    c.data.update(corpus="synthetic", synthetic="custom", max_source_length=30, max_target_length=30)
    c.data.synthetic_spec.update(
        train_size=20_000, validation_size=500, test_per_bucket=100, seed=0, min_length=3, max_length=30
    )
    c.data.update(batch_size=32, eval_batch_size=64, bucket_boundaries=(16, 24, 32))
    if arg == "smoke":
        return smoke_config(c)
    if arg is not None:
        raise ValueError(f"unknown variant {arg!r}; the only variant is 'smoke'")
    return c
