"""GNMT (Wu et al. 2016) at the paper's sizes on WMT'14 English→French — a run for an accelerator (or 8 of them).

    attn-jax train --config configs/gnmt_wmt14.py --workdir runs/gnmt_wmt14
    attn-jax train --config configs/gnmt_wmt14.py:smoke --workdir /tmp/smoke_gnmt   # tiny sizes, built-in corpus

8 encoder + 8 decoder LSTM layers of 1024 units, bottom encoder layer bidirectional, residual connections from
the third layer up, normalised additive attention of width 1024 (280,859,905 parameters with 32k vocabularies).
Wordpieces are approximated by the 32k word shortlist here; the paper's optimiser schedule (Adam then SGD) is
replaced by Adam with warm-up. See experiments/gnmt/README.md for multi-device and multi-host launches.
The TFDS data must be prepared once on a machine with internet (see attn_jax/data/README.md).

Expected: the paper reports 38.95 BLEU on newstest2014 En→Fr for the single word-piece model after ~6 days on 96
GPUs; this preset has not been run here (no accelerator). Smoke variant (`:smoke`): 3 + 3 layers of 24 units on
300 generated pairs, 30 updates.
"""

from attn_jax.train import default_config, smoke_config


def get_config(arg: str | None = None):
    c = default_config("gnmt")
    c.seed = 0
    c.num_train_steps = 340_000
    c.log_every = 100
    c.eval_every = 5_000
    c.checkpoint_every = 5_000
    c.model.update(embed=1024, hidden=1024, align=1024, encoder_layers=8, decoder_layers=8, residual_start=3)
    c.optimizer.update(name="adam", learning_rate=2e-4, eps=1e-8, clip_norm=5.0, warmup_steps=2_000)
    c.data.update(corpus="tfds", tfds_name="wmt14_translate/fr-en", source_key="en", target_key="fr")
    # 31,996 words + 4 specials = 32,000 rows: divisible by 8, so tensor parallelism over 8 devices splits the
    # embeddings and the softmax evenly (32,000 words would give 32,004 rows, replicated under model=8).
    c.data.update(src_vocab_size=31_996, tgt_vocab_size=31_996, max_source_length=50, max_target_length=50)
    c.data.update(batch_size=128, eval_batch_size=128, bucket_boundaries=(16, 24, 32, 48, 64))
    if arg == "smoke":
        return smoke_config(c)
    if arg is not None:
        raise ValueError(f"unknown variant {arg!r}; the only variant is 'smoke'")
    return c
