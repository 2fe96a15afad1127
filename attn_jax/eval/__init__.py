"""Evaluation for attn_jax: sacreBLEU overall, by source length and without ``<unk>``; AER; heatmaps; tables.

Works on strings, token lists and NumPy arrays and imports nothing else of attn_jax; sacrebleu, sacremoses and
matplotlib (the ``eval`` extra) are imported only when a BLEU score, a detokenisation or a picture is made.
See attn_jax/eval/README.md.

Typical use::

    from attn_jax import eval as ev
    r = ev.bleu_by_length(hypotheses, references, sources)          # overall + 0-9, 10-19, ..., 60+
    # AER needs the attention of the *reference* (teacher forcing): the gold aligns source and reference words.
    links = [ev.argmax_alignment(w[:len(r.split()), :len(s.split())]) for w, s, r in zip(attn, sources, refs)]
    aer = ev.alignment_error_rate(links, gold_pharaoh_strings)
    ev.plot_attention(w, src_words, tgt_words, "runs/x/attention_0.png", gold=gold_pharaoh_strings[0])
    print(ev.bleu_by_length_markdown({"RNNenc": r_enc, "RNNsearch": r_search}))
"""

from attn_jax.eval._alignment import (
    AerResult,
    Alignment,
    Link,
    Links,
    alignment_error_rate,
    alignment_matrix,
    argmax_alignment,
    format_pharaoh,
    links_from_matrix,
    mutual_argmax_alignment,
    parse_pharaoh,
    threshold_alignment,
)
from attn_jax.eval._bleu import (
    PAPER_BUCKETS,
    UNK_ID,
    UNK_TOKEN,
    BleuByLength,
    BleuResult,
    BucketBleu,
    ChrfResult,
    LengthBucket,
    ScoreByLength,
    TerResult,
    bleu_by_length,
    bleu_no_unk,
    bleu_subset,
    bucket_index,
    corpus_bleu,
    corpus_chrf,
    corpus_ter,
    has_unk,
    length_buckets,
    score_by_length,
)
from attn_jax.eval._detok import DETOKENIZERS, detokenize, looks_tokenized
from attn_jax.eval._html import EvaluatedRun, paired_bootstrap, read_evaluated_run, write_report_html
from attn_jax.eval._options import BleuSettings, bleu_options, sacrebleu_tokenized_warning_dropped
from attn_jax.eval._plots import attention_figsize, plot_attention, plot_bleu_by_length
from attn_jax.eval._tables import (
    SystemScores,
    bleu_by_length_json,
    bleu_by_length_markdown,
    summary_json,
    summary_markdown,
)

__all__ = [
    "DETOKENIZERS",
    "EvaluatedRun",
    "PAPER_BUCKETS",
    "UNK_ID",
    "UNK_TOKEN",
    "AerResult",
    "Alignment",
    "BleuByLength",
    "BleuResult",
    "BleuSettings",
    "BucketBleu",
    "ChrfResult",
    "LengthBucket",
    "Link",
    "Links",
    "ScoreByLength",
    "SystemScores",
    "TerResult",
    "alignment_error_rate",
    "alignment_matrix",
    "argmax_alignment",
    "attention_figsize",
    "bleu_by_length",
    "bleu_by_length_json",
    "bleu_by_length_markdown",
    "bleu_no_unk",
    "bleu_options",
    "bleu_subset",
    "bucket_index",
    "corpus_bleu",
    "corpus_chrf",
    "corpus_ter",
    "detokenize",
    "format_pharaoh",
    "has_unk",
    "length_buckets",
    "links_from_matrix",
    "looks_tokenized",
    "mutual_argmax_alignment",
    "paired_bootstrap",
    "parse_pharaoh",
    "plot_attention",
    "plot_bleu_by_length",
    "read_evaluated_run",
    "sacrebleu_tokenized_warning_dropped",
    "score_by_length",
    "summary_json",
    "summary_markdown",
    "threshold_alignment",
    "write_report_html",
]
