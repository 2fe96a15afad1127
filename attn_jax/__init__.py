"""attn-jax: attention for neural machine translation in JAX and Flax NNX.

The public face is flat: ``import attn_jax; attn_jax.additive_attention(...)``. Pure functions live in
``attn_jax.attention``; Flax NNX modules in ``attn_jax.nn``.
"""

from attn_jax.attention import *  # noqa: F401,F403
from attn_jax.attention import __all__ as _attention_all

__version__ = "0.1.0"
__all__ = list(_attention_all)
