"""Additive (Bahdanau) attention: a learned one-hidden-layer scorer ``vᵀ tanh(W_q s_i + W_k h_j + b)``.

Bahdanau, Cho & Bengio, "Neural Machine Translation by Jointly Learning to Align and Translate", ICLR 2015,
appendix A.1.2 (the paper's ``W_a``, ``U_a``, ``v_a`` are ``w_q``, ``w_k``, ``v`` here; ``s_i`` is the decoder
state, ``h_j`` the annotation of source word ``j``).

The key half ``W_k h_j`` does not depend on the decoder step, so it is computed once per source sentence by
:func:`project_keys` and reused at every step ("we can pre-compute U_a h_j in advance to minimise the
computational cost", appendix A.1.2); :func:`additive_attention_step` is the one-query form for a
``lax.scan``.

Optional weight normalisation of ``v`` (Salimans & Kingma 2016, as in tf/nmt's ``normed_bahdanau``): when the
params hold a scalar gain ``"g"``, the scorer uses ``v_eff = g · v / ‖v‖``. Whether a bias ``"b"`` is added is
likewise decided by its presence in the params; :func:`init_additive_params` decides both.

Memory: by default (``fused=True``) the energies go through
:func:`attn_jax.attention._fused_additive.fused_additive_scores`, whose backward pass recomputes the tanh, so
reverse mode keeps no ``[..., T, S, A]`` tensor (nor, in a decoder ``lax.scan``, one ``[B, S, A]`` tensor per
step). ``fused=False`` selects the plain autodiff of the formula, which saves the float32 ``[..., T, S, A]`` tanh
for the backward pass; it is the one to use with forward-mode autodiff (``jax.jvp``), which the fused path
lacks. Both give the same values and gradients up to float32 rounding.

Coverage (Tu et al. 2016, "Modeling Coverage for Neural Machine Translation"; See, Liu & Manning 2017, "Get To
The Point", eq. 11): when the params hold a coverage weight ``"w_c" [A]`` (``init_additive_params(...,
coverage=True)``), the scorer reads the attention accumulated so far, ``c_ij = Σ_{i'<i} α_{i'j}``, as an extra
term: ``e_ij = vᵀ tanh(W_q s_i + W_k h_j + w_c c_ij + b)``. The caller carries ``c`` (a decoder adds each step's
weights to it); :func:`attn_jax.train.coverage_loss` is the matching penalty ``Σ_j min(α_ij, c_ij)``. Because
``w_c c_ij`` depends on both the query and the key, the coverage-shifted keys ``k_j + w_c c_ij`` are formed per
query (``[..., T, S, A]``; in a decoder step ``[B, S, A]``), and the fused scorer keeps them as its residual.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attn_jax.attention._checks import (
    check_broadcastable,
    check_mask,
    check_min_rank,
    check_size,
    positive_int,
    shape_str,
)
from attn_jax.attention._fused_additive import fused_additive_scores
from attn_jax.attention._normalizers import attend_normalized, check_normalizer
from attn_jax.attention._padding import finite_rows, nan_unless, zero_masked_keys, zero_masked_queries
from attn_jax.typing import Array, Bool, Float, PRNGKeyArray

__all__ = [
    "additive_attention",
    "additive_attention_step",
    "additive_scores",
    "init_additive_params",
    "project_keys",
]


def init_additive_params(
    key: PRNGKeyArray,
    query_features: int,
    key_features: int,
    attention_dim: int,
    *,
    use_bias: bool = True,
    normalize: bool = False,
    init: str = "fan_in",
    coverage: bool = False,
    dtype=jnp.float32,
) -> dict[str, Array]:
    r"""Initialise the parameters of the additive scorer ``vᵀ tanh(W_q s + W_k h + b)``.

    ``init="fan_in"`` (the default): ``w_q ~ N(0, 1/Dq)``, ``w_k ~ N(0, 1/Dk)``, ``v ~ N(0, 1/A)``, ``b = 0``,
    so the scorer starts with energies of order one. ``init="paper"``: Bahdanau et al. (appendix B.1):
    ``W_a, U_a ~ N(0, 0.001²)``, ``v_a = 0``, ``b = 0``: every energy starts at 0 (uniform weights) and
    ``W_a, U_a`` get no gradient until ``v`` has moved, so the alignment grows from what the data make
    ``v`` learn first instead of from a random initial preference (the demo's recipe uses it:
    experiments/bahdanau2015/README.md).

    With ``normalize=True`` (tf/nmt ``normed_bahdanau``; Salimans & Kingma 2016) a scalar gain
    ``g = sqrt(1/A)`` is added and the scorer uses ``g · v / ‖v‖``; as in tf/nmt this always creates the bias
    ``b`` (zeros), whatever ``use_bias`` says.

    With ``coverage=True`` (See et al. 2017, eq. 11) a coverage weight ``w_c [A]`` is added: ``N(0, 1)`` (the
    fan-in of a scalar coverage is 1) with ``init="fan_in"``, ``N(0, 0.001²)`` like ``W_a, U_a`` with
    ``init="paper"``. It is drawn from ``fold_in(key, 3)``, so the other parameters are the same with or without
    it.

    Args:
      key: PRNG key.
      query_features: ``Dq``, width of the decoder state / query.
      key_features: ``Dk``, width of the annotations / keys.
      attention_dim: ``A``, the hidden width of the scorer (the paper's ``n'``).
      use_bias: add ``b [A]`` inside the tanh.
      normalize: weight-normalise ``v`` with a learned gain ``g []``.
      init: ``"fan_in"`` or ``"paper"`` (above). With ``normalize=True`` only ``"fan_in"`` (``v / ‖v‖`` of a
        zero ``v`` is undefined).
      coverage: add the coverage weight ``w_c [A]`` (above).
      dtype: parameter dtype.

    Returns:
      ``{"w_q": [Dq, A], "w_k": [Dk, A], "v": [A]}`` plus ``"b": [A]`` (if ``use_bias`` or ``normalize``),
      ``"g": []`` (if ``normalize``) and ``"w_c": [A]`` (if ``coverage``).

    >>> p = init_additive_params(jax.random.key(0), 4, 6, 3, normalize=True)
    >>> {k: v.shape for k, v in sorted(p.items())}
    {'b': (3,), 'g': (), 'v': (3,), 'w_k': (6, 3), 'w_q': (4, 3)}
    """
    dq = positive_int("query_features", query_features)
    dk = positive_int("key_features", key_features)
    a = positive_int("attention_dim", attention_dim)
    if init not in ("fan_in", "paper"):
        raise ValueError(f"init must be 'fan_in' or 'paper', got {init!r}")
    if init == "paper" and normalize:
        raise ValueError("init='paper' sets v = 0, which normalize=True cannot divide by; use init='fan_in'")
    if not isinstance(coverage, bool):
        raise ValueError(f"coverage must be a bool, got {coverage!r}")
    k_q, k_k, k_v = jax.random.split(key, 3)
    if init == "paper":
        params = {
            "w_q": (0.001 * jax.random.normal(k_q, (dq, a), jnp.float32)).astype(dtype),
            "w_k": (0.001 * jax.random.normal(k_k, (dk, a), jnp.float32)).astype(dtype),
            "v": jnp.zeros((a,), dtype),
        }
    else:
        params = {
            "w_q": (jax.random.normal(k_q, (dq, a), jnp.float32) / math.sqrt(dq)).astype(dtype),
            "w_k": (jax.random.normal(k_k, (dk, a), jnp.float32) / math.sqrt(dk)).astype(dtype),
            "v": (jax.random.normal(k_v, (a,), jnp.float32) / math.sqrt(a)).astype(dtype),
        }
    if use_bias or normalize:
        params["b"] = jnp.zeros((a,), dtype)
    if normalize:
        params["g"] = jnp.asarray(math.sqrt(1.0 / a), dtype)
    if coverage:
        # A key of its own (not a fourth split), so the other parameters do not depend on ``coverage``.
        scale = 0.001 if init == "paper" else 1.0
        params["w_c"] = (scale * jax.random.normal(jax.random.fold_in(key, 3), (a,), jnp.float32)).astype(
            dtype
        )
    return params


def _alignment_dim(params) -> int:
    """Check the parameter shapes against each other and return ``A``."""
    for name in ("w_q", "w_k", "v"):
        if name not in params:
            raise ValueError(f"additive params need {name!r}; got keys {sorted(params)}")
    w_q, w_k, v = params["w_q"], params["w_k"], params["v"]
    if jnp.ndim(w_q) != 2 or jnp.ndim(w_k) != 2 or jnp.ndim(v) != 1:
        raise ValueError(
            f"additive params must be w_q [Dq, A], w_k [Dk, A], v [A]; got w_q {shape_str(w_q)}, "
            f"w_k {shape_str(w_k)}, v {shape_str(v)}"
        )
    a = jnp.shape(v)[0]
    if jnp.shape(w_q)[1] != a or jnp.shape(w_k)[1] != a:
        raise ValueError(
            f"additive params disagree on A: w_q {shape_str(w_q)}, w_k {shape_str(w_k)}, v {shape_str(v)}"
        )
    if "b" in params and jnp.shape(params["b"]) != (a,):
        raise ValueError(f"additive bias b must have shape [{a}], got {shape_str(params['b'])}")
    if "g" in params and jnp.shape(params["g"]) != ():
        raise ValueError(f"additive gain g must be a scalar, got shape {shape_str(params['g'])}")
    if "w_c" in params and jnp.shape(params["w_c"]) != (a,):
        raise ValueError(
            f"additive coverage weight w_c must have shape [{a}], got {shape_str(params['w_c'])}"
        )
    return a


def _check_coverage(params, coverage, logits_shape: tuple[int, ...]) -> None:
    """Raise unless ``coverage`` and the params' ``w_c`` come together and ``coverage`` fits ``[..., T, S]``."""
    if coverage is None:
        if "w_c" in params:
            raise ValueError(
                "additive params carry a coverage weight w_c but no coverage was given; pass coverage "
                "(zeros before the first step)"
            )
        return
    if "w_c" not in params:
        raise ValueError(
            "coverage was given but the additive params have no coverage weight w_c; use "
            "init_additive_params(..., coverage=True)"
        )
    check_min_rank("coverage", coverage, 2)
    if not jnp.issubdtype(jnp.asarray(coverage).dtype, jnp.floating):
        raise ValueError(f"coverage must be a float array, got {jnp.asarray(coverage).dtype}")
    try:
        fits = jnp.broadcast_shapes(jnp.shape(coverage), logits_shape) == tuple(logits_shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"coverage {shape_str(coverage)} does not broadcast to the attention logits {list(logits_shape)}"
        )


