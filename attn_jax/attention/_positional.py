"""Positional information: sinusoidal encodings, learned position tables and rotary embeddings (RoPE).

Conventions chosen here (stated once, relied on by the models):

* :func:`sinusoidal_positions` uses Vaswani et al.'s exact *interleaved* form — ``sin`` at even features,
  ``cos`` at odd ones — not the concatenated ``[sin…, cos…]`` layout of Tensor2Tensor/Flax examples (same
  information, a fixed permutation of features); ``layout="halves"`` gives that concatenated layout, which
  Marian (OPUS-MT) checkpoints use with the paper's frequencies.
* :func:`rotary_embedding` rotates *interleaved* pairs ``(2i, 2i+1)`` by default, as in the RoFormer paper;
  ``interleaved=False`` rotates the half-split pairs ``(i, i + K/2)`` used by GPT-NeoX, Llama and Gemma
  checkpoints.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attn_jax.attention._checks import check_floating, check_min_rank, positive_int, shape_str
from attn_jax.typing import Array, Float, Int, PRNGKeyArray

SINUSOIDAL_LAYOUTS: tuple[str, ...] = ("interleaved", "halves")


def _check_even(name: str, n: int) -> None:
    """Raise unless ``n`` is a positive even int (features are rotated/encoded in pairs)."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n <= 0 or n % 2:
        raise ValueError(f"{name} must be a positive even int (features come in sin/cos pairs), got {n!r}")


def _is_static_int(x) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def sinusoidal_positions(
    positions: int | Int[Array, "... L"],
    features: int,
    *,
    max_timescale: float = 10000.0,
    layout: str = "interleaved",
    dtype=jnp.float32,
) -> Float[Array, "... L D"]:
    r"""Fixed sinusoidal position encodings, interleaved exactly as in Vaswani et al. 2017, §3.5.

    .. math:: PE_{(pos, 2i)} = \sin\!\big(pos / 10000^{2i/D}\big), \qquad
        PE_{(pos, 2i+1)} = \cos\!\big(pos / 10000^{2i/D}\big)

    For every shift ``k`` there is a fixed rotation (one 2×2 block per frequency) mapping ``PE(pos)`` to
    ``PE(pos + k)`` — the property the paper gives for choosing sinusoids. ``layout="halves"`` puts the same
    values as ``[sin(pos·ω_0..ω_{D/2-1}) | cos(pos·ω_0..ω_{D/2-1})]``: the layout of Marian (OPUS-MT) checkpoints.

    Args:
      positions: an int ``L`` (positions ``0..L-1``; computed in float64 NumPy, so exact even for long ``L``)
        or integer positions ``[..., L]`` (computed in float32; may be traced).
      features: ``D``, must be even.
      max_timescale: the ``10000`` above.
      layout: ``"interleaved"`` (the paper's) or ``"halves"`` (all sines, then all cosines).
      dtype: output dtype.

    Returns:
      ``[L, D]`` for an int, else ``[..., L, D]``.

    >>> sinusoidal_positions(2, 4).round(3)  # pos 1: sin 1, cos 1, sin 0.01, cos 0.01
    Array([[0.   , 1.   , 0.   , 1.   ],
           [0.841, 0.54 , 0.01 , 1.   ]], dtype=float32)
    """
    _check_even("features", features)
    if layout not in SINUSOIDAL_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(SINUSOIDAL_LAYOUTS)}, got {layout!r}")
    axis = -1 if layout == "interleaved" else -2  # stack sin/cos per frequency, or sines then cosines
    if _is_static_int(positions):
        if positions < 0:
            raise ValueError(f"positions must be a non-negative length, got {positions}")
        inv_freq = float(max_timescale) ** (-np.arange(0, features, 2, dtype=np.float64) / features)
        angles = np.arange(positions, dtype=np.float64)[:, None] * inv_freq  # [L, D/2]
        pe = np.stack([np.sin(angles), np.cos(angles)], axis=axis).reshape(positions, features)
        return jnp.asarray(pe, dtype)
    check_min_rank("positions", positions, 1)
    positions = jnp.asarray(positions)
    inv_freq = jnp.asarray(float(max_timescale) ** (-np.arange(0, features, 2) / features), jnp.float32)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [..., L, D/2]
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=axis)  # [..., L, D/2, 2] or [..., L, 2, D/2]
    return pe.reshape(*positions.shape, features).astype(dtype)


def init_learned_positions(
    key: PRNGKeyArray, max_length: int, features: int, *, dtype=jnp.float32
) -> Float[Array, "L D"]:
    r"""A learned position table ``P ∈ R^{L×D}``, initialised ``N(0, 0.02²)``.

    .. math:: P_{l,d} \sim \mathcal{N}(0, 0.02^2)

    Gehring et al. 2017 (ConvS2S); Vaswani et al. 2017, §3.5 found it on par with sinusoids. ``0.02`` is the
    BERT/GPT-2 and Flax WMT-example scale: small next to unit-scale token embeddings.

    Args:
      key: PRNG key.
      max_length: ``L``, the longest sequence the table serves.
      features: ``D``.
      dtype: parameter dtype.

    Returns:
      ``[L, D]``.

    >>> init_learned_positions(jax.random.key(0), 16, 8).shape
    (16, 8)
    """
    for name, n in [("max_length", max_length), ("features", features)]:
        positive_int(name, n)
    return 0.02 * jax.random.normal(key, (max_length, features), dtype)


