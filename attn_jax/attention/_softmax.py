"""Masked softmax over the source axis and the weighted context: the numerics every scorer shares.

Numerics policy (applies to every function in ``attn_jax.attention``):

* logits are computed and normalised in float32, whatever the input dtype (bf16/fp16 logits overflow and lose
  the small differences that decide an alignment);
* masked logits are filled with ``jnp.finfo(float32).min`` rather than ``-inf`` (``-inf - -inf`` is NaN in the
  max-subtraction and in gradients);
* after the softmax, masked positions are set to exactly 0, so that a row whose keys are *all* masked yields
  zero weights and a zero context — not NaN (PyTorch's old behaviour) and not a uniform average over padding
  (what a large-negative fill alone gives);
* the context is accumulated in float32 and returned in the value's dtype;
* query, key and value rows that no pair reads (padding) are zeroed before any product (``_padding.py``): a
  masked key's weight is 0, but ``0 · NaN`` is NaN, so NaN or ±inf stored in padding would otherwise reach the
  context and every gradient. A ``-inf`` bias entry is a masked entry.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attn_jax.attention._checks import check_mask
from attn_jax.attention._padding import zero_masked_keys
from attn_jax.typing import Array, Bool, Float

_FILL = jnp.finfo(jnp.float32).min


def masked_softmax(
    logits: Float[Array, "... T S"], mask: Bool[Array, "... T S"] | None = None, axis: int = -1
) -> Float[Array, "... T S"]:
    r"""Softmax over ``axis`` (the source/key axis) with a boolean mask; always returns float32.

    .. math:: \alpha_{ij} = \frac{m_{ij} \exp(e_{ij})}{\sum_k m_{ik} \exp(e_{ik})},
        \qquad \alpha_{i\cdot} = 0 \text{ if } \sum_k m_{ik} = 0

    Args:
      logits: energies ``[..., T, S]``; any float dtype (computed in float32).
      mask: boolean, broadcastable to ``logits``; True means "may attend". ``None`` attends everywhere. A
        float or integer mask is refused (``ValueError``), never read as boolean: convert additive or
        PyTorch masks with :func:`attn_jax.from_torch_attn_mask`.
      axis: the axis normalised over. Attention normalises over the *source* axis (the last one); normalising
        over the target axis is the classic bug this library's tests are written to catch.

    Returns:
      float32 weights of ``logits``' shape: each unmasked row sums to 1 over ``axis``, masked entries are exactly
      0, fully masked rows are all 0, and gradients are finite everywhere.

    >>> import jax.numpy as jnp
    >>> e = jnp.array([[2.0, 0.5, -1.0]])  # the seed's worked example
    >>> [round(float(w), 3) for w in masked_softmax(e)[0]]
    [0.786, 0.175, 0.039]
    >>> [round(float(w), 3) for w in masked_softmax(e, jnp.array([[True, True, False]]))[0]]
    [0.818, 0.182, 0.0]
    """
    logits = jnp.asarray(logits, jnp.float32)
    if mask is None:
        return jax.nn.softmax(logits, axis=axis)
    check_mask(mask, logits.shape, what="logits")
    mask = jnp.broadcast_to(mask, logits.shape)
    logits = jnp.where(mask, logits, _FILL)
    # Masked entries are already ~exp(min - max) = 0 in a row with any valid key; the where makes that exact and
    # zeroes rows where every key is masked (their softmax would be uniform). Its gradient w.r.t. masked logits is 0.
    return jnp.where(mask, jax.nn.softmax(logits, axis=axis), 0.0)


def weighted_context(
    weights: Float[Array, "... T S"], values: Float[Array, "... S Dv"]
) -> Float[Array, "... T Dv"]:
    r"""Context ``c_i = Σ_j α_ij v_j``, accumulated in float32 and returned in ``values``' dtype."""
    ctx = jnp.einsum("...ts,...sd->...td", weights.astype(jnp.float32), values.astype(jnp.float32))
    return ctx.astype(values.dtype)


def attend(
    logits: Float[Array, "... T S"],
    values: Float[Array, "... S Dv"],
    mask: Bool[Array, "... T S"] | None = None,
) -> tuple[Float[Array, "... T Dv"], Float[Array, "... T S"]]:
    """Normalise energies over the source axis and mix the values: ``(context, weights)``.

    The last step shared by every scorer (additive, Luong, dot-product): ``α = masked_softmax(e)``,
    ``c = α v``. Weights are float32; the context has ``values``' dtype. ``mask`` is boolean (True = may
    attend); a float or integer one is refused with a ``ValueError`` (see :func:`masked_softmax`). Value rows
    that no query may attend are zeroed first, so NaN or ±inf in padded values changes nothing (the scorer
    that made ``logits`` must get clean keys: :func:`zero_masked_keys`).
    """
    weights = masked_softmax(logits, mask, axis=-1)
    # a value row no query may attend (padding) gets weight 0, but 0 · NaN is NaN: zero it first
    return weighted_context(weights, zero_masked_keys(values, mask)), weights


def assert_valid_attention_weights(
    weights: Float[Array, "... T S"], mask: Bool[Array, "... T S"] | None = None, *, atol: float = 1e-5
) -> None:
    """Raise ``AssertionError`` unless ``weights`` are a proper alignment over the *source* axis.

    The two-line check that catches the most common attention bug — a softmax over the target axis, which
    trains, produces fluent output and is not attention: every row with at least one valid key sums to 1 over
    the last (source) axis within ``atol``, every masked key has weight exactly 0, and rows whose keys are all
    masked are all 0. Runs eagerly on concrete arrays (call it in tests and on validation batches, not under jit).
    A non-boolean ``mask`` is a ``ValueError``, as everywhere in the library.
    """
    import numpy as np

    check_mask(mask, np.shape(weights), what="weights")
    w = np.asarray(weights, np.float64)
    m = np.ones(w.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), w.shape)
    if np.any(w[~m] != 0.0):
        raise AssertionError(
            f"masked keys received weight up to {np.abs(w[~m]).max():.3g}; they must get exactly 0"
        )
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        raise AssertionError("attention weights must be finite and non-negative")
    sums = w.sum(-1)
    has_key = m.any(-1)
    err = np.abs(sums - np.where(has_key, 1.0, 0.0))
    if err.size and err.max() > atol:
        where = np.unravel_index(int(np.argmax(err)), err.shape)
        raise AssertionError(
            f"attention weights do not sum to 1 over the source (last) axis: row {where} sums to "
            f"{sums[where]:.6g} (normalised over the wrong axis?)"
        )