def _check_keys(params, keys) -> None:
    """Raise unless ``keys`` is ``[..., S, Dk]`` with ``Dk`` the rows of ``w_k``."""
    check_min_rank("keys", keys, 2)
    dk = jnp.shape(params["w_k"])[0]
    if jnp.shape(keys)[-1] != dk:
        raise ValueError(
            f"keys have {jnp.shape(keys)[-1]} features (shape {shape_str(keys)}) but w_k "
            f"{shape_str(params['w_k'])} expects Dk = {dk}"
        )


def project_keys(params: dict[str, Array], keys: Float[Array, "... S Dk"]) -> Float[Array, "... S A"]:
    r"""The key half of the additive scorer, ``W_k h_j``: compute it once per source sentence.

    .. math:: k_j = W_k^\top h_j \in \mathbb{R}^A

    Bahdanau et al. 2015, appendix A.1.2: ``U_a h_j`` does not depend on the decoder step, so it is projected
    once and reused at every step by :func:`additive_scores` / :func:`additive_attention_step`.

    Args:
      params: from :func:`init_additive_params` (uses ``w_k [Dk, A]``).
      keys: annotations ``[..., S, Dk]``.

    Returns:
      ``[..., S, A]`` in float32 (it is half of the float32 tanh argument; keeping it in float32 avoids
      rounding it to bf16 once per sentence and then using the rounded value at every step).

    >>> p = init_additive_params(jax.random.key(0), 4, 6, 3)
    >>> project_keys(p, jnp.ones((2, 5, 6))).shape
    (2, 5, 3)
    """
    _alignment_dim(params)
    _check_keys(params, keys)
    keys, finite = finite_rows(keys)  # a NaN row (padding) gives NaN and meets no arithmetic: see finite_rows
    projected = jnp.einsum("...sd,da->...sa", keys, params["w_k"], preferred_element_type=jnp.float32)
    return jnp.where(finite[..., None], projected.astype(jnp.float32), jnp.nan)


