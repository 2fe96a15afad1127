"""attn-jax: attention for neural machine translation in JAX and Flax NNX.

The public face is flat: ``import attn_jax; attn_jax.additive_attention(...)``. Pure functions live in
``attn_jax.attention``; Flax NNX modules in ``attn_jax.nn``. The other packages (``nn``, ``models``,
``decoding``, ``data``, ``eval``, ``exported``, ``parallel``, ``train``, ``pipeline``, ``typing``) are attributes
too, imported on first use: ``import attn_jax`` itself needs only jax (not Flax, optax, orbax, grain or
TensorFlow).
``attn_jax.tune_host_allocator()`` (also ``attn_jax.train.tune_host_allocator``) keeps XLA's CPU temp buffers in
glibc's heap; the trainer calls it, and a script of your own calls it before its first JAX computation.
"""

from attn_jax._host_memory import HostAllocator, tune_host_allocator
from attn_jax.attention import *  # noqa: F401,F403
from attn_jax.attention import __all__ as _attention_all

__version__ = "0.1.0"
__all__ = list(_attention_all) + ["HostAllocator", "tune_host_allocator"]

# Imported on first attribute access (PEP 562), so that `import attn_jax` stays light.
_SUBMODULES = frozenset(
    (
        "attention",
        "data",
        "decoding",
        "eval",
        "exported",
        "models",
        "nn",
        "parallel",
        "pipeline",
        "train",
        "typing",
    )
)


def __getattr__(name: str):
    if name in _SUBMODULES:
        from attn_jax._extras import require

        return require(f"attn_jax.{name}", f"attn_jax.{name}")
    raise AttributeError(f"module 'attn_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SUBMODULES)
