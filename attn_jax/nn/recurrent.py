"""The GRU and the maxout deep output of Bahdanau et al. (2015), as pure functions plus NNX modules.

The GRU is the paper's "gated hidden unit" (Cho et al. 2014; Bahdanau, Cho & Bengio 2015, appendix A.1.1/A.2):

.. math::
    z_i = \\sigma(W_z x_i + U_z h_{i-1} + C_z c_i + b_z), \\quad
    r_i = \\sigma(W_r x_i + U_r h_{i-1} + C_r c_i + b_r),

    \\tilde h_i = \\tanh(W x_i + U [r_i \\circ h_{i-1}] + C c_i + b), \\quad
    h_i = (1 - z_i) \\circ h_{i-1} + z_i \\circ \\tilde h_i

— the reset gate multiplies the *previous state before* ``U`` (appendix A.2.1 and A.2.2), not ``U h`` (the
cuDNN / PyTorch variant), and the optional context ``c_i`` enters all three pre-activations (the decoder,
A.2.2). The paper omits biases "to make the equations less cluttered"; they are kept here (its released code,
GroundHog, has them).

Parameter layout (kernels are ``[in, gate, out]`` with gates ordered ``(z, r, candidate)``)::

    {"w_x": [Din, 3, n], "u": [n, 3, n], "b": [3, n]}  (+ "w_c": [Dc, 3, n] when there is a context)

Initialisation as the paper's appendix B.1: every ``n × n`` block of ``u`` a random orthogonal matrix, ``w_x``
and ``w_c`` from ``N(0, 0.01²)``, biases zero.

Numerics (the models' mixed-precision policy): matmul operands are cast to the compute ``dtype`` (e.g.
bfloat16) and accumulated in float32 (``preferred_element_type``); the recurrent state, the gates and the
nonlinearities stay in float32, because a bf16 state would be rounded once per time step and drift over a
50-word sentence.

Sequences are processed by ``jax.lax.scan`` over the time axis, never a Python loop; padding is honoured by
*carrying* the state through masked steps (``h_i = h_{i-1}`` where ``mask_i`` is False), so a backward scan
over a right-padded sentence starts at the sentence's true last word and the final carry of a forward scan
is the state at that word.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attn_jax.attention._checks import check_min_rank, check_padding_mask, check_size, positive_int, shape_str
from attn_jax.nn._params import unwrap, wrap
from attn_jax.nn._remat import remat_scan_body
from attn_jax.typing import Array, Bool, Float, PRNGKeyArray

__all__ = [
    "BidirectionalGRU",
    "GRUCell",
    "MaxoutOutput",
    "gru_cell",
    "gru_input_projection",
    "gru_scan",
    "init_gru_params",
    "init_maxout_params",
    "linear",
    "maxout_logits",
    "maxout_readout",
]

_INPUT_STD = 0.01  # Bahdanau et al. appendix B.1: non-recurrent weights ~ N(0, 0.01²)


def linear(x: Float[Array, "... I"], w: Float[Array, "I ..."], dtype=None) -> Float[Array, "... O"]:
    """``x @ w`` over ``w``'s first axis (any trailing output axes); operands in ``dtype``, float32 result."""
    dtype = jnp.result_type(x) if dtype is None else dtype
    out_axes = "".join("opqr"[: w.ndim - 1])
    return jnp.einsum(
        f"...i,i{out_axes}->...{out_axes}",
        x.astype(dtype),
        w.astype(dtype),
        preferred_element_type=jnp.float32,
    ).astype(jnp.float32)


