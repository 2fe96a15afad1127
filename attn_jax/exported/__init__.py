"""A trained model outside the training code: ``jax.export``'s StableHLO of its encoder and search.

``attn-jax export --workdir W --output DIR`` (:func:`export_run`) writes the run's beam search and greedy
decoding, its weights and vocabularies; :func:`load` reads them back and translates with jax and numpy alone::

    from attn_jax import exported
    model = exported.load("exports/rnnsearch")
    model.translate(["the dog slept ."])

Importing this package imports neither Flax nor a model; :func:`export_run` imports them when it runs. The
file layout and the manifest are described in ``docs/export.md``.
"""

from attn_jax.exported._export import PLATFORMS, export_run
from attn_jax.exported._load import ExportedModel, ExportError, LimitReport, load

__all__ = ["PLATFORMS", "ExportError", "ExportedModel", "LimitReport", "export_run", "load"]
