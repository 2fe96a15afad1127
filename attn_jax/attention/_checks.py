"""Boundary checks: public functions validate ranks and sizes here and raise one-line ``ValueError``s."""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

# Why a float or integer mask is refused rather than read as a boolean one (where ``-inf`` and ``-1e9`` are
# "truthy" and would mean "attend"), and what to use instead.
NOT_BOOL_HINT = (
    "a float or integer mask is not reinterpreted (an additive mask's -inf is nonzero, so it would read as "
    "'attend'): convert a "
    "PyTorch mask with attn_jax.from_torch_attn_mask ([..., T, S]: True, -inf or <= -1000 = blocked) or "
    "attn_jax.from_torch_key_padding_mask ([..., S]: likewise for padding), and pass a float bias as bias= "
    "to attn_jax.dot_product_attention"
)


def shape_str(x) -> str:
    """``[3, 5, 7]`` for an array (or a shape tuple)."""
    shape = x if isinstance(x, tuple) else tuple(np.shape(x))
    return "[" + ", ".join(str(d) for d in shape) + "]"


def positive_int(name: str, value) -> int:
    """``value`` as an ``int``; raise unless it is a positive integer.

    A Python ``int`` or a NumPy integer scalar (``np.int64(8)``) passes. A bool, a float (even ``2.0``) or a
    value below 1 is refused with one wording: ``"{name} must be a positive int, got {value!r}"``.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def check_min_rank(name: str, x, rank: int) -> None:
    """Raise unless ``x`` has at least ``rank`` axes."""
    if np.ndim(x) < rank:
        raise ValueError(f"{name} must have at least {rank} axes, got shape {shape_str(x)}")


def check_rank(name: str, x, rank: int) -> None:
    """Raise unless ``x`` has exactly ``rank`` axes."""
    if np.ndim(x) != rank:
        raise ValueError(f"{name} must have exactly {rank} axes, got shape {shape_str(x)}")


def check_size(name: str, x, axis: int, size: int, what: str) -> None:
    """Raise unless ``x.shape[axis] == size``; ``what`` names where ``size`` comes from."""
    if np.shape(x)[axis] != size:
        raise ValueError(
            f"{name} axis {axis} has size {np.shape(x)[axis]} but {what} is {size} (shape {shape_str(x)})"
        )


def check_broadcastable(names: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """Broadcast shapes or raise naming every operand; returns the broadcast shape."""
    try:
        # jnp's broadcast also takes symbolic dimensions (a batch exported with jax.export).
        return tuple(jnp.broadcast_shapes(*shapes))
    except ValueError:
        pairs = ", ".join(f"{n} {shape_str(tuple(s))}" for n, s in zip(names, shapes, strict=True))
        raise ValueError(f"shapes do not broadcast: {pairs}") from None


def check_mask(mask, logits_shape: tuple[int, ...], what: str = "attention logits [..., T, S]") -> None:
    """Raise unless ``mask`` is boolean and broadcasts to ``logits_shape``."""
    if mask is None:
        return
    if jnp.asarray(mask).dtype != jnp.bool_:
        raise ValueError(
            f"mask must be boolean (True = may attend), got dtype {jnp.asarray(mask).dtype}; {NOT_BOOL_HINT}"
        )
    try:
        out = tuple(jnp.broadcast_shapes(np.shape(mask), tuple(logits_shape)))
    except ValueError:
        out = None
    if out != tuple(logits_shape):
        raise ValueError(
            f"mask of shape {shape_str(np.shape(mask))} does not broadcast to the {what} of shape "
            f"{shape_str(tuple(logits_shape))}"
        )


def check_padding_mask(name: str, mask) -> None:
    """Raise unless a ``[..., T]`` padding mask (True = real token) is boolean: a float one is not reinterpreted."""
    dtype = jnp.asarray(mask).dtype
    if dtype != jnp.bool_:
        raise ValueError(
            f"{name} must be boolean (True = real token), got dtype {dtype}; a float or integer mask is not "
            f"reinterpreted: pass `{name} == 1` for a 1/0 mask, attn_jax.make_padding_mask(lengths, T), or "
            "attn_jax.from_torch_key_padding_mask(kpm)[..., 0, :] for a PyTorch key_padding_mask"
        )


def check_floating(name: str, x) -> None:
    """Raise unless ``x`` has a floating dtype."""
    if not jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating):
        raise ValueError(f"{name} must be floating point, got dtype {jnp.asarray(x).dtype}")


def position_offsets(query_positions, key_positions) -> jnp.ndarray:
    """``key - query`` for every pair, ``[..., T, S]``, from integer positions ``[..., T]`` and ``[..., S]``
    (checked: rank >= 1, an integer dtype); the distances ALiBi and relative positions are built from."""
    for name, x in (("query_positions", query_positions), ("key_positions", key_positions)):
        check_min_rank(name, x, 1)
        if not jnp.issubdtype(jnp.asarray(x).dtype, jnp.integer):
            raise ValueError(f"{name} must be integer positions, got dtype {jnp.asarray(x).dtype}")
    return jnp.asarray(key_positions)[..., None, :] - jnp.asarray(query_positions)[..., :, None]
