"""Boolean attention masks: padding, causal, sliding-window, packed segments, their combination, conversion
from PyTorch's conventions.

Convention (the whole library): a mask is boolean, ``True`` means "this query may attend this key", and it
broadcasts to the logits ``[..., T, S]`` (or ``[..., H, T, S]`` with heads). PyTorch's
``nn.MultiheadAttention`` uses the opposite convention for its boolean masks; convert with
:func:`from_torch_key_padding_mask` and :func:`from_torch_attn_mask`, never by hand.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attn_jax.attention._checks import NOT_BOOL_HINT, check_broadcastable, check_min_rank, shape_str
from attn_jax.typing import Array, ArrayLike, Bool, Float, Int


def _check_bool(name: str, x) -> None:
    """Raise unless ``x`` is boolean."""
    dtype = jnp.asarray(x).dtype
    if dtype != jnp.bool_:
        raise ValueError(
            f"{name} must be boolean (True = may attend), got dtype {dtype} (shape {shape_str(x)}); "
            + NOT_BOOL_HINT
        )


def _check_length(name: str, n) -> None:
    """Raise unless ``n`` is a static non-negative Python/NumPy integer."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"{name} must be a non-negative int, got {n!r}")


def make_padding_mask(lengths: Int[ArrayLike, "..."], max_len: int) -> Bool[Array, "... L"]:
    r"""Validity mask of padded sequences from their lengths: ``True`` where ``position < length``.

    .. math:: m_{b,j} = [\, j < \ell_b \,], \qquad j = 0, \dots, L - 1

    Args:
      lengths: integer lengths, any shape ``[...]`` (usually ``[B]``); may be traced.
      max_len: ``L``, the padded length (static).

    Returns:
      boolean ``[..., L]``; feed it to :func:`make_attention_mask` or :func:`key_padding_mask`.

    >>> make_padding_mask(jnp.array([1, 3]), 4)
    Array([[ True, False, False, False],
           [ True,  True,  True, False]], dtype=bool)
    """
    _check_length("max_len", max_len)
    lengths = jnp.asarray(lengths)
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"lengths must be integers, got dtype {lengths.dtype} (shape {shape_str(lengths)})")
    return jnp.arange(max_len) < lengths[..., None]


def padding_mask_from_tokens(tokens: Int[ArrayLike, "... L"], pad_id: int = 0) -> Bool[Array, "... L"]:
    r"""Validity mask from token ids: ``True`` where ``token != pad_id``.

    .. math:: m_{b,j} = [\, x_{b,j} \neq \mathrm{pad} \,]

    Args:
      tokens: token ids ``[..., L]``.
      pad_id: the padding id (0 in this project's vocabularies).

    Returns:
      boolean ``[..., L]``.

    >>> padding_mask_from_tokens(jnp.array([[5, 7, 0, 0]]))
    Array([[ True,  True, False, False]], dtype=bool)
    """
    check_min_rank("tokens", tokens, 1)
    return jnp.asarray(tokens) != pad_id


def make_attention_mask(
    query_valid: Bool[ArrayLike, "... T"], key_valid: Bool[ArrayLike, "... S"]
) -> Bool[Array, "... T S"]:
    r"""Pairwise mask from per-position validity: query ``i`` may attend key ``j`` iff both are valid.

    .. math:: m_{ij} = q_i \wedge k_j

    Args:
      query_valid: boolean ``[..., T]``.
      key_valid: boolean ``[..., S]``; leading axes broadcast against ``query_valid``'s.

    Returns:
      boolean ``[..., T, S]``. Padded *queries* get all-False rows, whose attention output is exactly zero.

    >>> make_attention_mask(jnp.array([True, False]), jnp.array([True, True, False])).astype(int)
    Array([[1, 1, 0],
           [0, 0, 0]], dtype=int32)
    """
    check_min_rank("query_valid", query_valid, 1)
    check_min_rank("key_valid", key_valid, 1)
    _check_bool("query_valid", query_valid)
    _check_bool("key_valid", key_valid)
    check_broadcastable(
        ["query_valid batch axes", "key_valid batch axes"],
        [np.shape(query_valid)[:-1], np.shape(key_valid)[:-1]],
    )
    return jnp.logical_and(jnp.asarray(query_valid)[..., :, None], jnp.asarray(key_valid)[..., None, :])


