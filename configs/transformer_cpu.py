"""The Transformer (Vaswani et al. 2017) at CPU size on the built-in synthetic corpus, the third column of the
Bahdanau et al. comparison (RNNenc, RNNsearch, Transformer on the same data and budget).

    attn-jax train --config configs/transformer_cpu.py --workdir runs/transformer_cpu
    attn-jax train --config configs/transformer_cpu.py:smoke --workdir /tmp/smoke_tf

Pre-LN encoder–decoder of 2 + 2 layers, d_model 64, 4 heads, d_ff 256, sinusoidal positions, the decoder's input
embedding tied to its softmax, dropout 0.1, label smoothing 0.1 (371k parameters; RNNsearch has 614k); Adam
(β2 0.98, 200 warm-up steps, constant 4e-3 after) on the same data, batches of 32 and number of updates (3,000) as
configs/rnnsearch_cpu.py.

How the learning rate was chosen (seed 0, validation perplexity without label smoothing at steps 500 / 1500 / 3000):
2e-3: 29.3 / 2.81 / 1.23; 4e-3: 20.5 / 1.90 / 1.19. Chosen by validation loss, not test BLEU.

Expected: see experiments/bahdanau2015/README.md (BLEU by length beside RNNenc and RNNsearch).
"""

from attn_jax.train import default_config, smoke_config


def get_config(arg: str | None = None):
    c = default_config("transformer")
    c.seed = 0
    c.num_train_steps = 3000
    c.log_every = 50
    c.eval_every = 500
    c.checkpoint_every = 500
    c.label_smoothing = 0.1
    c.model.update(
        d_model=64,
        heads=4,
        d_ff=256,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.1,
        norm="pre",
        positions="sinusoidal",
        max_length=128,
        share_embeddings="decoder",
    )
    c.optimizer.update(name="adam", learning_rate=4e-3, eps=1e-9, b2=0.98, clip_norm=1.0, warmup_steps=200)
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
