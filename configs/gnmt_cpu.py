"""GNMT (Wu et al. 2016) at CPU size on the built-in synthetic corpus.

    attn-jax train --config configs/gnmt_cpu.py --workdir runs/gnmt_cpu
    attn-jax train --config configs/gnmt_cpu.py:smoke --workdir /tmp/smoke

GNMT's layout (bottom encoder layer bidirectional, residual connections from the third layer up, the bottom decoder
layer's output attends over the top encoder layer and the context feeds every decoder layer) with small sizes:
4 + 4 LSTM layers of 64 units, normalised additive attention of width 64, Adam. `configs/gnmt_wmt14.py` has the
paper's sizes.

Expected: see experiments/gnmt/README.md for measured losses and tokens/s. Smoke variant (`:smoke`): 3 + 3
layers of 24 units on 300 generated pairs, 30 updates; measured loss 6.6 -> 5.4 (validation 5.40), a few
minutes on a loaded 2-core CPU, mostly compilation.
"""

from attn_jax.train import default_config, smoke_config


def get_config(arg: str | None = None):
    c = default_config("gnmt")
    c.seed = 0
    c.num_train_steps = 1500
    c.log_every = 50
    c.eval_every = 250
    c.checkpoint_every = 250
    c.model.update(embed=64, hidden=64, align=64, encoder_layers=4, decoder_layers=4, residual_start=3)
    c.optimizer.update(name="adam", learning_rate=2e-3, eps=1e-8, clip_norm=1.0, warmup_steps=100)
    c.data.update(corpus="synthetic", synthetic="small", max_source_length=30, max_target_length=30)
    c.data.update(batch_size=32, eval_batch_size=64, bucket_boundaries=(16, 24, 32))
    if arg == "smoke":
        return smoke_config(c)
    if arg is not None:
        raise ValueError(f"unknown variant {arg!r}; the only variant is 'smoke'")
    return c
