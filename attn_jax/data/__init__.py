"""Data for attn_jax: built-in synthetic corpus, TFDS and plain-text readers, vocabularies, XLA batching.

Importing this package registers the TFDS dataset ``attn_jax_synthetic`` (configs ``default``, ``small``,
``tiny``). TensorFlow itself is imported only when a TFDS dataset is read or built. See
attn_jax/data/README.md.

Typical use::

    from attn_jax import data
    train = data.load_synthetic_corpus("train", "small", data_dir="/tmp/tfds")
    src_vocab = data.WordVocabulary.build(train.sources, max_size=1000)
    tgt_vocab = data.WordVocabulary.build(train.targets, max_size=1000)
    batches = data.make_batch_iterator(
        data.encode_corpus(train, src_vocab, tgt_vocab), data.BatchConfig(batch_size=64, max_source_length=50)
    )
    batch = next(batches)          # data.Batch of NumPy arrays
    state = batches.get_state()    # save beside the checkpoint; batches.set_state(state) resumes exactly
"""

from attn_jax.data._batching import (
    Batch,
    BatchConfig,
    BatchIterator,
    BatchPlan,
    Bucket,
    BucketStats,
    EncodedCorpus,
    PackedPlan,
    Packing,
    assemble_batch,
    assemble_packed_batch,
    encode_corpus,
    make_batch_iterator,
    pack_pairs,
    parse_alignment,
)
from attn_jax.data._copy import extend_with_source
from attn_jax.data._corpus import (
    VALIDATION_NAMES,
    CorpusError,
    CorpusSpec,
    ParallelCorpus,
    TfdsLocation,
    corpus_from_pairs,
    find_splits,
    iter_plain_pairs,
    iter_tsv_pairs,
    load_synthetic_corpus,
    load_tfds_corpus,
    prepare_tfds_dataset,
    read_moses_corpus,
    read_plain_corpus,
    read_tsv_corpus,
    resolve_split,
    split_path,
)
from attn_jax.data._marian import MarianVocabulary, marian_order
from attn_jax.data._prepared import PreparedCorpus, open_prepared, prepare_corpus, read_manifest
from attn_jax.data._synthetic import (
    GENERATOR_VERSION,
    TEST_BUCKETS,
    SyntheticPair,
    SyntheticSpec,
    generate_synthetic,
    length_bucket,
    parse_source,
    translate_source,
)
from attn_jax.data._tfds_synthetic import AttnJaxSynthetic, SyntheticConfig
from attn_jax.data._vocab import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    SentencePieceVocabulary,
    Vocabulary,
    WordVocabulary,
    load_vocabularies,
    load_vocabulary,
    save_vocabularies,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "GENERATOR_VERSION",
    "PAD_ID",
    "SPECIAL_TOKENS",
    "TEST_BUCKETS",
    "UNK_ID",
    "VALIDATION_NAMES",
    "AttnJaxSynthetic",
    "Batch",
    "BatchConfig",
    "BatchIterator",
    "BatchPlan",
    "Bucket",
    "BucketStats",
    "CorpusError",
    "CorpusSpec",
    "EncodedCorpus",
    "PackedPlan",
    "Packing",
    "ParallelCorpus",
    "PreparedCorpus",
    "SentencePieceVocabulary",
    "MarianVocabulary",
    "marian_order",
    "SyntheticConfig",
    "SyntheticPair",
    "SyntheticSpec",
    "TfdsLocation",
    "Vocabulary",
    "WordVocabulary",
    "assemble_batch",
    "assemble_packed_batch",
    "corpus_from_pairs",
    "encode_corpus",
    "extend_with_source",
    "find_splits",
    "generate_synthetic",
    "iter_plain_pairs",
    "iter_tsv_pairs",
    "length_bucket",
    "load_synthetic_corpus",
    "load_tfds_corpus",
    "load_vocabularies",
    "load_vocabulary",
    "make_batch_iterator",
    "open_prepared",
    "pack_pairs",
    "parse_alignment",
    "parse_source",
    "prepare_corpus",
    "prepare_tfds_dataset",
    "read_manifest",
    "read_moses_corpus",
    "read_plain_corpus",
    "read_tsv_corpus",
    "resolve_split",
    "save_vocabularies",
    "split_path",
    "translate_source",
]