def _effective_v(params) -> Float[Array, " A"]:
    """``v``, or ``g · v / ‖v‖`` when the params carry a weight-norm gain ``g``; float32."""
    v = jnp.asarray(params["v"], jnp.float32)
    if "g" in params:
        v = jnp.asarray(params["g"], jnp.float32) * v * jax.lax.rsqrt(jnp.sum(v * v))
    return v


def _scores_shape(params, query, projected_keys) -> tuple[int, ...]:
    """Validate query and projected keys; return the energies' shape ``[..., T, S]``."""
    a = _alignment_dim(params)
    check_min_rank("query", query, 2)
    check_min_rank("projected_keys", projected_keys, 2)
    dq = jnp.shape(params["w_q"])[0]
    if jnp.shape(query)[-1] != dq:
        raise ValueError(
            f"query has {jnp.shape(query)[-1]} features (shape {shape_str(query)}) but w_q "
            f"{shape_str(params['w_q'])} expects Dq = {dq}"
        )
    check_size("projected_keys", projected_keys, -1, a, "the alignment width A of params['v']")
    batch = check_broadcastable(
        ["query batch axes", "projected_keys batch axes"],
        [jnp.shape(query)[:-2], jnp.shape(projected_keys)[:-2]],
    )
    return batch + (jnp.shape(query)[-2], jnp.shape(projected_keys)[-2])


