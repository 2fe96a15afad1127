"""Multi-head attention (Vaswani et al. 2017, §3.2.2) as pure functions over a Flax-compatible param dict.

Parameters are a nested dict laid out exactly like ``flax.nnx.MultiHeadAttention``'s state, so weights copy
across in either direction::

    {"query": {"kernel": [Dq, H, K], "bias": [H, K]},
     "key":   {"kernel": [Dk, G, K], "bias": [G, K]},
     "value": {"kernel": [Dv, G, Kv], "bias": [G, Kv]},
     "out":   {"kernel": [H, Kv, Do], "bias": [Do]}}

(no ``"bias"`` entries when ``use_bias=False``). The number of heads and their widths are read from the
kernels. ``G = H`` and ``Dv = Dk`` in Flax's layout; ``G < H`` (``H % G == 0``) is grouped-query attention
(Ainslie et al. 2023), ``Dv != Dk`` separate key and value inputs of different widths (PyTorch's
``kdim``/``vdim``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attn_jax.attention._checks import (
    check_broadcastable,
    check_floating,
    check_mask,
    check_min_rank,
    positive_int,
    shape_str,
)
from attn_jax.attention._dot_product import dot_product_attention
from attn_jax.attention._normalizers import check_normalizer
from attn_jax.attention._padding import live_rows, zero_rows
from attn_jax.typing import Array, Bool, Float, PRNGKeyArray

_PROJECTIONS = ("query", "key", "value", "out")
# Standard deviation of a unit normal truncated to [-2, 2] (as in jax.nn.initializers.variance_scaling).
_TRUNCATED_NORMAL_STD = 0.87962566103423978


def init_multi_head_params(
    key: PRNGKeyArray,
    num_heads: int,
    query_features: int,
    *,
    key_features: int | None = None,
    qkv_features: int | None = None,
    out_features: int | None = None,
    use_bias: bool = True,
    dtype=jnp.float32,
    value_features: int | None = None,
    num_kv_heads: int | None = None,
) -> dict:
    r"""Initialise multi-head attention parameters (Flax ``nnx.MultiHeadAttention`` layout).

    .. math:: W^Q \in \mathbb{R}^{D_q \times H \times K},\; W^K \in \mathbb{R}^{D_k \times G \times K},\;
        W^V \in \mathbb{R}^{D_v \times G \times K},\;
        W^O \in \mathbb{R}^{H \times K \times D_o}, \qquad K = \mathrm{qkv\_features} / H

    Vaswani et al. 2017, §3.2.2. Kernels are LeCun-normal over their fan-in (``D_q``/``D_k``/``D_v`` for the
    input projections, ``H·K`` for the output one) — truncated normal with variance ``1/fan_in``, Flax's
    default; biases are zero. ``num_kv_heads = G < H`` gives grouped-query attention (Ainslie et al. 2023,
    "GQA"; ``G = 1`` is Shazeer 2019's multi-query attention): the key and value projections have ``G`` heads,
    each shared by ``H / G`` consecutive query heads, so they and a decoder's key/value cache shrink by
    ``H / G``. With the defaults the draw is exactly the one without these arguments.

    Args:
      key: PRNG key.
      num_heads: ``H``.
      query_features: ``D_q``, width of the queries' inputs.
      key_features: ``D_k``, width of the keys'/values' inputs (cross attention); defaults to
        ``query_features``.
      qkv_features: ``H·K``, total width of the projected queries/keys/values; defaults to ``query_features``.
        Must be divisible by ``num_heads``.
      out_features: ``D_o``; defaults to ``query_features``.
      use_bias: include bias vectors.
      dtype: parameter dtype.
      value_features: ``D_v``, width of the values' input when it differs from the keys'
        (``multi_head_attention(..., inputs_v=...)``, PyTorch's ``vdim``); defaults to ``key_features``.
      num_kv_heads: ``G``, heads of the key and value projections; must divide ``num_heads``; defaults to
        ``num_heads`` (ordinary multi-head attention).

    Returns:
      the nested param dict described in the module docstring.

    >>> p = init_multi_head_params(jax.random.key(0), 2, 6)
    >>> p["query"]["kernel"].shape, p["out"]["kernel"].shape
    ((6, 2, 3), (2, 3, 6))
    >>> init_multi_head_params(jax.random.key(0), 4, 8, value_features=5, num_kv_heads=2)["value"]["kernel"].shape
    (5, 2, 2)
    """
    key_features = query_features if key_features is None else key_features
    value_features = key_features if value_features is None else value_features
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    qkv_features = query_features if qkv_features is None else qkv_features
    out_features = query_features if out_features is None else out_features
    for name, n in [
        ("num_heads", num_heads),
        ("query_features", query_features),
        ("key_features", key_features),
        ("value_features", value_features),
        ("num_kv_heads", num_kv_heads),
        ("qkv_features", qkv_features),
        ("out_features", out_features),
    ]:
        positive_int(name, n)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads}): each key/value head serves "
            "num_heads / num_kv_heads query heads"
        )
    if qkv_features % num_heads:
        raise ValueError(
            f"qkv_features ({qkv_features}) must be divisible by num_heads ({num_heads}) to split into heads"
        )
    head = qkv_features // num_heads
    shapes = {
        "query": (query_features, num_heads, head),
        "key": (key_features, num_kv_heads, head),
        "value": (value_features, num_kv_heads, head),
        "out": (num_heads, head, out_features),
    }
    fan_in = {"query": query_features, "key": key_features, "value": value_features, "out": qkv_features}
    # One draw for all four kernels: every distinct PRNG shape costs an XLA compilation (~1 s on CPU).
    sizes = [int(np.prod(s)) for s in shapes.values()]
    flat = jax.random.truncated_normal(key, -2.0, 2.0, (sum(sizes),), jnp.float32)
    pieces = jnp.split(flat, np.cumsum(sizes)[:-1])
    params = {}
    for (name, shape), piece in zip(shapes.items(), pieces, strict=True):
        # LeCun normal as in jax.nn.initializers: N(0, 1/fan_in) truncated at ±2σ, σ corrected for the cut.
        std = np.sqrt(1.0 / fan_in[name]) / _TRUNCATED_NORMAL_STD
        params[name] = {"kernel": (std * piece).reshape(shape).astype(dtype)}
    if use_bias:
        for name in ("query", "key", "value"):
            params[name]["bias"] = jnp.zeros(shapes[name][1:], dtype)
        params["out"]["bias"] = jnp.zeros((out_features,), dtype)
    return params


def split_heads(x: Float[Array, "... T HK"], num_heads: int) -> Float[Array, "... H T K"]:
    r"""Split the feature axis into heads, moved before the length axis: ``[..., T, H·K] -> [..., H, T, K]``.

    .. math:: y_{h,t,k} = x_{t,\, hK + k}

    >>> split_heads(jnp.arange(12.0).reshape(2, 6), 3)[1]  # head 1 holds features 2:4
    Array([[2., 3.],
           [8., 9.]], dtype=float32)
    """
    check_min_rank("x", x, 2)
    *batch, t, f = np.shape(x)
    if f % num_heads:
        raise ValueError(
            f"feature axis of x {shape_str(x)} ({f}) is not divisible by num_heads ({num_heads})"
        )
    x = jnp.reshape(x, (*batch, t, num_heads, f // num_heads))  # [..., T, H, K]
    return jnp.swapaxes(x, -3, -2)


def merge_heads(x: Float[Array, "... H T K"]) -> Float[Array, "... T HK"]:
    r"""Inverse of :func:`split_heads`: ``[..., H, T, K] -> [..., T, H·K]``.

    .. math:: y_{t,\, hK + k} = x_{h,t,k}

    >>> merge_heads(split_heads(jnp.arange(6.0).reshape(1, 6), 2))
    Array([[0., 1., 2., 3., 4., 5.]], dtype=float32)
    """
    check_min_rank("x", x, 3)
    *batch, h, t, k = np.shape(x)
    return jnp.reshape(jnp.swapaxes(x, -3, -2), (*batch, t, h * k))


def _check_params(params) -> tuple[int, int, int, int, int, int, int, int]:
    """Validate the param dict; return ``(Dq, Dk, Dv, H, G, K, Kv, Do)``."""
    if not isinstance(params, dict) or any(
        n not in params or "kernel" not in params[n] for n in _PROJECTIONS
    ):
        raise ValueError(f"params must be a dict with {list(_PROJECTIONS)}, each holding a 'kernel'")
    wq, wk, wv, wo = (params[n]["kernel"] for n in _PROJECTIONS)
    for name, w in [("query", wq), ("key", wk), ("value", wv), ("out", wo)]:
        if np.ndim(w) != 3:
            raise ValueError(f"params['{name}']['kernel'] must have 3 axes, got shape {shape_str(w)}")
    dq, h, k = np.shape(wq)
    g = np.shape(wk)[1]
    if np.shape(wk)[2] != k or np.shape(wv)[1] != g or np.shape(wo)[0] != h:
        raise ValueError(
            "inconsistent multi-head kernels: query [Dq, H, K], key [Dk, G, K], value [Dv, G, Kv] and "
            f"out [H, Kv, Do] expected, got query {shape_str(wq)}, key {shape_str(wk)}, "
            f"value {shape_str(wv)}, out {shape_str(wo)}"
        )
    if h % g:
        raise ValueError(
            f"the key/value kernels' heads (num_kv_heads {g}, key {shape_str(wk)}) must divide the query "
            f"kernel's heads H ({h}, query {shape_str(wq)})"
        )
    kv = np.shape(wv)[2]
    if np.shape(wo)[1] != kv:
        raise ValueError(
            f"out kernel {shape_str(wo)} must be [H, Kv, Do] with Kv = {kv} from value {shape_str(wv)}"
        )
    return dq, np.shape(wk)[0], np.shape(wv)[0], h, g, k, kv, np.shape(wo)[2]


def _project(x, p, dtype) -> Float[Array, "... H T K"]:
    """Input projection ``[..., T, D] @ [D, H, K] (+ [H, K]) -> [..., H, T, K]``, float32 accumulation."""
    y = jnp.einsum("...td,dhk->...htk", x, p["kernel"].astype(dtype), preferred_element_type=jnp.float32)
    if "bias" in p:
        y = y + p["bias"].astype(jnp.float32)[:, None, :]
    return y.astype(dtype)


def multi_head_attention(
    params: dict,
    inputs_q: Float[Array, "... T Dq"],
    inputs_kv: Float[Array, "... S Dk"] | None = None,
    mask: Bool[Array, "... H T S"] | Bool[Array, "... T S"] | None = None,
    *,
    inputs_v: Float[Array, "... S Dv"] | None = None,
    scale: float | None = None,
    return_weights: bool = False,
    normalizer: str = "softmax",
) -> Float[Array, "... T Do"] | tuple[Float[Array, "... T Do"], Float[Array, "... H T S"]]:
    r"""Multi-head attention: project into ``H`` heads, scaled dot-product attention per head, project back.

    .. math:: \mathrm{MultiHead}(X_q, X_{kv}) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_H) W^O,
        \quad \mathrm{head}_h = \mathrm{Attention}(X_q W^Q_h, X_{kv} W^K_h, X_{kv} W^V_h)

    Vaswani et al. 2017, §3.2.2; equals ``flax.nnx.MultiHeadAttention`` (``decode=False``, no dropout) with
    the same weights. Key/value kernels with ``G < H`` heads give grouped-query attention (Ainslie et al. 2023;
    :func:`dot_product_attention` with ``num_kv_heads=G``, the keys and values never repeated); ``inputs_v``
    gives the values their own input, of its own width (``torch.nn.MultiheadAttention``'s ``kdim``/``vdim``:
    ``head_h = Attention(X_q W^Q_h, X_k W^K_g, X_v W^V_g)``, ``g = h // (H / G)``). Projections accumulate in float32 and are stored in the compute dtype (the inputs'
    dtype; params are cast to it); logits and softmax are float32 (see :func:`dot_product_attention`).

    Mask rank: with ``n`` the rank of the broadcast batch axes plus 2 (``inputs_q.ndim`` when the inputs share
    their batch axes), a mask of rank ``2..n`` is ``[..., T, S]`` with **no head axis**: it is broadcast over
    heads and, NumPy-style from the right, over any batch axes it lacks (a ``[T, S]`` causal mask, or a
    ``[B, 1, S]`` padding mask with ``[E, B, T, D]`` inputs). A mask of rank ``n + 1`` is ``[..., H, T, S]``
    (a head axis of size 1 or ``H``); a head axis is recognised at that rank only, so give a per-head mask
    every batch axis (size 1 is fine). Rank 0, 1 or above ``n + 1`` is a ``ValueError``.

    Rows of ``inputs_q``/``inputs_kv`` that the mask never reads (padding) are zeroed before the projections,
    so a NaN or ±inf stored there reaches no output (beyond the fully masked query rows' zero context) and no
    gradient, the kernels' included.

    Args:
      params: nested dict (see module docstring), e.g. from :func:`init_multi_head_params`.
      inputs_q: ``[..., T, Dq]``.
      inputs_kv: ``[..., S, Dk]``, the keys' input, and the values' unless ``inputs_v`` is given; ``None``
        means self-attention (``inputs_q``).
      mask: boolean, True = may attend: ``[..., T, S]`` or ``[..., H, T, S]`` (broadcastable).
      inputs_v: ``[..., S, Dv]``, the values' input when it is not ``inputs_kv`` (needs ``inputs_kv``);
        ``Dv`` must match the value kernel.
      scale: logit multiplier; ``None`` means ``1/√K`` with ``K`` the head width.
      return_weights: also return the per-head float32 weights.
      normalizer: what turns each head's logits into weights: ``"softmax"`` (the paper's), ``"sparsemax"``
        (Martins & Astudillo 2016) or ``"entmax15"`` (Peters et al. 2019), with the same mask policy (see
        :func:`dot_product_attention`); anything else is a ``ValueError``.

    Returns:
      ``[..., T, Do]`` in the inputs' dtype, or ``(out, weights [..., H, T, S] float32)`` when
      ``return_weights``.

    Raises:
      ValueError: widths that do not match the kernels, inconsistent kernels, non-broadcasting batch axes, or
        a mask of the wrong rank/shape/dtype (the message names the shapes); an unknown ``normalizer``.

    >>> p = init_multi_head_params(jax.random.key(0), 2, 4)
    >>> multi_head_attention(p, jnp.ones((3, 5, 4)), mask=jnp.ones((3, 5, 5), bool)).shape
    (3, 5, 4)
    """
    check_normalizer(normalizer)
    dq, dk, dv, h, g, _, _, _ = _check_params(params)
    if inputs_v is not None and inputs_kv is None:
        raise ValueError("inputs_v (the values' input) needs inputs_kv (the keys' input); got inputs_kv=None")
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    if inputs_v is None and dv != dk:
        raise ValueError(
            f"the value kernel {shape_str(params['value']['kernel'])} expects inputs of width {dv} but the key "
            f"kernel {shape_str(params['key']['kernel'])} expects {dk}: pass the values' input as inputs_v"
        )
    inputs_v = inputs_kv if inputs_v is None else inputs_v
    check_min_rank("inputs_q", inputs_q, 2)
    check_min_rank("inputs_kv", inputs_kv, 2)
    check_min_rank("inputs_v", inputs_v, 2)
    check_floating("inputs_q", inputs_q)
    check_floating("inputs_kv", inputs_kv)
    check_floating("inputs_v", inputs_v)
    if np.shape(inputs_q)[-1] != dq:
        raise ValueError(
            f"inputs_q {shape_str(inputs_q)} has width {np.shape(inputs_q)[-1]} but the query kernel "
            f"{shape_str(params['query']['kernel'])} expects {dq}"
        )
    if np.shape(inputs_kv)[-1] != dk:
        raise ValueError(
            f"inputs_kv {shape_str(inputs_kv)} has width {np.shape(inputs_kv)[-1]} but the key/value kernels "
            f"{shape_str(params['key']['kernel'])} expect {dk}"
        )
    if np.shape(inputs_v)[-1] != dv:
        raise ValueError(
            f"inputs_v {shape_str(inputs_v)} has width {np.shape(inputs_v)[-1]} but the value kernel "
            f"{shape_str(params['value']['kernel'])} expects {dv}"
        )
    if np.shape(inputs_v)[-2] != np.shape(inputs_kv)[-2]:
        raise ValueError(
            f"inputs_v {shape_str(inputs_v)} and inputs_kv {shape_str(inputs_kv)} must have the same length S "
            "(axis -2): one value per key"
        )
    batch = check_broadcastable(
        ["inputs_q batch axes", "inputs_kv batch axes", "inputs_v batch axes"],
        [np.shape(inputs_q)[:-2], np.shape(inputs_kv)[:-2], np.shape(inputs_v)[:-2]],
    )
    logits_shape = (*batch, h, np.shape(inputs_q)[-2], np.shape(inputs_kv)[-2])
    if mask is not None:
        n = len(batch) + 2
        if 2 <= np.ndim(mask) <= n:
            mask = jnp.asarray(mask)[..., None, :, :]  # [..., 1, T, S]: same mask for every head
        elif np.ndim(mask) != n + 1:
            raise ValueError(
                f"mask {shape_str(mask)} must have rank {n} ([..., T, S], broadcast over heads; fewer leading "
                f"axes broadcast too, down to [T, S]) or {n + 1} ([..., H, T, S]) for inputs_q "
                f"{shape_str(inputs_q)} and inputs_kv {shape_str(inputs_kv)}"
            )
        check_mask(mask, logits_shape, what="multi-head attention logits [..., H, T, S]")

    if mask is not None:
        # Unread rows (padding) may hold anything: zero them before the projections, whose kernel gradients
        # would otherwise multiply a NaN there by its zero cotangent. A row is read if any head reads it.
        per_pair = jnp.any(jnp.asarray(mask), axis=-3)  # [..., T, S]
        inputs_q = zero_rows(inputs_q, live_rows(per_pair, np.shape(inputs_q), -2))
        inputs_kv = zero_rows(inputs_kv, live_rows(per_pair, np.shape(inputs_kv), -1))
        inputs_v = zero_rows(inputs_v, live_rows(per_pair, np.shape(inputs_v), -1))
    dtype = jnp.result_type(inputs_q, inputs_kv, inputs_v)
    q = _project(inputs_q, params["query"], dtype)  # [..., H, T, K]
    k = _project(inputs_kv, params["key"], dtype)  # [..., G, S, K]
    v = _project(inputs_v, params["value"], dtype)  # [..., G, S, Kv]
    context, weights = dot_product_attention(
        q,
        k,
        v,
        mask,
        scale=scale,
        return_weights=True,
        num_kv_heads=None if g == h else g,
        normalizer=normalizer,
    )
    out = jnp.einsum(
        "...htk,hko->...to",
        context,
        params["out"]["kernel"].astype(dtype),
        preferred_element_type=jnp.float32,
    )
    if "bias" in params["out"]:
        out = out + params["out"]["bias"].astype(jnp.float32)
    out = out.astype(dtype)
    return (out, weights) if return_weights else out


# ---------------------------------------------------------------------------------------------------------
# The two projections on their own, for callers that put something between them and the attention: rotary
# position embeddings on the projected queries/keys, or a decoder's key/value cache (see
# ``attn_jax.models.transformer``). ``multi_head_attention`` is exactly
# ``project_output(out, dot_product_attention(project_heads(query, x_q), project_heads(key, x_kv),
# project_heads(value, x_v), mask))`` (with ``num_kv_heads=G`` when the key/value kernels have ``G < H`` heads).


def project_heads(params: dict, x: Float[Array, "... T D"]) -> Float[Array, "... H T K"]:
    r"""One input projection of multi-head attention, split into heads: ``[..., T, D] -> [..., H, T, K]``.

    .. math:: y_{h,t,k} = \sum_d x_{t,d} W_{d,h,k} + b_{h,k}

    Vaswani et al. 2017, §3.2.2 (``X W^Q_h`` for every head ``h`` at once). The product accumulates in
    float32 and is returned in ``x``'s dtype (the parameters are cast to it), as in
    :func:`multi_head_attention`.

    Args:
      params: ``{"kernel": [D, H, K], "bias": [H, K]}`` (``"bias"`` optional), e.g. ``params["query"]`` of
        :func:`init_multi_head_params`.
      x: ``[..., T, D]``, floating.

    Returns:
      ``[..., H, T, K]`` in ``x``'s dtype.

    >>> p = init_multi_head_params(jax.random.key(0), 2, 6)
    >>> project_heads(p["query"], jnp.ones((3, 5, 6))).shape
    (3, 2, 5, 3)
    """
    if not isinstance(params, dict) or "kernel" not in params or np.ndim(params["kernel"]) != 3:
        raise ValueError("params must be a dict with a 'kernel' [D, H, K] (and optionally a 'bias' [H, K])")
    check_min_rank("x", x, 2)
    check_floating("x", x)
    kernel = params["kernel"]
    if np.shape(x)[-1] != np.shape(kernel)[0]:
        raise ValueError(
            f"x {shape_str(x)} has width {np.shape(x)[-1]} but the kernel {shape_str(kernel)} expects "
            f"{np.shape(kernel)[0]}"
        )
    if "bias" in params and np.shape(params["bias"]) != np.shape(kernel)[1:]:
        raise ValueError(
            f"bias {shape_str(params['bias'])} must be [H, K] = {shape_str(np.shape(kernel)[1:])}"
        )
    return _project(x, params, jnp.asarray(x).dtype)


def project_output(params: dict, context: Float[Array, "... H T K"]) -> Float[Array, "... T Do"]:
    r"""The output projection of multi-head attention: concatenate the heads and apply ``W^O``.

    .. math:: y_{t,o} = \sum_{h,k} c_{h,t,k} W^O_{h,k,o} + b_o
        \;=\; \big(\mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_H)\, W^O\big)_{t,o} + b_o

    Vaswani et al. 2017, §3.2.2. Accumulates in float32; returns ``context``'s dtype.

    Args:
      params: ``{"kernel": [H, K, Do], "bias": [Do]}`` (``"bias"`` optional), e.g. ``params["out"]``.
      context: ``[..., H, T, K]`` per-head contexts (e.g. from ``dot_product_attention``).

    Returns:
      ``[..., T, Do]`` in ``context``'s dtype.

    >>> p = init_multi_head_params(jax.random.key(0), 2, 6)
    >>> project_output(p["out"], jnp.ones((3, 2, 5, 3))).shape
    (3, 5, 6)
    """
    if not isinstance(params, dict) or "kernel" not in params or np.ndim(params["kernel"]) != 3:
        raise ValueError("params must be a dict with a 'kernel' [H, K, Do] (and optionally a 'bias' [Do])")
    check_min_rank("context", context, 3)
    check_floating("context", context)
    kernel = params["kernel"]
    if tuple(np.shape(context)[-3:-2]) + tuple(np.shape(context)[-1:]) != tuple(np.shape(kernel)[:2]):
        raise ValueError(
            f"context {shape_str(context)} must be [..., H, T, K] with (H, K) = {tuple(np.shape(kernel)[:2])} "
            f"from the out kernel {shape_str(kernel)}"
        )
    dtype = jnp.asarray(context).dtype
    out = jnp.einsum("...htk,hko->...to", context, kernel.astype(dtype), preferred_element_type=jnp.float32)
    if "bias" in params:
        out = out + params["bias"].astype(jnp.float32)
    return out.astype(dtype)