def key_padding_mask(key_valid: Bool[ArrayLike, "... S"]) -> Bool[Array, "... 1 S"]:
    r"""Mask that hides padded keys from every query (cross attention): ``[..., S] -> [..., 1, S]``.

    .. math:: m_{ij} = k_j \quad \text{for every query } i

    Unlike :func:`make_attention_mask` it leaves padded *queries* unmasked: their rows are well-defined
    attention over the valid keys, and the loss masks them later.

    Args:
      key_valid: boolean ``[..., S]``, True at real (non-padding) keys.

    Returns:
      boolean ``[..., 1, S]``, broadcasting over the query axis.

    >>> key_padding_mask(jnp.array([[True, False]])).shape
    (1, 1, 2)
    """
    check_min_rank("key_valid", key_valid, 1)
    _check_bool("key_valid", key_valid)
    return jnp.asarray(key_valid)[..., None, :]


def make_causal_mask(
    query_length: int, key_length: int | None = None, *, offset: int | Int[Array, ""] = 0
) -> Bool[Array, "T S"]:
    r"""Causal (autoregressive) mask: query ``i`` may attend key ``j`` iff ``j <= i + offset``.

    .. math:: m_{ij} = [\, j \le i + \mathrm{offset} \,]

    ``offset`` is the number of positions before the first query, as when decoding with a cache of earlier
    keys: query ``i`` sits at absolute position ``offset + i`` and sees every key up to and including itself.

    Args:
      query_length: ``T`` (static).
      key_length: ``S`` (static); defaults to ``offset + query_length`` (every key a query can see), which
        needs a static ``offset``.
      offset: positions before the first query; a Python int or a scalar integer array (may be traced, e.g.
        the decoding step inside ``jit``, when ``key_length`` is given).

    Returns:
      boolean ``[T, S]``; broadcasts against ``[..., T, S]`` logits.

    >>> make_causal_mask(3).astype(int)
    Array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]], dtype=int32)
    >>> make_causal_mask(1, 4, offset=2).astype(int)
    Array([[1, 1, 1, 0]], dtype=int32)
    """
    _check_length("query_length", query_length)
    if key_length is None:
        if not isinstance(offset, int | np.integer) or isinstance(offset, bool):
            raise ValueError(
                f"key_length is required when offset is not a static int (got offset {offset!r})"
            )
        key_length = int(offset) + query_length
    _check_length("key_length", key_length)
    if np.ndim(offset) != 0:
        raise ValueError(f"offset must be a scalar, got shape {shape_str(offset)}")
    # [1, S] <= [T, 1] -> [T, S]
    return jnp.arange(key_length)[None, :] <= jnp.arange(query_length)[:, None] + offset


def sliding_window(window) -> tuple[int, int] | None:
    """``local_window`` normalised to ``(left, right)``: an int ``w`` is ``(w, w)``; ``None`` stays ``None``."""
    if window is None:
        return None
    pair = (
        (window, window) if isinstance(window, int | np.integer) and not isinstance(window, bool) else window
    )
    if (
        not isinstance(pair, tuple | list)
        or len(pair) != 2
        or any(isinstance(w, bool) or not isinstance(w, int | np.integer) or w < 0 for w in pair)
    ):
        raise ValueError(
            "local_window must be a non-negative int or a pair (left, right) of non-negative ints "
            f"(static: it shapes the computation), got {window!r}"
        )
    return int(pair[0]), int(pair[1])