def learned_positions(
    table: Float[Array, "L D"], positions: int | Int[Array, "... L"]
) -> Float[Array, "... L D"]:
    r"""Look up learned position vectors: ``out[..., l, :] = table[positions[..., l], :]``.

    .. math:: \mathrm{out}_{l} = P_{pos_l}

    Args:
      table: ``[L_max, D]`` from :func:`init_learned_positions`.
      positions: an int ``L`` (the first ``L`` rows; ``ValueError`` if ``L > L_max``) or integer positions
        ``[..., L]``. Concrete arrays are range-checked (``ValueError``); under ``jit`` an out-of-range
        position yields a NaN row instead of silently reusing another row.

    Returns:
      ``[L, D]`` for an int, else ``[..., L, D]``, in the table's dtype.

    >>> learned_positions(jnp.arange(6.0).reshape(3, 2), jnp.array([2, 0]))
    Array([[4., 5.],
           [0., 1.]], dtype=float32)
    """
    if np.ndim(table) != 2:
        raise ValueError(f"table must be [L, D], got shape {shape_str(table)}")
    rows = np.shape(table)[0]
    if _is_static_int(positions):
        if not 0 <= positions <= rows:
            raise ValueError(
                f"asked for {positions} positions but the table {shape_str(table)} has {rows} rows"
            )
        return jnp.asarray(table)[:positions]
    check_min_rank("positions", positions, 1)
    if not isinstance(positions, jax.core.Tracer):
        p = np.asarray(positions)
        if p.size and (p.min() < 0 or p.max() >= rows):
            raise ValueError(
                f"positions range over [{p.min()}, {p.max()}] but the table {shape_str(table)} "
                f"has {rows} rows"
            )
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"positions must be integers, got dtype {positions.dtype}")
    # mode="fill" makes too-large indices NaN; negative ones would wrap around, so blank them too.
    out = jnp.take(jnp.asarray(table), positions, axis=0, mode="fill", fill_value=jnp.nan)
    return jnp.where((positions >= 0)[..., None], out, jnp.nan)


def rotary_embedding(
    x: Float[Array, "... L K"],
    positions: Int[Array, "... L"] | None = None,
    *,
    base: float = 10000.0,
    interleaved: bool = True,
) -> Float[Array, "... L K"]:
    r"""Rotary position embedding (RoPE): rotate each feature pair of ``x`` by an angle set by its position.

    .. math:: \begin{pmatrix} y_{a} \\ y_{b} \end{pmatrix} =
        \begin{pmatrix} \cos m\theta_i & -\sin m\theta_i \\ \sin m\theta_i & \cos m\theta_i \end{pmatrix}
        \begin{pmatrix} x_{a} \\ x_{b} \end{pmatrix}, \qquad \theta_i = \mathrm{base}^{-2i/K}

    Su et al. 2021, "RoFormer", eq. 34. Apply it to queries and keys (not values): then
    ``⟨rope(q, m), rope(k, n)⟩`` depends on ``m`` and ``n`` only through ``m - n``, and norms are preserved.

    Pairing ``(a, b)`` for frequency ``i``: ``interleaved=True`` (default, the RoFormer paper) pairs features
    ``(2i, 2i+1)``; ``interleaved=False`` pairs ``(i, i + K/2)`` (GPT-NeoX / Llama / Gemma "rotate_half").
    Both are valid RoPE; weights trained with one need the other's features permuted.

    Args:
      x: ``[..., L, K]``, e.g. queries ``[B, H, T, K]``; ``K`` must be even.
      positions: integer positions broadcastable to ``x.shape[:-1]`` (for ``[B, H, T, K]`` pass
        ``[B, 1, T]``); ``None`` means ``0..L-1``. Offsets for cached decoding go here.
      base: the ``10000`` in ``θ_i``.
      interleaved: pairing convention (see above).

    Returns:
      the rotated ``x``, same shape and dtype (the rotation is computed in float32).

    >>> rotary_embedding(jnp.array([[1.0, 0.0], [1.0, 0.0]])).round(3)  # position 1 rotates by 1 radian
    Array([[1.   , 0.   ],
           [0.54 , 0.841]], dtype=float32)
    """
    check_min_rank("x", x, 2)
    check_floating("x", x)
    *_, length, width = np.shape(x)
    _check_even("x's last axis K", width)
    if positions is None:
        positions = jnp.arange(length)
    else:
        if np.ndim(positions) < 1:
            raise ValueError(f"positions must have a length axis [..., L], got shape {shape_str(positions)}")
        try:
            full = tuple(np.broadcast_shapes(np.shape(positions), np.shape(x)[:-1]))
        except ValueError:
            full = None
        if full != tuple(np.shape(x)[:-1]):
            raise ValueError(
                f"positions {shape_str(positions)} must broadcast to x's leading axes "
                f"{shape_str(np.shape(x)[:-1])}"
            )
    inv_freq = jnp.asarray(float(base) ** (-np.arange(0, width, 2) / width), jnp.float32)
    angles = jnp.asarray(positions).astype(jnp.float32)[..., None] * inv_freq  # [..., L, K/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    xf = jnp.asarray(x, jnp.float32)
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
        y = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1)  # [..., L, K/2, 2]
        y = y.reshape(np.shape(x))
    else:
        a, b = xf[..., : width // 2], xf[..., width // 2 :]
        y = jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    return y.astype(jnp.asarray(x).dtype)
