"""RNNsearch-30 of Bahdanau, Cho & Bengio (2015) at the paper's sizes on WMT'14 English→French: the attention
model (bidirectional GRU encoder, additive attention reading s_{i-1}, GRU decoder with a maxout deep output).

    attn-jax train --config configs/rnnsearch30.py --workdir runs/rnnsearch30
    attn-jax train --config configs/rnnsearch30.py --workdir runs/rnnsearch30 --resume     # after a preemption
    attn-jax train --config configs/rnnsearch30.py:smoke --workdir /tmp/smoke_rnnsearch30   # ~30 s on a CPU (mostly compiling), built-in corpus

Paper settings (section 4 and appendix B): embedding 620, hidden 1000, maxout 500, alignment 1000 (RNNsearch),
30,000-word shortlists per language, training pairs of at most 30 words, minibatches of 80 sentences, Adadelta
(ρ = 0.95, ε = 1e-6) with the gradient's L2 norm rescaled to at most 1. Data: TFDS `wmt14_translate/fr-en`
(English source, French target; validation = newstest2013), which must be prepared once on a machine with
internet (attn_jax/data/README.md). Differences from the paper: the paper trained on a 348M-word subset selected
by Axelrod et al.'s method and validated on news-test-2012+2013; TFDS gives the full WMT'14 training data (~40M
pairs held in memory by the reader: cap it with --config.data.max_train_examples=N); the paper does not give its
number of updates (about 5 days per model on one GPU): 300,000 updates of 80 sentences here is our choice.

Expected: the paper reports test BLEU 21.50 (all sentences) / 31.44 (no UNK) on newstest2014 (Table 1) after ~5 days on a
2015 GPU; the trainer reports validation loss, perplexity and attention diagnostics; BLEU
comes from `attn-jax evaluate --workdir runs/X --split test` (beam search). Runtime: days on one GPU; not runnable on a CPU.
Smoke variant (`:smoke`): the same architecture and optimiser at tiny sizes on 300 generated pairs of the
built-in corpus, 30 updates, ~30 s on a CPU, mostly compilation (no WMT needed).
"""

from attn_jax.train import paper_config, smoke_config


def get_config(arg: str | None = None):
    c = paper_config("rnnsearch", max_length=30)
    if arg == "smoke":
        return smoke_config(c)
    if arg is not None:
        raise ValueError(f"unknown variant {arg!r}; the only variant is 'smoke'")
    return c