def sliding_window_mask(
    query_length: int,
    key_length: int,
    window: int | tuple[int, int],
    *,
    offset: int | Int[Array, ""] = 0,
) -> Bool[Array, "T S"]:
    r"""Sliding-window (local) mask: query ``i`` may attend key ``j`` iff ``i - left <= j <= i + right``.

    .. math:: m_{ij} = [\, i + o - \ell \le j \le i + o + r \,], \qquad (\ell, r) = \mathrm{window},\;
        o = \mathrm{offset}

    The pattern of ``jax.nn.dot_product_attention(local_window_size=(left, right))`` (Beltagy et al. 2020,
    "Longformer"; Child et al. 2019): positions are indices along ``T`` and ``S``, top-left aligned like
    :func:`make_causal_mask`, and an int ``w`` means ``(w, w)``. AND it with :func:`make_causal_mask` for a
    causal window (``left`` keys back and the query itself); ``dot_product_attention(local_window=...)``
    applies it without forming this array on its ``"chunked"`` path.

    Args:
      query_length: ``T`` (static).
      key_length: ``S`` (static).
      window: ``(left, right)`` non-negative ints (static), or one int for ``(w, w)``.
      offset: positions before the first query (a decoding step with a cache), as for
        :func:`make_causal_mask`; may be traced.

    Returns:
      boolean ``[T, S]``; broadcasts against ``[..., T, S]`` logits.

    >>> sliding_window_mask(4, 5, (1, 0)).astype(int)
    Array([[1, 0, 0, 0, 0],
           [1, 1, 0, 0, 0],
           [0, 1, 1, 0, 0],
           [0, 0, 1, 1, 0]], dtype=int32)
    >>> sliding_window_mask(1, 6, 1, offset=3).astype(int)
    Array([[0, 0, 1, 1, 1, 0]], dtype=int32)
    """
    _check_length("query_length", query_length)
    _check_length("key_length", key_length)
    left, right = sliding_window(window)
    if np.ndim(offset) != 0:
        raise ValueError(f"offset must be a scalar, got shape {shape_str(offset)}")
    rows = jnp.arange(query_length)[:, None] + offset  # [T, 1]
    cols = jnp.arange(key_length)[None, :]  # [1, S]
    return jnp.logical_and(cols >= rows - left, cols <= rows + right)


def combine_masks(*masks: Bool[ArrayLike, "..."] | None) -> Bool[Array, "..."] | None:
    r"""Logical AND of masks with broadcasting; ``None`` entries are skipped, and all-``None`` gives ``None``.

    .. math:: m = m^{(1)} \wedge m^{(2)} \wedge \cdots

    Args:
      *masks: boolean arrays (True = may attend) whose shapes broadcast together, or ``None``.

    Returns:
      the broadcast AND, or ``None`` when every mask is ``None``.

    Raises:
      ValueError: a mask is not boolean, or the shapes do not broadcast (the message lists them all).

    >>> combine_masks(make_causal_mask(2), None, jnp.array([[True, False]])).astype(int)
    Array([[1, 0],
           [1, 0]], dtype=int32)
    """
    present = [(i, m) for i, m in enumerate(masks) if m is not None]
    if not present:
        return None
    for i, m in present:
        _check_bool(f"mask {i}", m)
    check_broadcastable([f"mask {i}" for i, _ in present], [np.shape(m) for _, m in present])
    return functools.reduce(jnp.logical_and, [jnp.asarray(m) for _, m in present])


def _check_segments(name: str, x) -> None:
    """Raise unless ``x`` holds integer segment ids of rank >= 1."""
    check_min_rank(name, x, 1)
    dtype = jnp.asarray(x).dtype
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(
            f"{name} must be integer segment ids (0 = padding), got dtype {dtype} (shape {shape_str(x)})"
        )


def make_segment_mask(
    query_segments: Int[ArrayLike, "... T"], key_segments: Int[ArrayLike, "... S"]
) -> Bool[Array, "... T S"]:
    r"""Mask of packed sequences: query ``i`` may attend key ``j`` iff both lie in the same (non-padding) segment.

    .. math:: m_{ij} = [\, q_i = k_j \,] \wedge [\, q_i \neq 0 \,]

    Several short sequences packed into one row (the Flax ``wmt``/``lm1b`` examples) carry segment ids
    ``1, 2, ...``, one per sequence, and ``0`` on padding: no attention crosses a sequence boundary, and padding
    neither attends nor is attended (its rows are all-False, so its attention output is exactly zero). It equals
    ``flax.linen.make_attention_mask(q, k, jnp.equal)`` AND-ed with ``make_attention_mask(q > 0, k > 0)``,
    without Flax's head axis. AND it with :func:`make_causal_mask` for a packed decoder's self-attention;
    cross-attention takes the target's ids as queries and the source's as keys (target pair ``n`` attends
    source pair ``n``).

    Args:
      query_segments: integer ``[..., T]``, 0 on padding; may be traced.
      key_segments: integer ``[..., S]``; leading axes broadcast against ``query_segments``'s.

    Returns:
      boolean ``[..., T, S]`` (add the head axis with ``[:, None]`` for ``[B, 1, T, S]``).

    >>> make_segment_mask(jnp.array([1, 1, 2, 0]), jnp.array([1, 2, 2, 0])).astype(int)
    Array([[1, 0, 0, 0],
           [1, 0, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 0, 0]], dtype=int32)
    """
    _check_segments("query_segments", query_segments)
    _check_segments("key_segments", key_segments)
    check_broadcastable(
        ["query_segments batch axes", "key_segments batch axes"],
        [np.shape(query_segments)[:-1], np.shape(key_segments)[:-1]],
    )
    q = jnp.asarray(query_segments)[..., :, None]  # [..., T, 1]
    k = jnp.asarray(key_segments)[..., None, :]  # [..., 1, S]
    return jnp.logical_and(q == k, q != 0)