def init_gru_params(
    key: PRNGKeyArray,
    input_features: int,
    hidden: int,
    *,
    context_features: int | None = None,
    dtype=jnp.float32,
) -> dict[str, Array]:
    r"""Initialise a GRU as in Bahdanau et al. (2015), appendix B.1.

    .. math:: U, U_z, U_r \sim \text{orthogonal}, \quad W_\cdot, C_\cdot \sim \mathcal N(0, 0.01^2),
        \quad b = 0

    Args:
      key: PRNG key.
      input_features: ``Din``, width of the per-step input ``x_i`` (the word embedding ``m``).
      hidden: ``n``, the state width.
      context_features: ``Dc``, width of an extra per-step input ``c_i`` with its own kernel ``C`` (the
        decoder's context); ``None`` for none.
      dtype: parameter dtype.

    Returns:
      ``{"w_x": [Din, 3, n], "u": [n, 3, n], "b": [3, n]}`` plus ``"w_c": [Dc, 3, n]``; gates ``(z, r, h̃)``.

    >>> p = init_gru_params(jax.random.key(0), 4, 3, context_features=6)
    >>> {k: v.shape for k, v in sorted(p.items())}
    {'b': (3, 3), 'u': (3, 3, 3), 'w_c': (6, 3, 3), 'w_x': (4, 3, 3)}
    """
    input_features, hidden = positive_int("input_features", input_features), positive_int("hidden", hidden)
    k_x, k_u, k_c = jax.random.split(key, 3)
    ortho = jax.nn.initializers.orthogonal()
    u = jnp.stack([ortho(k, (hidden, hidden), jnp.float32) for k in jax.random.split(k_u, 3)], axis=1)
    params = {
        "w_x": (_INPUT_STD * jax.random.normal(k_x, (input_features, 3, hidden), jnp.float32)).astype(dtype),
        "u": u.astype(dtype),
        "b": jnp.zeros((3, hidden), dtype),
    }
    if context_features is not None:
        context_features = positive_int("context_features", context_features)
        params["w_c"] = (
            _INPUT_STD * jax.random.normal(k_c, (context_features, 3, hidden), jnp.float32)
        ).astype(dtype)
    return params


def gru_input_projection(
    params: dict[str, Array],
    x: Float[Array, "... Din"] | None,
    context: Float[Array, "... Dc"] | None = None,
    *,
    bias: bool = True,
    dtype=None,
) -> Float[Array, "... 3 n"]:
    r"""The non-recurrent half of every gate pre-activation, ``W_· x + C_· c + b_·``, float32 ``[..., 3, n]``.

    .. math:: a_i = [W_z; W_r; W] x_i + [C_z; C_r; C] c_i + b

    Independent of the previous state, so a scan precomputes it for all time steps at once (one large matmul
    instead of ``T`` small ones) and :func:`gru_cell` adds the recurrent half.

    Args:
      params: from :func:`init_gru_params`.
      x: inputs ``[..., Din]`` (or ``None`` to project only the context).
      context: ``[..., Dc]``; requires ``"w_c"`` in ``params``.
      bias: add ``b`` (False when the caller sums several partial projections, e.g. a precomputed ``W x + b``
        and a per-step ``C c``).
      dtype: matmul operand dtype (default: the input's); the result is float32.

    Returns:
      float32 ``[..., 3, n]`` (gates ``z, r, h̃``).

    >>> p = init_gru_params(jax.random.key(0), 4, 3)
    >>> gru_input_projection(p, jnp.ones((2, 5, 4))).shape
    (2, 5, 3, 3)
    """
    out = jnp.asarray(params["b"], jnp.float32) if bias else jnp.zeros(params["b"].shape, jnp.float32)
    if x is not None:
        check_min_rank("x", x, 1)
        check_size("x", x, -1, params["w_x"].shape[0], "the GRU's input width (rows of w_x)")
        out = out + linear(x, params["w_x"], dtype)
    if context is not None:
        if "w_c" not in params:
            raise ValueError(
                "this GRU has no context kernel w_c (init_gru_params(..., context_features=None))"
            )
        check_size("context", context, -1, params["w_c"].shape[0], "the GRU's context width (rows of w_c)")
        out = out + linear(context, params["w_c"], dtype)
    return out


def gru_cell(
    params: dict[str, Array], h: Float[Array, "... n"], x_proj: Float[Array, "... 3 n"], *, dtype=None
) -> Float[Array, "... n"]:
    r"""One GRU step from the previous state and the precomputed input projection; float32 state.

    .. math:: z = \sigma(a_z + U_z h), \quad r = \sigma(a_r + U_r h), \quad
        \tilde h = \tanh(a_{\tilde h} + U [r \circ h]), \quad h' = (1 - z) \circ h + z \circ \tilde h

    Bahdanau, Cho & Bengio 2015, appendix A.2.1 (encoder) and A.2.2 (decoder, where ``a`` includes ``C c_i``).

    Args:
      params: from :func:`init_gru_params` (uses ``u [n, 3, n]``).
      h: previous state ``[..., n]``.
      x_proj: :func:`gru_input_projection` of this step's input, ``[..., 3, n]``.
      dtype: matmul operand dtype (default float32).

    Returns:
      the new state ``[..., n]``, float32.

    >>> p = init_gru_params(jax.random.key(0), 4, 3)
    >>> gru_cell(p, jnp.zeros(3), gru_input_projection(p, jnp.ones(4))).shape
    (3,)
    """
    u = params["u"]
    n = u.shape[-1]
    check_size("h", h, -1, n, "the GRU's state width n (u's last axis)")
    if jnp.shape(x_proj)[-2:] != (3, n):
        raise ValueError(f"x_proj must be [..., 3, {n}] (gru_input_projection), got {shape_str(x_proj)}")
    dtype = jnp.float32 if dtype is None else dtype
    h = h.astype(jnp.float32)
    x_proj = x_proj.astype(jnp.float32)
    zr = jax.nn.sigmoid(x_proj[..., :2, :] + linear(h, u[:, :2, :], dtype))  # [..., 2, n]
    z, r = zr[..., 0, :], zr[..., 1, :]
    candidate = jnp.tanh(x_proj[..., 2, :] + linear(r * h, u[:, 2, :], dtype))
    return (1.0 - z) * h + z * candidate