def additive_scores(
    params: dict[str, Array],
    query: Float[Array, "... T Dq"],
    projected_keys: Float[Array, "... S A"],
    *,
    fused: bool = True,
    coverage: Float[Array, "... T S"] | None = None,
) -> Float[Array, "... T S"]:
    r"""Additive energies ``e_ij = vᵀ tanh(W_q s_i + W_k h_j + b)`` from pre-projected keys.

    .. math:: e_{ij} = v^\top \tanh(W_q^\top s_i + k_j + w_c\, c_{ij} + b), \qquad k_j = W_k^\top h_j

    Bahdanau, Cho & Bengio 2015, appendix A.1.2 (eq. for ``a(s_{i-1}, h_j)``). ``b`` is added if present in
    ``params``; if ``params`` has a gain ``"g"``, ``v`` is replaced by ``g · v / ‖v‖`` (weight normalisation).
    The tanh argument is formed in float32. With ``fused=True`` (the default) the gradient recomputes the tanh
    rather than saving the ``[..., T, S, A]`` tensor (:func:`fused_additive_scores`); ``fused=False`` is the
    plain autodiff of the formula (needed for ``jax.jvp``). The coverage term ``w_c c_ij`` (See et al. 2017,
    eq. 11) is there only when ``params`` hold ``w_c``, and then ``coverage`` must be given.

    Args:
      params: from :func:`init_additive_params`.
      query: decoder states ``[..., T, Dq]``.
      projected_keys: ``project_keys(params, keys)``, ``[..., S, A]``.
      fused: use the memory-lean custom-VJP scorer (default) or the plain formula.
      coverage: the attention accumulated before each query, ``c_ij = Σ_{i'<i} α_{i'j}``, broadcastable to
        ``[..., T, S]``; exactly when ``params`` have ``w_c``.

    Returns:
      float32 energies ``[..., T, S]`` (leading axes broadcast).

    >>> p = init_additive_params(jax.random.key(0), 4, 6, 3)
    >>> additive_scores(p, jnp.ones((5, 4)), project_keys(p, jnp.ones((7, 6)))).shape
    (5, 7)
    """
    _check_coverage(params, coverage, _scores_shape(params, query, projected_keys))
    # The scorer takes no mask: a row holding NaN or ±inf (padding) gives NaN energies but meets no arithmetic,
    # so its gradient is 0 and a masked one cannot poison the others (see finite_rows).
    query, finite_q = finite_rows(query)
    projected_keys, finite_k = finite_rows(projected_keys)
    return nan_unless(_energies(params, query, projected_keys, fused, coverage), finite_q, finite_k)