def segment_positions(segments: Int[ArrayLike, "... L"]) -> Int[Array, "... L"]:
    r"""Positions that restart at 0 in every segment of a packed row; 0 on padding (segment 0).

    .. math:: p_j = j - \max\{\, i \le j : i = 0 \lor s_i \neq s_{i-1} \,\} \quad (s_j \neq 0), \qquad
        p_j = 0 \quad (s_j = 0)

    A segment is a maximal run of equal ids (the packer writes each sequence as one contiguous run), so a
    packed sequence gets the positions ``0, 1, ...`` it would have alone, and with them the same sinusoidal,
    learned or rotary position encodings.

    Args:
      segments: integer ``[..., L]``, 0 on padding; may be traced.

    Returns:
      int32 ``[..., L]``.

    >>> segment_positions(jnp.array([1, 1, 1, 2, 2, 3, 0, 0]))
    Array([0, 1, 2, 0, 1, 0, 0, 0], dtype=int32)
    """
    _check_segments("segments", segments)
    s = jnp.asarray(segments)
    idx = jnp.broadcast_to(jnp.arange(s.shape[-1], dtype=jnp.int32), s.shape)
    start = jnp.concatenate([jnp.ones_like(s[..., :1], bool), s[..., 1:] != s[..., :-1]], axis=-1)
    first = jax.lax.cummax(jnp.where(start, idx, 0), axis=s.ndim - 1)  # index of the run's first position
    return jnp.where(s != 0, idx - first, 0).astype(jnp.int32)


# An additive float entry at or below this blocks its pair: exp(-1000) is 0 even in float64, so PyTorch gives the
# pair weight 0 too. It covers -inf, finfo(dtype).min, -1e9 and the -1e4 / -10000 of BERT-style masks (which is
# -9984 in bfloat16); a finite non-zero entry above it is a bias, not a mask.
BLOCKED_AT_OR_BELOW = -1e3


def _torch_to_ours(name: str, mask) -> Bool[Array, "..."]:
    """PyTorch boolean (True = blocked) or additive float (0 = attend, <= -1000 = blocked) mask -> ours."""
    dtype = jnp.asarray(mask).dtype
    if dtype == jnp.bool_:
        return jnp.logical_not(jnp.asarray(mask))
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{name} must be boolean or floating (additive), got dtype {dtype}")
    try:
        values = np.asarray(mask).astype(np.float64)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        raise ValueError(
            f"a float {name} is converted from its values, which are unknown inside jit/vmap/grad: convert it "
            "once outside the transformation (a boolean one converts anywhere)"
        ) from None
    blocked = values <= BLOCKED_AT_OR_BELOW
    bias = ~(blocked | (values == 0.0))  # also NaN and +inf
    if bias.any():
        example = values[bias].flat[0]
        raise ValueError(
            f"{name} {shape_str(values)} holds {int(bias.sum())} value(s) that are neither 0 (attend) nor <= "
            f"{BLOCKED_AT_OR_BELOW:g} (blocked), e.g. {float(example):g}: that is an additive bias, not a mask; pass "
            "it as bias= to attn_jax.dot_product_attention (with a boolean mask= for the blocked pairs)"
        )
    return jnp.asarray(~blocked)