def gru_scan(
    params: dict[str, Array],
    x_proj: Float[Array, "... T 3 n"],
    mask: Bool[Array, "... T"] | None = None,
    h0: Float[Array, "... n"] | None = None,
    *,
    reverse: bool = False,
    dtype=None,
    remat: str = "none",
) -> tuple[Float[Array, "... T n"], Float[Array, "... n"]]:
    r"""Run :func:`gru_cell` over the time axis with ``jax.lax.scan``; masked steps carry the state unchanged.

    .. math:: h_i = \begin{cases} \mathrm{GRU}(h_{i-1}, a_i) & m_i \\ h_{i-1} & \neg m_i \end{cases}, \qquad
        h_0 = 0 \text{ (the paper's initial state)}

    With ``reverse=True`` the scan runs from ``T-1`` down to ``0`` (the backward encoder RNN ``←h``); because
    masked steps are skipped, it starts at each sentence's true last token whatever the padding.

    Args:
      params: from :func:`init_gru_params`.
      x_proj: input projections ``[..., T, 3, n]`` (:func:`gru_input_projection` of the whole sequence).
      mask: boolean ``[..., T]``, True for real tokens; ``None`` = all real.
      h0: initial state ``[..., n]``; default zeros.
      reverse: scan backwards in time.
      dtype: matmul operand dtype.
      remat: the ``jax.checkpoint`` policy of each step (``model.remat``, ``attn_jax.nn._remat``): the
        backward pass then keeps each step's state and recomputes its gates; ``"none"`` keeps them all.

    Returns:
      ``(states [..., T, n], final [..., n])``, float32. ``states[..., i, :]`` is the state after step ``i``
      (the carried state at masked steps); ``final`` is the state after the last unmasked step in scan order.

    >>> p = init_gru_params(jax.random.key(0), 4, 3)
    >>> states, last = gru_scan(p, gru_input_projection(p, jnp.ones((2, 5, 4))))
    >>> states.shape, last.shape
    ((2, 5, 3), (2, 3))
    """
    check_min_rank("x_proj", x_proj, 3)
    n = params["u"].shape[-1]
    if jnp.shape(x_proj)[-2:] != (3, n):
        raise ValueError(f"x_proj must be [..., T, 3, {n}] (gru_input_projection), got {shape_str(x_proj)}")
    batch, steps = jnp.shape(x_proj)[:-3], jnp.shape(x_proj)[-3]
    if mask is None:
        mask = jnp.ones(batch + (steps,), bool)
    if jnp.shape(mask) != batch + (steps,):
        want = shape_str(batch + (steps,))
        raise ValueError(f"mask {shape_str(mask)} must be [..., T] = {want} for x_proj {shape_str(x_proj)}")
    check_padding_mask("mask", mask)
    h0 = (
        jnp.zeros(batch + (n,), jnp.float32)
        if h0 is None
        else jnp.broadcast_to(h0, batch + (n,)).astype(jnp.float32)
    )

    def step(h, inputs):
        a, m = inputs
        h = jnp.where(m[..., None], gru_cell(params, h, a, dtype=dtype), h)
        return h, h

    # Time to the front for the scan: [T, ..., 3, n] and [T, ...].
    xs = (jnp.moveaxis(x_proj, -3, 0), jnp.moveaxis(mask, -1, 0))
    final, states = jax.lax.scan(remat_scan_body(step, remat), h0, xs, reverse=reverse)
    return jnp.moveaxis(states, 0, -2), final