def _energies(params, query, projected_keys, fused: bool, coverage) -> Float[Array, "... T S"]:
    """:func:`additive_scores` of checked inputs, with no care for non-finite rows (the attention zeroes them)."""
    pq = jnp.einsum("...td,da->...ta", query, params["w_q"], preferred_element_type=jnp.float32)
    if coverage is not None:
        return _coverage_scores(params, pq, projected_keys, coverage, fused)
    if fused:
        return fused_additive_scores(pq, projected_keys, _effective_v(params), params.get("b"))
    # [..., T, S, A]: every query against every key.
    pre = pq.astype(jnp.float32)[..., :, None, :] + jnp.asarray(projected_keys, jnp.float32)[..., None, :, :]
    if "b" in params:
        pre = pre + jnp.asarray(params["b"], jnp.float32)
    return jnp.einsum("...tsa,a->...ts", jnp.tanh(pre), _effective_v(params))


def _coverage_scores(params, pq, projected_keys, coverage, fused: bool) -> Float[Array, "... T S"]:
    """Energies with the coverage term: each query gets its own keys ``k_j + w_c c_ij``."""
    w_c = jnp.asarray(params["w_c"], jnp.float32)
    # [..., T, S, A]: the keys shifted by each query's coverage
    shifted = (
        jnp.asarray(projected_keys, jnp.float32)[..., None, :, :]
        + jnp.asarray(coverage, jnp.float32)[..., None] * w_c
    )
    if fused:
        # One query per key set: q [..., T, 1, A] against [..., T, S, A] gives [..., T, 1, S].
        return fused_additive_scores(pq[..., :, None, :], shifted, _effective_v(params), params.get("b"))[
            ..., 0, :
        ]
    pre = pq.astype(jnp.float32)[..., :, None, :] + shifted
    if "b" in params:
        pre = pre + jnp.asarray(params["b"], jnp.float32)
    return jnp.einsum("...tsa,a->...ts", jnp.tanh(pre), _effective_v(params))