def from_torch_key_padding_mask(key_padding_mask: Bool[ArrayLike, "... S"]) -> Bool[Array, "... 1 S"]:
    r"""Convert PyTorch's ``key_padding_mask`` (True = padding, *ignore*) to ours (True = may attend).

    .. math:: m_{ij} = \neg\, \mathrm{kpm}_j

    ``torch.nn.MultiheadAttention(..., key_padding_mask=kpm)`` takes ``kpm`` of shape ``[B, S]`` where **True
    marks a padded key to be ignored** — the opposite of this library, where True means "may attend". Passing
    a PyTorch mask unconverted attends *only* to padding. A float ``key_padding_mask`` is additive in PyTorch:
    it converts by the rule of :func:`from_torch_attn_mask` (0 = keep, ``<= -1000`` including ``-inf`` and
    ``-1e9`` = ignore, anything else is a bias and a ``ValueError``).

    Another difference: PyTorch's old fast path returned NaN for a query whose keys are all padding; here such
    a row gets zero weights and a zero context.

    Args:
      key_padding_mask: PyTorch-convention ``[..., S]`` (bool: True = ignore; float: 0 = keep, <= -1000 =
        ignore).

    Returns:
      boolean ``[..., 1, S]`` in this library's convention, broadcasting over queries (like
      :func:`key_padding_mask`).

    >>> from_torch_key_padding_mask(jnp.array([[False, False, True]])).astype(int)
    Array([[[1, 1, 0]]], dtype=int32)
    """
    check_min_rank("key_padding_mask", key_padding_mask, 1)
    return _torch_to_ours("key_padding_mask", key_padding_mask)[..., None, :]


def from_torch_attn_mask(
    attn_mask: Bool[ArrayLike, "... T S"] | Float[ArrayLike, "... T S"],
) -> Bool[Array, "... T S"]:
    r"""Convert PyTorch ``nn.MultiheadAttention``'s ``attn_mask`` to ours (True = may attend).

    .. math:: m_{ij} = \neg\, \mathrm{attn\_mask}_{ij} \;\text{(bool)}, \qquad
        m_{ij} = [\, \mathrm{attn\_mask}_{ij} = 0 \,] \;\text{(float)}

    In ``torch.nn.MultiheadAttention`` / ``nn.Transformer`` a **boolean** ``attn_mask`` has **True = not
    allowed** (the opposite of ours), and a **float** ``attn_mask`` is added to the logits, a very negative
    entry blocking a pair. The float rule: ``0`` -> may attend; ``<= -1000`` -> blocked (``-inf``,
    ``finfo(dtype).min``, ``-1e9``, the ``-1e4`` of BERT-style masks: added to a logit, each makes that pair's
    softmax weight underflow to exactly 0, even in float64); **anything else** (``-0.5``, ``-100``, positive,
    NaN) is an additive bias a boolean cannot carry, and raises a ``ValueError`` that says to pass it as
    ``bias=`` to :func:`dot_product_attention`. Float masks are converted from their values, so they must be
    concrete (convert outside ``jit``); boolean ones convert anywhere.

    Beware: ``torch.nn.functional.scaled_dot_product_attention`` uses the *other* convention for boolean masks
    (True = take part in attention, like ours): do **not** convert those. PyTorch's 3-D ``attn_mask`` is
    ``[B·H, T, S]`` with batch and heads fused; reshape it to ``[B, H, T, S]`` before (or after) converting.

    Args:
      attn_mask: PyTorch-convention ``[..., T, S]`` (bool: True = blocked; float: additive, 0 = attend, <= -1000
        = blocked).

    Returns:
      boolean ``[..., T, S]`` in this library's convention.

    Raises:
      ValueError: a float mask with an entry that is neither 0 nor <= -1000, or a traced float mask.

    >>> from_torch_attn_mask(jnp.array([[0.0, -jnp.inf, -1e9]])).astype(int)
    Array([[1, 0, 0]], dtype=int32)
    """
    check_min_rank("attn_mask", attn_mask, 2)
    return _torch_to_ours("attn_mask", attn_mask)


