"""The Transformer base model of Vaswani et al. (2017), "Attention Is All You Need", on WMT'14 English→German — a
run for an accelerator.

    attn-jax train --config configs/transformer_base.py --workdir runs/transformer_base
    attn-jax average --workdir runs/transformer_base --last 5        # the paper averages the last 5 checkpoints
    attn-jax evaluate --workdir runs/transformer_base/averaged-last-5 --checkpoint last --split test --beam 4 --alpha 0.6
    attn-jax train --config configs/transformer_base.py:smoke --workdir /tmp/smoke_tf_base   # tiny, built-in corpus

Paper settings (§3, §5, Table 3 "base"): 6 + 6 post-LN layers, d_model 512, 8 heads, d_ff 2048, dropout 0.1 on
embeddings and sub-layer outputs, label smoothing 0.1, sinusoidal positions, one byte-pair vocabulary of 37,000
pieces shared by both languages (``data.joint_vocab``; 36,996 + 4 specials, divisible by 8 for tensor parallelism)
and one embedding matrix for the source, the target and the pre-softmax projection (``share_embeddings = "all"``,
§3.4; about 63M parameters, the paper's 65M); Adam (β1 0.9, β2 0.98, ε 1e-9) with ``lr = d^-0.5 · min(step^-0.5, step · 4000^-1.5)``,
which is exactly ``optimizer.learning_rate = 512^-0.5 · 4000^-0.5 ≈ 6.99e-4`` reached by a linear warm-up over
4,000 updates and then ``decay = "rsqrt"``; 100,000 updates; no gradient clipping. Decoding (§6.1): beam 4,
length penalty α = 0.6, the last 5 checkpoints averaged (checkpoints every 1,000 updates here, 5 kept).
Data: TFDS ``wmt14_translate/de-en`` (4.5M training pairs, English source, German target; validation =
newstest2013, test = newstest2014), prepared once on a machine with internet (attn_jax/data/README.md).

Batches hold at most 25,000 padded positions a side (``data.batch_tokens``), the paper's ~25,000 source and
25,000 target tokens a batch; padding to the buckets counts, so a batch carries a little fewer real tokens (the
start-up lines say how many). Pairs over 128 pieces on either side are dropped (the paper states no limit; the
trainer reports how many). SentencePiece trains on the first 1M kept sentences of each language together.
A device that cannot hold 25,000 tokens a batch makes the same update from smaller ones:
``--config.data.batch_tokens=6250 --config.optimizer.accumulate=4`` sums the gradients of four batches and
normalises by all their tokens.

Validation translates newstest2013 with beam 4 and α 0.6 every 5,000 updates (``validation.bleu``); the best
checkpoint is the best by that BLEU. Early stopping after 10 validations without a better BLEU is a guard against
a stalled run; the paper trains a fixed 100,000 updates.

Expected: the paper reports BLEU 27.3 on newstest2014 for the base model (Table 2, 12 hours on 8 P100 GPUs). That
is tokenised BLEU; ``attn-jax evaluate`` reports sacreBLEU on detokenised text, and the two can differ by more than a
point (Post 2018, "A Call for Clarity in Reporting BLEU Scores"). This preset has not been run here (no
accelerator). ``--config.mixed_precision=True`` computes in bfloat16.
Smoke variant (``:smoke``): the same architecture (post-LN, 8 heads, one shared embedding) and optimiser at tiny
sizes (3 + 3 layers, d_model 32, d_ff 64) on 300 generated pairs of the built-in corpus with one joint word
vocabulary (no SentencePiece needed) and batches of 256 tokens, two accumulated per update, 30 updates, early stopping after 2 validations
without a better BLEU.
"""

import dataclasses

from attn_jax.models import transformer_base_config
from attn_jax.train import default_config, smoke_config

# The paper's architecture is the library's own preset; the vocabulary sizes come from the built vocabularies.
PAPER_MODEL = dataclasses.asdict(transformer_base_config(src_vocab=1, tgt_vocab=1))
D_MODEL, WARMUP = PAPER_MODEL["d_model"], 4000
# The paper's schedule d^-0.5 · min(step^-0.5, step · warmup^-1.5) peaks at step = warmup with this rate.
PEAK_LEARNING_RATE = D_MODEL**-0.5 * WARMUP**-0.5


def get_config(arg: str | None = None):
    c = default_config("transformer")
    c.seed = 0
    c.num_train_steps = 100_000
    c.log_every = 100
    c.eval_every = 5_000
    c.checkpoint_every = 1_000
    c.keep_checkpoints = 5
    c.label_smoothing = 0.1
    c.model.update({k: v for k, v in PAPER_MODEL.items() if k in c.model and not k.endswith("vocab")})
    c.model.max_length = 256
    c.optimizer.update(
        name="adam",
        learning_rate=PEAK_LEARNING_RATE,
        b1=0.9,
        b2=0.98,
        eps=1e-9,
        clip_norm=0.0,
        warmup_steps=WARMUP,
        decay="rsqrt",
    )
    c.data.update(corpus="tfds", tfds_name="wmt14_translate/de-en", source_key="en", target_key="de")
    c.data.update(
        vocab="sentencepiece",
        sentencepiece_type="bpe",
        joint_vocab=True,
        src_vocab_size=36_996,
        tgt_vocab_size=36_996,
    )
    c.model.share_embeddings = "all"
    c.data.update(max_source_length=128, max_target_length=128)
    c.data.update(batch_tokens=25_000, eval_batch_size=128, bucket_boundaries=(16, 24, 32, 48, 64, 96, 128))
    # Validation translates newstest2013 as §6.1 decodes, and the best checkpoint is the best by BLEU.
    c.validation.update(bleu=True, beam_size=4, alpha=0.6)
    c.checkpoint.best_metric = "bleu"
    # A guard, not the paper's: stop after 50,000 updates without a better validation BLEU.
    c.early_stopping.patience = 10
    if arg == "smoke":
        c = smoke_config(c)
        c.data.update(vocab="word", src_vocab_size=1000, tgt_vocab_size=1000)
        c.optimizer.accumulate = 2  # the accumulating path, with dropout drawn per micro-batch
        c.early_stopping.patience = 2  # a smoke run's few validations can reach it
        return c
    if arg is not None:
        raise ValueError(f"unknown variant {arg!r}; the only variant is 'smoke'")
    return c