def additive_attention(
    params: dict[str, Array],
    query: Float[Array, "... T Dq"],
    keys: Float[Array, "... S Dk"] | None,
    values: Float[Array, "... S Dv"] | None = None,
    mask: Bool[Array, "... T S"] | None = None,
    *,
    projected_keys: Float[Array, "... S A"] | None = None,
    return_weights: bool = False,
    fused: bool = True,
    normalizer: str = "softmax",
    coverage: Float[Array, "... T S"] | None = None,
) -> Float[Array, "... T Dv"] | tuple[Float[Array, "... T Dv"], Float[Array, "... T S"]]:
    r"""Bahdanau additive attention: score every key, softmax over the source axis, mix the values.

    .. math:: e_{ij} = v^\top \tanh(W_q s_i + W_k h_j + b), \quad
        \alpha_{ij} = \frac{\exp e_{ij}}{\sum_k \exp e_{ik}}, \quad c_i = \sum_j \alpha_{ij} h_j

    Bahdanau, Cho & Bengio 2015 (ICLR), section 3.1 and appendix A.1.2. Masked keys get weight exactly 0 and a
    row with no valid key gives zero weights and a zero context (see ``_softmax.py``). Rows of ``query``,
    ``keys``/``projected_keys`` and ``values`` that the mask never reads (padding) are zeroed first
    (:func:`zero_masked_keys`), so a NaN or ±inf there changes no result and no gradient.

    Args:
      params: from :func:`init_additive_params`.
      query: decoder states ``[..., T, Dq]``.
      keys: annotations ``[..., S, Dk]``. May be ``None`` when both ``projected_keys`` and ``values`` are
        given; when ``projected_keys`` is given, ``keys`` is only checked for its length, never re-projected.
      values: ``[..., S, Dv]``; defaults to ``keys`` (the paper mixes the annotations themselves).
      mask: boolean, broadcastable to ``[..., T, S]``; True = may attend.
      projected_keys: ``project_keys(params, keys)`` computed once per sentence, ``[..., S, A]``.
      return_weights: also return the float32 weights.
      fused: score with the memory-lean custom-VJP scorer (default); see :func:`additive_scores`.
      normalizer: ``"softmax"`` (the paper), ``"sparsemax"`` (Martins & Astudillo 2016) or ``"entmax15"``
        (Peters et al. 2019), which can give source words exactly zero weight; see
        :func:`attn_jax.masked_normalize`.
      coverage: ``c_ij``, the attention each source word has received before query ``i``, broadcastable to
        ``[..., T, S]``; exactly when ``params`` have ``w_c`` (coverage, See et al. 2017). Entries the mask never
        reads are zeroed first, like padded keys.

    Returns:
      context ``[..., T, Dv]`` in ``values``' dtype, or ``(context, weights [..., T, S])``.

    >>> p = init_additive_params(jax.random.key(0), 4, 6, 3)
    >>> ctx, w = additive_attention(p, jnp.ones((5, 4)), jnp.ones((7, 6)), return_weights=True)
    >>> ctx.shape, w.shape, bool(jnp.allclose(w.sum(-1), 1.0))
    ((5, 6), (5, 7), True)
    """
    _alignment_dim(params)
    check_normalizer(normalizer)
    given_projection = projected_keys is not None
    if projected_keys is None:
        if keys is None:
            raise ValueError("additive_attention needs keys [..., S, Dk] (or projected_keys and values)")
        _check_keys(params, keys)
        # Unread (padded) keys may hold anything: zero them before W_k, whose gradient would multiply a NaN there
        projected_keys = project_keys(params, zero_masked_keys(keys, mask))
    else:
        check_min_rank("projected_keys", projected_keys, 2)
        if keys is not None:
            check_min_rank("keys", keys, 2)
            if jnp.shape(keys)[-2] != jnp.shape(projected_keys)[-2]:
                raise ValueError(
                    f"keys {shape_str(keys)} and projected_keys {shape_str(projected_keys)} have different "
                    "source lengths S"
                )
    if values is None:
        if keys is None:
            raise ValueError("values must be given when keys is None")
        values = keys
    check_min_rank("values", values, 2)
    if jnp.shape(values)[-2] != jnp.shape(projected_keys)[-2]:
        raise ValueError(
            f"values {shape_str(values)} and keys (projected {shape_str(projected_keys)}) have different "
            "source lengths S"
        )
    logits_shape = _scores_shape(params, query, projected_keys)
    check_broadcastable(
        ["attention logits", "values batch axes"], [logits_shape[:-2], jnp.shape(values)[:-2]]
    )
    check_mask(mask, logits_shape)
    _check_coverage(params, coverage, logits_shape)
    # Rows the mask never reads (padding) are zeroed before any arithmetic (see zero_masked_keys): NaN or ±inf
    # there reaches neither the context nor a gradient. Keys given as projected_keys are zeroed here, values
    # by attend.
    query = zero_masked_queries(query, mask)
    if given_projection:
        projected_keys = zero_masked_keys(projected_keys, mask)
    if coverage is not None and mask is not None:
        coverage = jnp.where(mask, coverage, 0.0)  # where, not a product: NaN at padding reaches nothing
    scores = _energies(params, query, projected_keys, fused, coverage)
    context, weights = attend_normalized(scores, values, mask, normalizer=normalizer)
    return (context, weights) if return_weights else context