def lengths_mask(
    query_lengths: Int[ArrayLike, "..."] | None,
    key_lengths: Int[ArrayLike, "..."] | None,
    query_length: int,
    key_length: int,
) -> Bool[Array, "... T S"] | None:
    """The mask that lengths stand for: ``(i < query_lengths) ∧ (j < key_lengths)``, ``[..., T|1, S|1]``.

    A ``None`` length leaves its axis unmasked (size 1); both ``None`` gives ``None``. May be traced.
    """
    rows = None if query_lengths is None else make_padding_mask(query_lengths, query_length)[..., :, None]
    cols = None if key_lengths is None else make_padding_mask(key_lengths, key_length)[..., None, :]
    if rows is None or cols is None:
        return cols if rows is None else rows
    return jnp.logical_and(rows, cols)


def padding_lengths(
    mask: Bool[ArrayLike, "... T S"], *, causal: bool = False
) -> tuple[Int[Array, "..."] | None, Int[Array, "..."] | None] | None:
    r"""The lengths a padding mask was built from, or ``None`` when the mask is not a padding mask.

    .. math:: m_{b,i,j} = [\, i < q_b \,] \wedge [\, j < k_b \,] \;(\wedge\, [\, j \le i \,]\ \text{with causal})

    A padding mask is what :func:`make_attention_mask` of two :func:`make_padding_mask`\ s gives (padded queries
    get all-False rows), or :func:`key_padding_mask` of one (``[..., 1, S]``: no query axis). Lengths are what
    :func:`dot_product_attention` hands to cuDNN flash attention (``query_lengths=``, ``key_lengths=``), where a
    boolean mask would become a dense ``[..., T, S]`` bias. Whether a mask is a padding mask depends on its
    *values*, which are unknown inside ``jit``: convert once, outside (a data pipeline, a test), or better, pass
    the lengths the mask was built from. The answer is checked: the mask the lengths stand for equals ``mask``
    entry for entry, else ``None``.

    An axis of size 1 is read as broadcast: a ``[..., 1, S]`` mask gives ``query_lengths=None`` (every query),
    a ``[..., T, 1]`` one ``key_lengths=None``. Lengths are canonical: a mask with no allowed pair at all in a
    batch element gives 0 and 0 there; with ``causal`` a key length above the query length gives the query
    length (keys ``j >= q`` are read by no valid query, so both describe the same mask).

    Args:
      mask: boolean ``[..., T, S]`` (True = may attend), concrete (not traced).
      causal: the mask also holds the causal pattern ``j <= i`` (top-left aligned, as
        :func:`make_causal_mask`); pass the lengths with ``causal=True`` to :func:`dot_product_attention`.

    Returns:
      ``(query_lengths, key_lengths)``, int32 arrays of the mask's batch axes ``[...]`` (``None`` for an axis
      of size 1), or ``None`` when no lengths give exactly ``mask``.

    Raises:
      ValueError: a non-boolean mask, rank below 2, or a traced mask.

    >>> padding_lengths(key_padding_mask(make_padding_mask(jnp.array([2, 3]), 4)))
    (None, Array([2, 3], dtype=int32))
    >>> q, k = padding_lengths(make_attention_mask(*make_padding_mask(jnp.array([[1], [3]]), 3)))
    >>> q.tolist(), k.tolist()
    ([1], [3])
    >>> print(padding_lengths(jnp.array([[True, False, True]])))  # a hole: not a padding mask
    None
    """
    check_min_rank("mask", mask, 2)
    _check_bool("mask", mask)
    try:
        m = np.asarray(mask)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        raise ValueError(
            "padding_lengths reads the mask's values, which are unknown inside jit/vmap/grad: pass the lengths "
            "the mask was built from (dot_product_attention's query_lengths=/key_lengths=), or convert once "
            "outside the transformation"
        ) from None
    t, s = m.shape[-2:]
    counts = m.sum(-1, dtype=np.int32)  # [..., T]
    # the candidates; the check below decides (a mask with holes or a suffix gets lengths that rebuild another)
    q = None if t == 1 else (counts > 0).sum(-1, dtype=np.int32)  # [...]
    k = None if s == 1 else counts.max(-1)  # [...]
    rebuilt = lengths_mask(q, k, t, s)
    rebuilt = np.ones((1, 1), bool) if rebuilt is None else np.asarray(rebuilt)
    if causal:
        rebuilt = rebuilt & (np.arange(s)[None, :] <= np.arange(t)[:, None])
    if not np.array_equal(np.broadcast_to(rebuilt, m.shape), m):
        return None
    return tuple(None if x is None else jnp.asarray(x, jnp.int32) for x in (q, k))
