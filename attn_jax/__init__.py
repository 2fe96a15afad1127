"""attn-jax: attention for neural machine translation in JAX and Flax NNX.

The public face is flat: ``import attn_jax; attn_jax.additive_attention(...)``. Pure functions live in
``attn_jax.attention``; Flax NNX modules in ``attn_jax.nn``. The other packages (``nn``, ``models``,
``decoding``, ``data``, ``eval``, ``exported``, ``parallel``, ``train``, ``pipeline``, ``typing``) are attributes
too, imported on first use: ``import attn_jax`` itself needs only jax (not Flax, optax, orbax, grain or
TensorFlow).
Importing it, before JAX's first computation, keeps XLA's CPU temp buffers in glibc's heap;
``attn_jax.host_allocator()`` says what was set (``ATTN_JAX_HOST_ALLOCATOR=default`` opts out).
"""

from attn_jax._host_memory import HostAllocator, host_allocator, tune_host_allocator

tune_host_allocator()  # before anything below can start JAX; the outcome goes to the "attn_jax" logger
from attn_jax.attention import *  # noqa: E402,F401,F403
from attn_jax.attention import __all__ as _attention_all  # noqa: E402

__version__ = "0.1.0"
__all__ = list(_attention_all) + ["HostAllocator", "host_allocator", "tune_host_allocator"]

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
