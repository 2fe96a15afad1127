"""The built-in synthetic corpus as the TFDS dataset ``attn_jax_synthetic``, registered on import.

Configs: ``default`` (50k train pairs), ``small`` (10k, for quick CPU runs), ``tiny`` (a few hundred, for
tests). Every config has ``train``, ``validation`` and ``test`` splits with the features ``source``,
``target`` and ``alignment`` (all text). Building needs no download; ``tfds.load("attn_jax_synthetic/tiny",
data_dir=...)`` builds on first use.
"""

from __future__ import annotations

import dataclasses

import tensorflow_datasets as tfds
from etils import epath

from attn_jax.data._synthetic import (
    GENERATOR_VERSION,
    SPLITS,
    TEST_BUCKETS,
    SyntheticSpec,
    generate_synthetic,
)


@dataclasses.dataclass(eq=False)
class SyntheticConfig(tfds.core.BuilderConfig):
    """A builder config holding the :class:`SyntheticSpec` (sizes and seed) of the corpus it builds."""

    spec: SyntheticSpec = dataclasses.field(default_factory=SyntheticSpec)


class AttnJaxSynthetic(tfds.core.GeneratorBasedBuilder):
    """Synthetic English-like to verb-final pairs with gold word alignments (see attn_jax/data/README.md)."""

    VERSION = tfds.core.Version(GENERATOR_VERSION)
    RELEASE_NOTES = {"1.0.0": "First release."}
    BUILDER_CONFIGS = [
        SyntheticConfig(
            name="default", description="50k train, 1k validation, 300 test pairs per length bucket."
        ),
        SyntheticConfig(
            name="small",
            description="10k train, 500 validation, 100 test pairs per length bucket.",
            spec=SyntheticSpec(train_size=10_000, validation_size=500, test_per_bucket=100),
        ),
        SyntheticConfig(
            name="tiny",
            description="200 train, 50 validation, 10 test pairs per length bucket (for tests).",
            spec=SyntheticSpec(train_size=200, validation_size=50, test_per_bucket=10),
        ),
    ]
    DEFAULT_CONFIG_NAME = "default"
    # TFDS 4.9.10 resolves the default code_path through `importlib_resources`, a package it only declares for
    # Python < 3.9 (tensorflow/datasets#11212); naming the file directly avoids that import.
    code_path = epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        buckets = ", ".join(f"{lo}-{hi if hi else ''}" for lo, hi in TEST_BUCKETS)
        return self.dataset_info_from_configs(
            description=(
                "Seeded synthetic translation corpus: an English-like SVO source with relative clauses, "
                "prepositional phrases and conjunctions, and a verb-final target with postpositions, "
                "post-nominal adjectives and noun gender/number particles. Every pair carries its gold "
                f"Pharaoh alignment. The test split is stratified over source-length buckets {buckets}."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "source": tfds.features.Text(),
                    "target": tfds.features.Text(),
                    "alignment": tfds.features.Text(),
                }
            ),
            supervised_keys=("source", "target"),
            # Keep generation order on disk, so reading a split gives the generator's pairs in order.
            disable_shuffling=True,
            homepage="https://arxiv.org/abs/1409.0473",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        splits = generate_synthetic(self.builder_config.spec)
        return {name: self._generate_examples(splits[name]) for name in SPLITS}

    def _generate_examples(self, pairs):
        for k, pair in enumerate(pairs):
            yield k, {"source": pair.source, "target": pair.target, "alignment": pair.alignment}
