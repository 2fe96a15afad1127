"""Flax NNX modules: they hold parameters (annotated with logical axis names) and call ``attn_jax.attention``."""

from attn_jax.nn.attention import AdditiveAttention, DotProductAttention, LuongAttention, MultiHeadAttention
from attn_jax.nn.lstm import LSTMCell, LSTMStack
from attn_jax.nn.recurrent import BidirectionalGRU, GRUCell, MaxoutOutput

__all__ = [
    "AdditiveAttention",
    "BidirectionalGRU",
    "DotProductAttention",
    "GRUCell",
    "LSTMCell",
    "LSTMStack",
    "LuongAttention",
    "MaxoutOutput",
    "MultiHeadAttention",
]
