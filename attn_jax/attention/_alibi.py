"""ALiBi (Press, Smith & Lewis 2022, "Train Short, Test Long"): a fixed, head-specific linear penalty on distance.

No position is added to the embeddings; each head ``h`` adds ``-m_h·|i - j|`` to its attention logits (after the
``1/√K`` scaling), so attention decays with distance at a rate that differs per head. The paper defines it for
causal self-attention (``j ≤ i``, where ``|i - j| = i - j``); for a bidirectional encoder this module uses the
symmetric ``|i - j|``, the usual extension (the penalty is the same function of distance on both sides).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from attn_jax.attention._checks import position_offsets, positive_int, shape_str
from attn_jax.typing import Array, Float, Int


def alibi_slopes(num_heads: int) -> np.ndarray:
    r"""The ALiBi head slopes ``m_h``: a geometric sequence, float64 ``[H]``.

    .. math:: m_h = 2^{-8h/H}, \quad h = 1..H \qquad (H \text{ a power of 2})

    Press et al. 2022, §3: the ratio and the first term are both ``2^{-8/H}``. For other ``H``, as in the
    authors' code (github.com/ofirpress/attention_with_linear_biases) and fairseq: with ``P`` the largest power
    of 2 below ``H``, the ``P`` slopes of ``P`` heads, then the first ``H - P`` odd-indexed terms of the
    ``2P``-head sequence, ``2^{-8(2j+1)/(2P)}``, which interleave between them.

    Args:
      num_heads: ``H``, a positive int.

    Returns:
      NumPy float64 ``[H]`` (constants: the models cast them to float32 when they form the bias).

    >>> alibi_slopes(4).tolist()
    [0.25, 0.0625, 0.015625, 0.00390625]
    """
    positive_int("num_heads", num_heads)
    p = 2 ** int(math.floor(math.log2(num_heads)))
    first = [2.0 ** (-8.0 * (h + 1) / p) for h in range(p)]
    rest = [2.0 ** (-8.0 * (2 * j + 1) / (2 * p)) for j in range(num_heads - p)]
    return np.asarray(first + rest, np.float64)


def alibi_bias(
    slopes: Float[Array, " H"],
    query_positions: Int[Array, "... T"],
    key_positions: Int[Array, "... S"],
) -> Float[Array, "... H T S"]:
    r"""The ALiBi logit bias ``-m_h·|j - i|`` for every head, query position ``i`` and key position ``j``.

    .. math:: b_{h,i,j} = -m_h\,\lvert j - i \rvert

    Press et al. 2022, Eq. (§3): added to the scaled logits ``q_i k_jᵀ/√K`` (pass it as
    ``dot_product_attention(..., bias=...)``). Positions are integers, so the same ``(i, j)`` gives the
    bit-identical bias whether computed for a whole sequence (teacher forcing) or for one cached decoding step.

    Args:
      slopes: ``[H]`` (:func:`alibi_slopes`).
      query_positions: integer ``[..., T]``.
      key_positions: integer ``[..., S]``; leading axes broadcast with the query's.

    Returns:
      float32 ``[..., H, T, S]``.

    >>> alibi_bias(alibi_slopes(2), jnp.arange(3), jnp.arange(3))[0]
    Array([[-0.    , -0.0625, -0.125 ],
           [-0.0625, -0.    , -0.0625],
           [-0.125 , -0.0625, -0.    ]], dtype=float32)
    """
    slopes = jnp.asarray(slopes, jnp.float32)
    if slopes.ndim != 1:
        raise ValueError(f"slopes must be [H], got shape {shape_str(slopes)}")
    distance = jnp.abs(position_offsets(query_positions, key_positions)).astype(jnp.float32)  # [..., T, S]
    return -slopes[:, None, None] * distance[..., None, :, :]
