"""Pure-JAX attention: scorers, masked softmax, dot-product and multi-head attention, masks, positions.

No Flax in here: parameters are plain pytrees (dicts of arrays), every function is jit-, vmap- and grad-able and
accepts any number of leading batch axes ``[..., T, D]``. The numerics policy is written in ``_softmax.py``.
"""

from attn_jax.attention._softmax import (
    assert_valid_attention_weights,
    attend,
    masked_softmax,
    weighted_context,
)

__all__ = [
    "assert_valid_attention_weights",
    "attend",
    "masked_softmax",
    "weighted_context",
]
