"""Copying source words by attention: the pointer-generator mixture of See, Liu & Manning (2017).

See et al., "Get To The Point: Summarization with Pointer-Generator Networks", ACL 2017, eq. 8-9 (after the copy
mode of Gu et al. 2016, "Incorporating Copying Mechanism in Sequence-to-Sequence Learning", CopyNet). At each target
step the model either generates a word from its fixed vocabulary or copies a source word, and the attention
weights are the copy distribution::

    p_gen = σ(w_hᵀ c_i + w_sᵀ s_i + w_xᵀ x_i + b)                                       (eq. 8)
    P(w)  = p_gen · P_vocab(w) + (1 − p_gen) · Σ_{j: x_j = w} α_ij                     (eq. 9)

over the *extended* vocabulary: the ``V`` words of the target vocabulary followed by the sentence's source words
that are not among them (temporary ids ``V, V+1, …``, one per distinct such word in that sentence). A source word
outside the target vocabulary can only be copied (``P_vocab`` is zero there); a word that is in both gets both
terms.

The mixture is formed in log space, ``log P = logaddexp(log p_gen + log_softmax(z), log(1 − p_gen) + log m)``
with ``m`` the scattered attention mass, so that the generation half keeps log-softmax's range (a word of
probability 1e-50 under ``P_vocab`` keeps its log-probability instead of underflowing to ``log 0``) and ``p_gen``
comes in as its logit (``log σ(g)``, ``log σ(−g)``: no ``log(1 − p)`` cancellation when ``p_gen`` is near 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attn_jax.attention._checks import (
    check_broadcastable,
    check_floating,
    check_min_rank,
    check_padding_mask,
    positive_int,
    shape_str,
)
from attn_jax.typing import Array, Bool, Float, Int

__all__ = ["copy_mass", "pointer_generator_log_probs"]


def _check_ids(ids, live, shape: tuple[int, ...], extended_size: int) -> None:
    """Raise unless ``ids`` are integers and, when concrete, in ``[0, extended_size)`` at the ``live`` positions."""
    if not jnp.issubdtype(jnp.asarray(ids).dtype, jnp.integer):
        raise ValueError(f"src_ext_ids must be integer ids, got dtype {jnp.asarray(ids).dtype}")
    if isinstance(ids, jax.core.Tracer) or isinstance(live, jax.core.Tracer):
        return
    ids = np.broadcast_to(np.asarray(ids), shape)
    if live is not None:
        ids = ids[np.broadcast_to(np.asarray(live), shape)]  # padding may hold any id: it is never read
    if ids.size and (int(np.min(ids)) < 0 or int(np.max(ids)) >= extended_size):
        raise ValueError(
            f"src_ext_ids must lie in [0, extended_size={extended_size}), got ids in "
            f"[{int(np.min(ids))}, {int(np.max(ids))}]"
        )


def copy_mass(
    attention: Float[Array, "... S"],
    src_ext_ids: Int[Array, "... S"],
    extended_size: int,
    src_mask: Bool[Array, "... S"] | None = None,
) -> Float[Array, "... E"]:
    r"""The copy distribution ``m_w = Σ_{j: x_j = w} α_j`` over an extended vocabulary of ``E`` words.

    .. math:: m_{w} = \sum_{j} [x_j = w]\, [\text{mask}_j]\, \alpha_{j}

    (See, Liu & Manning 2017, eq. 9's second term): attention to every occurrence of a word adds up. A scatter-add,
    never a ``[..., S, E]`` one-hot. Positions where ``src_mask`` is False contribute exactly 0 whatever their
    weight or id (``where``: a NaN weight there does not leak, an id there is not read).

    Args:
      attention: ``[..., S]`` weights (any float dtype; summed in float32).
      src_ext_ids: ``[..., S]`` integer ids in ``[0, E)`` of the source words in the extended vocabulary,
        broadcastable to ``attention`` (one row per sentence serves all its target steps).
      extended_size: ``E``, the size of the extended vocabulary.
      src_mask: optional ``[..., S]`` bool broadcastable to ``attention``, True at real source positions.

    Returns:
      float32 ``[..., E]``.

    >>> copy_mass(jnp.array([0.5, 0.25, 0.25]), jnp.array([3, 1, 3]), 4).tolist()
    [0.0, 0.25, 0.0, 0.75]
    """
    check_min_rank("attention", attention, 1)
    check_floating("attention", attention)
    check_min_rank("src_ext_ids", src_ext_ids, 1)
    positive_int("extended_size", extended_size)
    names, shapes = ["attention", "src_ext_ids"], [np.shape(attention), np.shape(src_ext_ids)]
    if src_mask is not None:
        check_padding_mask("src_mask", src_mask)
        names.append("src_mask")
        shapes.append(np.shape(src_mask))
    shape = check_broadcastable(names, shapes)
    if shape != tuple(np.shape(attention)):
        raise ValueError(
            f"src_ext_ids {shape_str(src_ext_ids)} and src_mask must broadcast to attention "
            f"{shape_str(attention)}, not widen it to {shape_str(shape)}"
        )
    _check_ids(src_ext_ids, src_mask, shape, int(extended_size))
    weights = jnp.asarray(attention, jnp.float32)
    ids = jnp.broadcast_to(jnp.asarray(src_ext_ids, jnp.int32), shape)
    if src_mask is not None:
        live = jnp.broadcast_to(jnp.asarray(src_mask), shape)
        weights = jnp.where(live, weights, 0.0)
        ids = jnp.where(live, ids, 0)
    lead, s = shape[:-1], shape[-1]
    n = int(np.prod(lead, dtype=np.int64))
    rows = jnp.arange(n)[:, None]  # [N, 1]
    # [N, E]: every leading axis flattened into one, so a single scatter serves any batch rank
    mass = (
        jnp.zeros((n, int(extended_size)), jnp.float32)
        .at[rows, ids.reshape(n, s)]
        .add(weights.reshape(n, s), mode="drop")
    )
    return mass.reshape(*lead, int(extended_size))


def pointer_generator_log_probs(
    vocab_logits: Float[Array, "... V"],
    attention: Float[Array, "... S"],
    src_ext_ids: Int[Array, "... S"],
    gen_logits: Float[Array, "..."],
    extended_size: int,
    src_mask: Bool[Array, "... S"] | None = None,
) -> Float[Array, "... E"]:
    r"""Log-probabilities of the pointer-generator mixture over the extended vocabulary (See et al. 2017, eq. 9).

    .. math:: \log P(w) = \log\!\Big(p_\mathrm{gen}\, \mathrm{softmax}(z)_w\, [w < V]
        + (1 - p_\mathrm{gen}) \sum_{j: x_j = w} \alpha_j\Big), \qquad p_\mathrm{gen} = \sigma(g)

    Computed as ``logaddexp(log σ(g) + log_softmax(z), log σ(−g) + log m)`` (:func:`copy_mass` for ``m``), in
    float32. Words that can be neither generated nor copied (an extended id that is not in this sentence's
    source, or any word when ``p_gen = 1`` and it is not in the vocabulary) get ``finfo(float32).min``, not
    ``-inf`` (the numerics policy; ``exp`` of it is exactly 0), with zero gradient: gradients never see
    ``log 0``. If the attention sums to 1 over the real source positions the output rows sum to 1 in
    probability space; ``g = +inf`` gives exactly ``log_softmax(z)`` on the first ``V`` entries.

    Args:
      vocab_logits: ``[..., V]`` unnormalised scores of the target vocabulary ``z``.
      attention: ``[..., S]`` attention weights ``α``, the copy distribution over source positions.
      src_ext_ids: ``[..., S]`` int ids of the source words in the extended vocabulary (``< V`` for a word of
        the target vocabulary, ``V + k`` for the sentence's ``k``-th out-of-vocabulary word), broadcastable to
        ``attention``.
      gen_logits: ``[...]`` the logit ``g`` of ``p_gen`` (eq. 8 before its sigmoid).
      extended_size: ``E ≥ V``: ``V`` plus the largest number of out-of-vocabulary source words of a sentence.
      src_mask: optional ``[..., S]`` bool, True at real source positions; the others contribute exactly 0.

    Returns:
      float32 ``[..., E]`` log-probabilities.

    >>> lp = pointer_generator_log_probs(jnp.zeros(2), jnp.array([1.0, 0.0]), jnp.array([2, 0]), jnp.array(0.0), 3)
    >>> jnp.exp(lp).round(4).tolist()
    [0.25, 0.25, 0.5]
    """
    check_min_rank("vocab_logits", vocab_logits, 1)
    check_floating("vocab_logits", vocab_logits)
    check_floating("gen_logits", gen_logits)
    v = np.shape(vocab_logits)[-1]
    if not isinstance(extended_size, int | np.integer) or extended_size < v:
        raise ValueError(f"extended_size must be an int >= the vocabulary size {v}, got {extended_size!r}")
    lead = tuple(np.shape(vocab_logits)[:-1])
    if tuple(np.shape(attention)[:-1]) != lead or tuple(np.shape(gen_logits)) != lead:
        raise ValueError(
            f"vocab_logits {shape_str(vocab_logits)}, attention {shape_str(attention)} and gen_logits "
            f"{shape_str(gen_logits)} must share the leading axes {shape_str(lead)}"
        )
    mass = copy_mass(attention, src_ext_ids, int(extended_size), src_mask)  # [..., E]
    neg = jnp.finfo(jnp.float32).min
    g = jnp.asarray(gen_logits, jnp.float32)[..., None]  # [..., 1]
    vocab_lp = jax.nn.log_softmax(jnp.asarray(vocab_logits, jnp.float32), axis=-1)
    pad = [(0, 0)] * (vocab_lp.ndim - 1) + [(0, int(extended_size) - v)]
    gen = jax.nn.log_sigmoid(g) + jnp.pad(vocab_lp, pad, constant_values=-jnp.inf)  # [..., E]
    copied = mass > 0.0
    # log m only where m > 0; elsewhere -inf with no path back to m (so no 0 · inf in the gradient)
    log_mass = jnp.where(copied, jnp.log(jnp.where(copied, mass, 1.0)), -jnp.inf)
    log_keep = jax.nn.log_sigmoid(-g)  # [..., 1]: log(1 − p_gen)
    copy = log_keep + log_mass  # [..., E]
    top = jnp.maximum(gen, copy)
    possible = top > -jnp.inf
    # a shift only: logaddexp does not depend on it
    top = jax.lax.stop_gradient(jnp.where(possible, top, 0.0))
    # Where m = 0 the term adds exactly 0 but keeps ∂/∂m = (1 − p_gen)/P(w): a word the vocabulary can generate
    # still learns from the attention it did not receive. The exponent is capped so that exp stays finite
    # (inf · 0 would be NaN); the cap changes only gradients larger than e^80.
    zero_mass = jnp.where(copied, 0.0, jnp.exp(jnp.minimum(log_keep - top, 80.0)) * mass)
    total = jnp.exp(gen - top) + jnp.where(copied, jnp.exp(copy - top), 0.0) + zero_mass
    out = top + jnp.log(jnp.where(possible, total, 1.0))
    return jnp.where(possible, jnp.maximum(out, neg), neg)