def init_maxout_params(
    key: PRNGKeyArray,
    state_features: int,
    embed_features: int,
    context_features: int,
    maxout_features: int,
    vocab_size: int,
    *,
    dtype=jnp.float32,
) -> dict[str, Array]:
    """Initialise the deep output: ``{"u_o": [n, l, 2], "v_o": [m, l, 2], "c_o": [Dc, l, 2], "b_o": [l, 2],
    "w_o": [l, V], "b_w": [V]}``, kernels ``N(0, 0.01²)``, biases zero (appendix B.1).

    ``[..., l, 2]`` holds the paper's ``2l`` pre-maxout units, each maxout pair adjacent (``2j-1, 2j``).

    >>> init_maxout_params(jax.random.key(0), 4, 3, 6, 5, 11)["w_o"].shape
    (5, 11)
    """
    ks = jax.random.split(key, 4)
    normal = lambda k, shape: (_INPUT_STD * jax.random.normal(k, shape, jnp.float32)).astype(dtype)  # noqa: E731
    return {
        "u_o": normal(ks[0], (state_features, maxout_features, 2)),
        "v_o": normal(ks[1], (embed_features, maxout_features, 2)),
        "c_o": normal(ks[2], (context_features, maxout_features, 2)),
        "b_o": jnp.zeros((maxout_features, 2), dtype),
        "w_o": normal(ks[3], (maxout_features, vocab_size)),
        "b_w": jnp.zeros((vocab_size,), dtype),
    }


def maxout_readout(
    params: dict[str, Array],
    state: Float[Array, "... n"],
    embedding: Float[Array, "... m"],
    context: Float[Array, "... Dc"],
    *,
    dtype=None,
) -> Float[Array, "... l"]:
    r"""The deep-output hidden layer ``t_i`` of Bahdanau et al. (2015), appendix A.2.2; float32.

    .. math:: \tilde t_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i + b_o, \qquad
        t_i = \big[\max\{\tilde t_{i,2j-1}, \tilde t_{i,2j}\}\big]_{j=1}^{l}

    Args:
      params: from :func:`init_maxout_params`.
      state: the decoder state the paper uses, ``s_{i-1}``, ``[..., n]``.
      embedding: ``E y_{i-1}``, ``[..., m]``.
      context: ``c_i``, ``[..., Dc]``.
      dtype: matmul operand dtype.

    Returns:
      ``t_i``, float32 ``[..., l]``.
    """
    pre = (
        linear(state, params["u_o"], dtype)
        + linear(embedding, params["v_o"], dtype)
        + linear(context, params["c_o"], dtype)
        + jnp.asarray(params["b_o"], jnp.float32)
    )  # [..., l, 2]: the 2l units with each maxout pair adjacent
    return jnp.max(pre, axis=-1)


def maxout_logits(
    params: dict[str, Array], readout: Float[Array, "... l"], *, dtype=None
) -> Float[Array, "... V"]:
    r"""Unnormalised output scores ``W_o t_i + b`` (``p(y_i | ·) = softmax(W_o t_i)``, A.2.2); float32."""
    return linear(readout, params["w_o"], dtype) + jnp.asarray(params["b_w"], jnp.float32)


_GRU_NAMES = {"u": ("hidden_in", None, "hidden"), "b": (None, "hidden"), "w_c": ("context", None, "hidden")}


class GRUCell(nnx.Module):
    """A GRU of Bahdanau et al. (2015) (reset gate before ``U``) with an optional per-step context input.

    Logical axis names: ``w_x (input_axis, None, hidden)``, ``u (hidden_in, None, hidden)``,
    ``b (None, hidden)``, ``w_c (context, None, hidden)``. ``dtype`` is the compute dtype of the matmuls (the
    state stays float32).
    """

    def __init__(
        self,
        in_features: int,
        hidden: int,
        *,
        context_features: int | None = None,
        input_axis: str | None = "embed",
        param_dtype=jnp.float32,
        dtype=None,
        rngs: nnx.Rngs,
    ):
        params = init_gru_params(
            rngs.params(), in_features, hidden, context_features=context_features, dtype=param_dtype
        )
        names = {"w_x": (input_axis, None, "hidden"), **_GRU_NAMES}
        self.params = nnx.Dict(wrap(params, {k: names[k] for k in params}))
        self.hidden = hidden
        self.dtype = dtype

    def project_inputs(
        self,
        x: Float[Array, "... Din"] | None,
        context: Float[Array, "... Dc"] | None = None,
        *,
        bias: bool = True,
    ) -> Float[Array, "... 3 n"]:
        """``W x + C c + b`` for every gate (see :func:`gru_input_projection`)."""
        return gru_input_projection(unwrap(self.params), x, context, bias=bias, dtype=self.dtype)

    def __call__(self, h: Float[Array, "... n"], x_proj: Float[Array, "... 3 n"]) -> Float[Array, "... n"]:
        """One step (see :func:`gru_cell`)."""
        return gru_cell(unwrap(self.params), h, x_proj, dtype=self.dtype)

    def scan(
        self,
        x_proj: Float[Array, "... T 3 n"],
        mask: Bool[Array, "... T"] | None = None,
        h0: Float[Array, "... n"] | None = None,
        *,
        reverse: bool = False,
        remat: str = "none",
    ) -> tuple[Float[Array, "... T n"], Float[Array, "... n"]]:
        """A whole sequence (see :func:`gru_scan`)."""
        return gru_scan(unwrap(self.params), x_proj, mask, h0, reverse=reverse, dtype=self.dtype, remat=remat)


