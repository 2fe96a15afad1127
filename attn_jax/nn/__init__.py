"""Flax NNX modules: they hold parameters (annotated with logical axis names) and call ``attn_jax.attention``."""

from attn_jax.nn.attention import AdditiveAttention, DotProductAttention, LuongAttention, MultiHeadAttention

__all__ = ["AdditiveAttention", "DotProductAttention", "LuongAttention", "MultiHeadAttention"]
