"""A trained run's pipeline: load it, translate sentences, evaluate a split.

The library functions behind ``attn-jax translate`` and ``attn-jax evaluate``, for the CLI and for experiments
alike (``experiments/`` call these, never ``attn_jax.cli*``)::

    from attn_jax import pipeline

    loaded = pipeline.load_model("runs/rnnsearch_cpu")              # best checkpoint, vocabularies, config
    hyps = pipeline.translate_sentences(loaded, ["the dog slept ."], pipeline.DecodeOptions(beam_size=12))
    result = pipeline.evaluate_workdir("runs/rnnsearch_cpu", split="test")   # BLEU, AER, heatmaps, tables

* loading (``_load``): :class:`LoadedModel`, :func:`load_model`, :func:`load_ensemble`, :class:`TranslateError`,
  :func:`quiet_checkpoint_logs`;
* decoding options (``_options``): :class:`DecodeOptions`, the options both commands share;
  :class:`AttentionChoice` (the decoder layer and head of alignments) and :class:`AttentionChoiceError`;
* length limit (``_length``): :func:`length_limit` (the rule both commands share),
  :func:`model_length_cap`, :class:`LengthLimitReport`, :func:`length_limit_report`,
  :func:`merge_length_limit_reports`;
* translating (``_translate``): :class:`Translation`, :func:`translate_sentences` and its batching,
  :func:`length_batches`, :func:`pad_rows`, :func:`padded_width`;
* a split (``_split``): :func:`load_split`, :func:`select_examples`;
* attention outside beam search (``_attention``): :func:`reference_attention`,
  :func:`reference_cross_attention`, :func:`hypothesis_cross_attention`, :func:`choose_attention`, :func:`sharpest_head`, :func:`figure3_examples`, :class:`HeatmapPick`;
* BLEU settings (``_bleu``): :func:`bleu_options` (``attn_jax.eval.BleuSettings`` holds the settings);
* scoring given translations (``_score``): :func:`score_pairs`, :class:`ScoredPair`;
* evaluating (``_evaluate``): :func:`evaluate_workdir`; progress (``_progress``): :func:`decode_progress`;
* importing a Hugging Face Marian checkpoint (``_marian``): :func:`import_marian`, :func:`read_marian`,
  :class:`MarianImportError`, :class:`ImportedRun`.

Importing this package needs only numpy (and jax, through ``attn_jax``); Flax, orbax, the data readers and
sacreBLEU are imported when a function needs them.
"""

from attn_jax.pipeline._attention import (
    HeatmapPick,
    choose_attention,
    figure3_examples,
    hypothesis_cross_attention,
    reference_attention,
    reference_cross_attention,
    sharpest_head,
)
from attn_jax.pipeline._bleu import bleu_options
from attn_jax.pipeline._evaluate import evaluate_workdir
from attn_jax.pipeline._length import (
    LengthLimitReport,
    length_limit,
    length_limit_report,
    merge_length_limit_reports,
    model_length_cap,
)
from attn_jax.pipeline._load import (
    WEIGHTS,
    LoadedModel,
    TranslateError,
    load_ensemble,
    load_model,
    quiet_checkpoint_logs,
)
from attn_jax.pipeline._marian import ImportedRun, MarianImportError, import_marian, read_marian
from attn_jax.pipeline._options import AttentionChoice, AttentionChoiceError, DecodeOptions
from attn_jax.pipeline._progress import decode_progress
from attn_jax.pipeline._score import ScoredPair, score_pairs
from attn_jax.pipeline._split import load_split, select_examples
from attn_jax.pipeline._translate import (
    Translation,
    length_batches,
    pad_rows,
    padded_width,
    translate_sentences,
)

__all__ = [
    "WEIGHTS",
    "AttentionChoice",
    "AttentionChoiceError",
    "DecodeOptions",
    "HeatmapPick",
    "ImportedRun",
    "LengthLimitReport",
    "LoadedModel",
    "MarianImportError",
    "ScoredPair",
    "TranslateError",
    "Translation",
    "bleu_options",
    "choose_attention",
    "decode_progress",
    "evaluate_workdir",
    "figure3_examples",
    "hypothesis_cross_attention",
    "import_marian",
    "length_batches",
    "length_limit",
    "length_limit_report",
    "load_ensemble",
    "load_model",
    "load_split",
    "merge_length_limit_reports",
    "model_length_cap",
    "pad_rows",
    "padded_width",
    "quiet_checkpoint_logs",
    "read_marian",
    "reference_attention",
    "reference_cross_attention",
    "score_pairs",
    "select_examples",
    "sharpest_head",
    "translate_sentences",
]