class BidirectionalGRU(nnx.Module):
    r"""The RNNsearch encoder's recurrence: a forward and a backward GRU, annotations ``h_j = [→h_j; ←h_j]``.

    Bahdanau et al. 2015, section 3.2 and appendix A.2.1 (the two directions share the word embedding, which
    is the caller's, and nothing else).
    """

    def __init__(
        self,
        in_features: int,
        hidden: int,
        *,
        input_axis: str | None = "embed",
        param_dtype=jnp.float32,
        dtype=None,
        rngs: nnx.Rngs,
    ):
        kw = dict(input_axis=input_axis, param_dtype=param_dtype, dtype=dtype, rngs=rngs)
        self.forward = GRUCell(in_features, hidden, **kw)
        self.backward = GRUCell(in_features, hidden, **kw)
        self.hidden = hidden

    def __call__(
        self, x: Float[Array, "... S Din"], mask: Bool[Array, "... S"] | None = None, *, remat: str = "none"
    ) -> tuple[Float[Array, "... S 2n"], tuple[Float[Array, "... n"], Float[Array, "... n"]]]:
        """Annotations ``[..., S, 2n]`` (float32, exactly 0 at masked positions) and the final states;
        ``remat`` checkpoints each step (see :func:`gru_scan`).

        Returns:
          ``(annotations, (forward_last, backward_first))``: ``forward_last`` is ``→h`` at each sentence's
          last real token, ``backward_first`` is ``←h_1``, the backward state at its first real token (what
          the RNNsearch decoder's ``s_0 = tanh(W_s ←h_1)`` reads).
        """
        fwd, fwd_last = self.forward.scan(self.forward.project_inputs(x), mask, remat=remat)
        bwd, bwd_first = self.backward.scan(self.backward.project_inputs(x), mask, reverse=True, remat=remat)
        annotations = jnp.concatenate([fwd, bwd], axis=-1)
        if mask is not None:
            # Carried states at padding would be a copy of a real annotation; zero them so nothing downstream
            # (a dot score, a pooled summary) can read a pad position by accident.
            annotations = jnp.where(mask[..., None], annotations, 0.0)
        return annotations, (fwd_last, bwd_first)


class MaxoutOutput(nnx.Module):
    """The deep output with maxout of Bahdanau et al. (2015), appendix A.2.2 (see :func:`maxout_readout`).

    Logical axis names: ``u_o (hidden, mlp, None)``, ``v_o (embed, mlp, None)``, ``c_o (context, mlp, None)``,
    ``b_o (mlp, None)``, ``w_o (mlp, vocab)``, ``b_w (vocab,)``.
    """

    def __init__(
        self,
        state_features: int,
        embed_features: int,
        context_features: int,
        maxout_features: int,
        vocab_size: int,
        *,
        param_dtype=jnp.float32,
        dtype=None,
        rngs: nnx.Rngs,
    ):
        params = init_maxout_params(
            rngs.params(),
            state_features,
            embed_features,
            context_features,
            maxout_features,
            vocab_size,
            dtype=param_dtype,
        )
        names = {
            "u_o": ("hidden", "mlp", None),
            "v_o": ("embed", "mlp", None),
            "c_o": ("context", "mlp", None),
            "b_o": ("mlp", None),
            "w_o": ("mlp", "vocab"),
            "b_w": ("vocab",),
        }
        self.params = nnx.Dict(wrap(params, names))
        self.dtype = dtype

    def readout(
        self, state: Float[Array, "... n"], embedding: Float[Array, "... m"], context: Float[Array, "... Dc"]
    ) -> Float[Array, "... l"]:
        """``t_i`` (see :func:`maxout_readout`)."""
        return maxout_readout(unwrap(self.params), state, embedding, context, dtype=self.dtype)

    def logits(self, readout: Float[Array, "... l"]) -> Float[Array, "... V"]:
        """``W_o t_i + b``, float32."""
        return maxout_logits(unwrap(self.params), readout, dtype=self.dtype)