def additive_attention_step(
    params: dict[str, Array],
    query: Float[Array, "... Dq"],
    projected_keys: Float[Array, "... S A"],
    values: Float[Array, "... S Dv"],
    mask: Bool[Array, "... S"] | None = None,
    *,
    fused: bool = True,
    normalizer: str = "softmax",
    coverage: Float[Array, "... S"] | None = None,
) -> tuple[Float[Array, "... Dv"], Float[Array, "... S"]]:
    r"""One decoder step of additive attention (one query against all keys), for use inside ``lax.scan``.

    .. math:: \alpha_{j} = \operatorname{softmax}_j\big(v^\top \tanh(W_q s + k_j + w_c\, \mathrm{cov}_j + b)\big),
        \quad c = \sum_j \alpha_j v_j

    Bahdanau et al. 2015, appendix A.1.2: ``projected_keys = project_keys(params, keys)`` is computed once
    outside the scan and only ``W_q s`` is computed per step. Equals :func:`additive_attention` on a length-1
    target axis. With ``fused=True`` (the default) the gradient of a scan of steps saves only ``W_q s`` per step
    (plus the loop-invariant keys), not a ``[B, S, A]`` tanh per step.

    Args:
      params: from :func:`init_additive_params`.
      query: the decoder state of this step, ``[..., Dq]``.
      projected_keys: ``[..., S, A]`` from :func:`project_keys`.
      values: ``[..., S, Dv]`` (the annotations in the paper).
      mask: boolean, broadcastable to ``[..., S]``; True = may attend.
      fused: score with the memory-lean custom-VJP scorer (default) or the plain formula.
      normalizer: ``"softmax"`` (default), ``"sparsemax"`` or ``"entmax15"``; see :func:`additive_attention`.
      coverage: ``Σ`` of the previous steps' weights, broadcastable to ``[..., S]`` (zeros at the first step);
        exactly when ``params`` have ``w_c`` (See et al. 2017). The caller adds the returned weights to it.

    Returns:
      ``(context [..., Dv], weights [..., S])``: context in ``values``' dtype, float32 weights.

    >>> p = init_additive_params(jax.random.key(0), 4, 6, 3)
    >>> h = jnp.ones((7, 6))
    >>> ctx, w = additive_attention_step(p, jnp.ones(4), project_keys(p, h), h)
    >>> ctx.shape, w.shape
    ((6,), (7,))
    """
    check_min_rank("query", query, 1)
    check_min_rank("projected_keys", projected_keys, 2)
    if mask is not None:
        batch = check_broadcastable(
            ["query batch axes", "projected_keys batch axes"],
            [jnp.shape(query)[:-1], jnp.shape(projected_keys)[:-2]],
        )
        check_mask(mask, batch + (jnp.shape(projected_keys)[-2],), what="step logits [..., S]")
        mask = jnp.asarray(mask)[..., None, :]
    if coverage is not None:
        check_min_rank("coverage", coverage, 1)
        coverage = jnp.asarray(coverage)[..., None, :]
    context, weights = additive_attention(
        params,
        jnp.asarray(query)[..., None, :],
        None,
        values,
        mask,
        projected_keys=projected_keys,
        return_weights=True,
        fused=fused,
        normalizer=normalizer,
        coverage=coverage,
    )
    return context[..., 0, :], weights[..., 0, :]
