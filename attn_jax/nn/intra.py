r"""Intra-attention GRU encoder: each position attends over the states the recurrence has already produced.

After the LSTMN of Cheng, Dong & Lapata, "Long Short-Term Memory-Networks for Machine Reading", EMNLP 2016
(section 3.1), with the paper's LSTM replaced by the GRU of Bahdanau, Cho & Bengio (2015). At step ``t`` (in
scan order) with input ``x_t``, the earlier states ``h_j`` form a memory and the step computes

.. math::
    a_{t,j} = v^\top \tanh(W_h h_j + W_x x_t + W_{\tilde h} \tilde h_{t-1} + b), \qquad j \in P_t,

    s_{t,\cdot} = \operatorname{softmax}_{j \in P_t}(a_{t,\cdot}), \qquad
    \tilde h_t = \sum_{j \in P_t} s_{t,j}\, h_j, \qquad
    h_t = \mathrm{GRU}(x_t, \tilde h_t)

where ``P_t`` is the set of *real* (unmasked) positions processed before ``t``: ``j < t`` for the forward
direction, ``j > t`` for the backward one (``reverse=True``). The adaptive summary ``h̃_t`` takes the place of
the previous state ``h_{t-1}`` everywhere in the GRU (its gates, the reset ``r ∘ h̃_t`` and the interpolation
``(1 - z) ∘ h̃_t + z ∘ candidate``); attention with all its weight on the previous position recovers the plain
GRU. The causal restriction is a boolean mask (``make_causal_mask`` combined with the padding mask) and the
softmax is the core's ``masked_softmax`` (via ``attend``), so masked keys get weight exactly 0.

Where ``P_t`` is empty (the first real position; before it, nothing has been written) there is no previous
state to attend over: ``h̃_t = h_0``, the initial state (zeros by default, as the plain GRU's ``h_0``), and
the weights of that row are all 0. ``h̃_{t-1}`` in the first score is likewise ``h_0``.

How this differs from Cheng et al.: (1) a GRU, not an LSTM, so there is no memory tape of cells ``c_j`` and no
``c̃_t``; only the hidden-state tape ``h_j`` is attended over; (2) the scoring vector gets a bias ``b``
(the core's additive scorers carry one); (3) padding is honoured as in ``attn_jax.nn.recurrent``: at a masked
step the state is carried (``h_t = h_{t-1}``, ``h̃`` unchanged) and the position is never a key; (4) the
parameters are initialised as the core's additive scorer (fan-in-scaled normals, ``b = 0``; the paper does
not say).

Implementation: a ``jax.lax.scan`` whose carry holds the memory ``[B, S, n]`` of states, the projected keys
``W_h h_j`` ``[B, S, A]`` (each computed once, when its state is written into slot ``t``), ``h̃_{t-1}`` and the
last real state. ``W_x x_t`` and the GRU's input projections are computed for all steps before the scan. The
backward direction runs the same scan on the time-flipped sequence. Numerics follow ``attn_jax.nn.recurrent``:
matmul operands in the compute ``dtype``, float32 accumulation, float32 states, logits and softmax.

The energies are the core's ``attn_jax.attention.additive_scores`` (query kernel ``W_h̃``, keys
``W_h h_j + W_x x_t``) with the plain autodiff (``fused=False``): the fused scorer saves its key input instead of
the tanh, and here the keys are a ``[B, S, A]`` carry that is new at every step, so it would save no memory; the
plain form also keeps forward-mode autodiff (``jax.jvp``) working.

Cost: ``O(S²·(n + A))`` per sequence; reverse-mode autodiff keeps a ``[B, S, n]`` memory and a ``[B, S, A]``
tanh for every step, ``O(B·S²·(n + A))`` floats (at the paper's B=80, S=50, n=n'=1000 about 1.6 GB per direction
in float32), which is why it is an option and not the default.

Parameters (:func:`init_intra_params`)::

    {"w_h": [n, A], "w_x": [Din, A], "w_tilde": [n, A], "v": [A], "b": [A]}
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from attn_jax.attention._additive import additive_scores
from attn_jax.attention._checks import (
    check_broadcastable,
    check_min_rank,
    check_padding_mask,
    check_size,
    positive_int,
    shape_str,
)
from attn_jax.attention._masks import combine_masks, make_causal_mask
from attn_jax.attention._softmax import attend
from attn_jax.nn._params import unwrap, wrap
from attn_jax.nn._remat import remat_scan_body
from attn_jax.nn.recurrent import GRUCell, gru_cell, gru_input_projection, linear
from attn_jax.typing import Array, Bool, Float, PRNGKeyArray

__all__ = ["BidirectionalIntraGRU", "IntraGRU", "init_intra_params", "intra_gru_scan"]

_INTRA_KEYS = ("w_h", "w_x", "w_tilde", "v", "b")


def init_intra_params(
    key: PRNGKeyArray, input_features: int, hidden: int, attention_dim: int, *, dtype=jnp.float32
) -> dict[str, Array]:
    r"""Initialise the intra-attention scorer ``vᵀ tanh(W_h h_j + W_x x_t + W_h̃ h̃_{t-1} + b)``.

    .. math:: W_h, W_{\tilde h} \sim \mathcal N(0, 1/n), \quad W_x \sim \mathcal N(0, 1/D_{in}), \quad
        v \sim \mathcal N(0, 1/A), \quad b = 0

    Cheng, Dong & Lapata 2016, section 3.1 (their ``W_h``, ``W_x``, ``W_h̃``, ``v``); fan-in-scaled as the
    core's additive scorer (``attn_jax.attention.init_additive_params``), as the paper gives no initialiser.

    Args:
      key: PRNG key.
      input_features: ``Din``, width of the per-step input ``x_t``.
      hidden: ``n``, the GRU state width (of ``h_j`` and ``h̃_{t-1}``).
      attention_dim: ``A``, the scorer's hidden width.
      dtype: parameter dtype.

    Returns:
      ``{"w_h": [n, A], "w_x": [Din, A], "w_tilde": [n, A], "v": [A], "b": [A]}``.

    >>> p = init_intra_params(jax.random.key(0), 4, 3, 5)
    >>> {k: v.shape for k, v in sorted(p.items())}
    {'b': (5,), 'v': (5,), 'w_h': (3, 5), 'w_tilde': (3, 5), 'w_x': (4, 5)}
    """
    din = positive_int("input_features", input_features)
    n = positive_int("hidden", hidden)
    a = positive_int("attention_dim", attention_dim)
    k_h, k_x, k_t, k_v = jax.random.split(key, 4)
    normal = lambda k, shape, fan_in: (jax.random.normal(k, shape, jnp.float32) / math.sqrt(fan_in)).astype(
        dtype
    )
    return {
        "w_h": normal(k_h, (n, a), n),
        "w_x": normal(k_x, (din, a), din),
        "w_tilde": normal(k_t, (n, a), n),
        "v": normal(k_v, (a,), a),
        "b": jnp.zeros((a,), dtype),
    }


def _check_params(gru_params, intra_params, din: int) -> tuple[int, int]:
    """Check the two param trees against each other and the input width; return ``(n, A)``."""
    missing = [k for k in _INTRA_KEYS if k not in intra_params]
    if missing:
        raise ValueError(f"intra params need {missing}; got keys {sorted(intra_params)}")
    n = jnp.shape(gru_params["u"])[-1]
    a = jnp.shape(intra_params["v"])[0] if jnp.ndim(intra_params["v"]) == 1 else -1
    want = {"w_h": (n, a), "w_x": (din, a), "w_tilde": (n, a), "v": (a,), "b": (a,)}
    for k, shape in want.items():
        if a < 1 or tuple(jnp.shape(intra_params[k])) != shape:
            got = ", ".join(f"{k} {shape_str(intra_params[k])}" for k in _INTRA_KEYS)
            raise ValueError(
                f"intra params must be w_h [n, A], w_x [Din, A], w_tilde [n, A], v [A], b [A] with n = {n} "
                f"(the GRU's) and Din = {din} (the input's); got {got}"
            )
    return n, a


def intra_gru_scan(
    gru_params: dict[str, Array],
    intra_params: dict[str, Array],
    x: Float[Array, "... S Din"],
    mask: Bool[Array, "... S"] | None = None,
    h0: Float[Array, "... n"] | None = None,
    *,
    reverse: bool = False,
    dtype=None,
    return_weights: bool = False,
    remat: str = "none",
):
    r"""A GRU whose previous state is an attention summary of its earlier states (LSTMN-style), as one scan.

    .. math:: \tilde h_t = \sum_{j \in P_t} \operatorname{softmax}_j\big(v^\top \tanh(W_h h_j + W_x x_t +
        W_{\tilde h} \tilde h_{t-1} + b)\big)\, h_j, \qquad h_t = \mathrm{GRU}(x_t, \tilde h_t)

    Cheng, Dong & Lapata 2016 (LSTMN, section 3.1) with the GRU of Bahdanau et al. 2015; ``P_t`` = the real
    positions before ``t`` in scan order (after ``t`` when ``reverse``); ``h̃_t = h_0`` where ``P_t`` is empty.
    See the module docstring for the equations, the padding rule and how this departs from the paper.

    Args:
      gru_params: from ``attn_jax.nn.recurrent.init_gru_params`` (without a context kernel).
      intra_params: from :func:`init_intra_params`.
      x: inputs ``[..., S, Din]``.
      mask: boolean ``[..., S]``, True at real positions; ``None`` = all real. Masked steps carry the state
        and are never attended over.
      h0: initial state ``[..., n]`` (broadcast); default zeros. It is also ``h̃`` where nothing precedes.
      reverse: run from ``S - 1`` down to ``0`` (the backward encoder direction).
      dtype: matmul operand dtype (default float32); states, logits and softmax stay float32.
      return_weights: also return the intra-attention weights.
      remat: the ``jax.checkpoint`` policy of each step (``model.remat``, ``attn_jax.nn._remat``): the
        backward pass then recomputes each step's attention scores instead of keeping them.

    Returns:
      ``(states [..., S, n], final [..., n])`` float32, as ``gru_scan``: ``states[..., t, :]`` is ``h_t``
      (the carried state at masked steps), ``final`` the state after the last real step in scan order. With
      ``return_weights`` also ``weights [..., S, S]`` float32: row ``t`` holds ``s_{t,j}`` (zero outside
      ``P_t``, all zero where ``P_t`` is empty or ``t`` is masked).

    >>> from attn_jax.nn.recurrent import init_gru_params
    >>> g, p = init_gru_params(jax.random.key(0), 4, 3), init_intra_params(jax.random.key(1), 4, 3, 5)
    >>> states, last, w = intra_gru_scan(g, p, jnp.ones((2, 6, 4)), return_weights=True)
    >>> states.shape, last.shape, w.shape
    ((2, 6, 3), (2, 3), (2, 6, 6))
    >>> w[0].sum(-1).round(5).tolist()  # position 0 has nothing to attend over; every later row sums to 1
    [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """
    check_min_rank("x", x, 2)
    check_size("x", x, -1, jnp.shape(gru_params["w_x"])[0], "the GRU's input width (rows of w_x)")
    n, _ = _check_params(gru_params, intra_params, jnp.shape(x)[-1])
    batch, steps = tuple(jnp.shape(x)[:-2]), jnp.shape(x)[-2]
    if mask is None:
        mask = jnp.ones(batch + (steps,), bool)
    if tuple(jnp.shape(mask)) != batch + (steps,):
        want = shape_str(batch + (steps,))
        raise ValueError(f"mask {shape_str(mask)} must be [..., S] = {want} for x {shape_str(x)}")
    check_padding_mask("mask", mask)
    if h0 is not None:
        check_size("h0", h0, -1, n, "the GRU's state width n")
        if check_broadcastable(["h0", "x batch axes + [n]"], [jnp.shape(h0), batch + (n,)]) != batch + (n,):
            raise ValueError(f"h0 {shape_str(h0)} must broadcast to [..., n] = {shape_str(batch + (n,))}")
    dtype = jnp.dtype(jnp.float32 if dtype is None else dtype)
    return _intra_gru_scan(
        gru_params,
        intra_params,
        x,
        mask,
        h0,
        reverse=reverse,
        dtype=dtype,
        return_weights=return_weights,
        remat=remat,
    )


@functools.partial(jax.jit, static_argnames=("reverse", "dtype", "return_weights", "remat"))
def _intra_gru_scan(gru_params, intra_params, x, mask, h0, *, reverse, dtype, return_weights, remat):
    """:func:`intra_gru_scan` after its checks; one compiled program even when called eagerly."""
    n, a = jnp.shape(gru_params["u"])[-1], jnp.shape(intra_params["v"])[0]
    batch, steps = tuple(jnp.shape(x)[:-2]), jnp.shape(x)[-2]
    # One flat batch axis inside the scan: [N, S, ...].
    rows = math.prod(batch)
    x = jnp.reshape(x, (rows, steps, jnp.shape(x)[-1]))
    mask = jnp.reshape(jnp.asarray(mask), (rows, steps))
    h0 = (
        jnp.zeros((rows, n), jnp.float32)
        if h0 is None
        else jnp.reshape(jnp.broadcast_to(jnp.asarray(h0, jnp.float32), batch + (n,)), (rows, n))
    )
    if reverse:  # the backward direction is the forward scan over the time-flipped sequence
        x, mask = x[:, ::-1], mask[:, ::-1]

    p = intra_params
    # The core's additive scorer, with W_h̃ as its query kernel (cast: matmul operands in the compute dtype).
    scorer = {"w_q": p["w_tilde"].astype(dtype), "w_k": p["w_h"], "v": p["v"], "b": p["b"]}
    x_attn = linear(x, p["w_x"], dtype)  # [N, S, A]: W_x x_t for every step, outside the recurrence
    x_gru = gru_input_projection(gru_params, x, dtype=dtype)  # [N, S, 3, n]
    key_valid = mask[:, None, :]  # [N, 1, S]

    def step(carry, inputs):
        memory, memory_keys, summary_prev, h_prev = carry
        t, xa, xg, real = inputs
        # vᵀ tanh(W_h̃ h̃_{t-1} + [W_h h_j + W_x x_t] + b): W_x x_t is folded into the projected keys.
        scores = additive_scores(
            scorer, summary_prev[:, None, :].astype(dtype), memory_keys + xa[:, None, :], fused=False
        )  # [N, 1, S]
        # Only real positions already written (slots j < t) are keys.
        attend_mask = combine_masks(make_causal_mask(1, steps, offset=t - 1), key_valid)  # [N, 1, S]
        context, weights = attend(scores, memory, attend_mask)
        has_prev = jnp.any(attend_mask[:, 0], axis=-1, keepdims=True)  # [N, 1]
        summary = jnp.where(has_prev, context[:, 0], h0)
        h = jnp.where(real[:, None], gru_cell(gru_params, summary, xg, dtype=dtype), h_prev)
        summary = jnp.where(real[:, None], summary, summary_prev)
        # Slot t of a masked step holds the carried state; it is never a key, so its content does not matter.
        memory = memory.at[:, t].set(h)
        memory_keys = memory_keys.at[:, t].set(linear(h, p["w_h"], dtype))
        weights = jnp.where(real[:, None], weights[:, 0], 0.0)
        return (memory, memory_keys, summary, h), (h, weights if return_weights else None)

    init = (jnp.zeros((rows, steps, n), jnp.float32), jnp.zeros((rows, steps, a), jnp.float32), h0, h0)
    xs = (jnp.arange(steps), jnp.moveaxis(x_attn, 1, 0), jnp.moveaxis(x_gru, 1, 0), jnp.moveaxis(mask, 1, 0))
    (_, _, _, final), (states, weights) = jax.lax.scan(remat_scan_body(step, remat), init, xs)
    states = jnp.moveaxis(states, 0, 1)  # [N, S, n]
    if reverse:
        states = states[:, ::-1]
    out = (jnp.reshape(states, batch + (steps, n)), jnp.reshape(final, batch + (n,)))
    if not return_weights:
        return out
    weights = jnp.moveaxis(weights, 0, 1)  # [N, S(query), S(key)]
    if reverse:
        weights = weights[:, ::-1, ::-1]
    return out + (jnp.reshape(weights, batch + (steps, steps)),)


_INTRA_NAMES = {
    "w_h": ("hidden", "align"),
    "w_tilde": ("hidden", "align"),
    "v": ("align",),
    "b": ("align",),
}


class IntraGRU(nnx.Module):
    """One direction of the intra-attention GRU encoder (see :func:`intra_gru_scan`).

    Holds a ``GRUCell`` (``cell``) and the scorer (``attention``: ``w_h (hidden, align)``,
    ``w_x (input_axis, align)``, ``w_tilde (hidden, align)``, ``v (align,)``, ``b (align,)``).
    """

    def __init__(
        self,
        in_features: int,
        hidden: int,
        attention_dim: int,
        *,
        input_axis: str | None = "embed",
        param_dtype=jnp.float32,
        dtype=None,
        rngs: nnx.Rngs,
    ):
        self.cell = GRUCell(
            in_features, hidden, input_axis=input_axis, param_dtype=param_dtype, dtype=dtype, rngs=rngs
        )
        params = init_intra_params(rngs.params(), in_features, hidden, attention_dim, dtype=param_dtype)
        self.attention = nnx.Dict(wrap(params, {**_INTRA_NAMES, "w_x": (input_axis, "align")}))
        self.hidden = hidden
        self.dtype = dtype

    def __call__(
        self,
        x: Float[Array, "... S Din"],
        mask: Bool[Array, "... S"] | None = None,
        h0: Float[Array, "... n"] | None = None,
        *,
        reverse: bool = False,
        return_weights: bool = False,
        remat: str = "none",
    ):
        """``(states [..., S, n], final [..., n])`` (plus the weights); see :func:`intra_gru_scan`."""
        return intra_gru_scan(
            unwrap(self.cell.params),
            unwrap(self.attention),
            x,
            mask,
            h0,
            reverse=reverse,
            dtype=self.dtype,
            return_weights=return_weights,
            remat=remat,
        )


class BidirectionalIntraGRU(nnx.Module):
    r"""RNNsearch's encoder with intra-attention in both directions: annotations ``h_j = [→h_j; ←h_j]``.

    A drop-in for ``attn_jax.nn.recurrent.BidirectionalGRU`` (same call and outputs). The forward direction
    attends over the earlier positions, the backward one over the later positions it has already read.
    """

    def __init__(
        self,
        in_features: int,
        hidden: int,
        attention_dim: int,
        *,
        input_axis: str | None = "embed",
        param_dtype=jnp.float32,
        dtype=None,
        rngs: nnx.Rngs,
    ):
        kw = dict(input_axis=input_axis, param_dtype=param_dtype, dtype=dtype, rngs=rngs)
        self.forward = IntraGRU(in_features, hidden, attention_dim, **kw)
        self.backward = IntraGRU(in_features, hidden, attention_dim, **kw)
        self.hidden = hidden

    def __call__(
        self, x: Float[Array, "... S Din"], mask: Bool[Array, "... S"] | None = None, *, remat: str = "none"
    ) -> tuple[Float[Array, "... S 2n"], tuple[Float[Array, "... n"], Float[Array, "... n"]]]:
        """Annotations ``[..., S, 2n]`` (float32, exactly 0 at masked positions) and ``(→h_last, ←h_1)``."""
        fwd, fwd_last = self.forward(x, mask, remat=remat)
        bwd, bwd_first = self.backward(x, mask, reverse=True, remat=remat)
        annotations = jnp.concatenate([fwd, bwd], axis=-1)
        if mask is not None:
            # As BidirectionalGRU: a carried state at padding must not be readable by the decoder's scorer.
            annotations = jnp.where(mask[..., None], annotations, 0.0)
        return annotations, (fwd_last, bwd_first)
