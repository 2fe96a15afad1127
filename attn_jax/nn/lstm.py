"""The LSTM of GNMT (Wu et al. 2016) as pure functions over a param pytree, plus thin NNX modules.

The cell is the standard LSTM without peepholes (Hochreiter & Schmidhuber 1997; Gers et al. 2000's forget gate;
the ``BasicLSTMCell`` that GNMT and tf/nmt stack), with an optional extra per-step input ``c_t`` (the attention
context GNMT feeds to every decoder layer) entering all four gates through its own kernel:

.. math::
    a_t = W x_t + C c_t + U h_{t-1} + b \\in \\mathbb{R}^{4 \\times n}, \\qquad
    i_t = \\sigma(a_{t,i}), \\; f_t = \\sigma(a_{t,f}), \\; g_t = \\tanh(a_{t,g}), \\; o_t = \\sigma(a_{t,o}),

    c'_t = f_t \\circ c'_{t-1} + i_t \\circ g_t, \\qquad h_t = o_t \\circ \\tanh(c'_t)

(``c'`` is the memory cell, written ``cell`` in code to keep ``c``/``context`` for the attention context).

Parameter layout — kernels ``[in, 4, n]`` with the gates ``(i, f, g, o)`` on their own axis, so that splitting the
output axis ``n`` (logical name ``hidden``) over a tensor-parallel mesh axis splits all four gates of the same
units together::

    {"w_x": [Din, 4, n], "u": [n, 4, n], "b": [4, n]}  (+ "w_c": [Dc, 4, n] with a context input)

Splitting a concatenated input ``[x; c]`` into ``w_x`` and ``w_c`` is exact (``W [x; c] = W_x x + W_c c``) and
lets each block carry its own logical name. A stack of identical layers stores the same dict with a leading
``layers`` axis (:func:`init_lstm_stack_params`, :class:`LSTMStack`).

Initialisation as tf/nmt's GNMT recipe (``init_op="uniform", init_weight=0.1``): every kernel ``U(-0.1, 0.1)``;
biases zero except the forget gate's, which is 1 (tf's ``forget_bias=1.0``, added there as a constant; a
trainable bias initialised to 1 has the same value and the same gradients).

Numerics as :mod:`attn_jax.nn.recurrent`: matmul operands in the compute ``dtype``, accumulated in float32; the
state ``(h, cell)``, the gates and the nonlinearities stay float32. Sequences run under ``jax.lax.scan``;
padding is honoured by carrying the whole state through masked steps, so a backward scan over a right-padded
sentence starts at its true last word.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from attn_jax.attention._checks import check_min_rank, check_padding_mask, check_size, positive_int, shape_str
from attn_jax.nn._params import unwrap, wrap
from attn_jax.nn._remat import remat_scan_body
from attn_jax.nn.recurrent import linear
from attn_jax.typing import Array, Bool, Float, PRNGKeyArray

__all__ = [
    "LSTMCell",
    "LSTMStack",
    "LSTMState",
    "init_lstm_params",
    "init_lstm_stack_params",
    "lstm_cell",
    "lstm_input_projection",
    "lstm_param_names",
    "lstm_scan",
    "zero_lstm_state",
]

INIT_SCALE = 0.1  # tf/nmt GNMT: uniform initialisation in [-0.1, 0.1]
FORGET_BIAS = 1.0  # tf BasicLSTMCell's forget_bias, as tf/nmt uses it
_GATES = 4  # (i, f, g, o)


class LSTMState(NamedTuple):
    """The recurrent state of one LSTM layer (or a stack of them, with a leading layer axis); float32.

    Attributes:
      h: the output ``h_t`` ``[..., n]``.
      cell: the memory cell ``c'_t`` ``[..., n]``.
    """

    h: Float[Array, "... n"]
    cell: Float[Array, "... n"]


def zero_lstm_state(shape: tuple[int, ...], hidden: int) -> LSTMState:
    """``LSTMState`` of float32 zeros ``[*shape, hidden]`` (the initial state).

    >>> zero_lstm_state((2,), 3).h.shape
    (2, 3)
    """
    zeros = jnp.zeros(tuple(shape) + (hidden,), jnp.float32)
    return LSTMState(h=zeros, cell=zeros)


def init_lstm_params(
    key: PRNGKeyArray,
    input_features: int,
    hidden: int,
    *,
    context_features: int | None = None,
    dtype=jnp.float32,
) -> dict[str, Array]:
    r"""Initialise one LSTM layer as tf/nmt's GNMT: kernels ``U(-0.1, 0.1)``, forget bias 1, other biases 0.

    .. math:: W, U, C \sim \mathcal U(-0.1, 0.1), \quad b_i = b_g = b_o = 0, \quad b_f = 1

    Args:
      key: PRNG key.
      input_features: ``Din``, width of the per-step input ``x_t``.
      hidden: ``n``, the state width.
      context_features: ``Dc``, width of an extra per-step input ``c_t`` with its own kernel ``C``; ``None`` for
        none.
      dtype: parameter dtype.

    Returns:
      ``{"w_x": [Din, 4, n], "u": [n, 4, n], "b": [4, n]}`` plus ``"w_c": [Dc, 4, n]``; gates ``(i, f, g, o)``.

    >>> p = init_lstm_params(jax.random.key(0), 5, 3, context_features=7)
    >>> {k: v.shape for k, v in sorted(p.items())}, p["b"][1].tolist()
    ({'b': (4, 3), 'u': (3, 4, 3), 'w_c': (7, 4, 3), 'w_x': (5, 4, 3)}, [1.0, 1.0, 1.0])
    """
    din, n = positive_int("input_features", input_features), positive_int("hidden", hidden)
    if context_features is not None:
        positive_int("context_features", context_features)
    k_x, k_u, k_c = jax.random.split(key, 3)

    def uniform(k, shape):
        return jax.random.uniform(k, shape, jnp.float32, -INIT_SCALE, INIT_SCALE).astype(dtype)

    params = {
        "w_x": uniform(k_x, (din, _GATES, n)),
        "u": uniform(k_u, (n, _GATES, n)),
        "b": jnp.zeros((_GATES, n), jnp.float32).at[1].set(FORGET_BIAS).astype(dtype),
    }
    if context_features is not None:
        params["w_c"] = uniform(k_c, (context_features, _GATES, n))
    return params


def init_lstm_stack_params(
    key: PRNGKeyArray,
    num_layers: int,
    input_features: int,
    hidden: int,
    *,
    context_features: int | None = None,
    dtype=jnp.float32,
) -> dict[str, Array]:
    """``num_layers`` independent :func:`init_lstm_params` layers stacked on a leading ``layers`` axis.

    >>> init_lstm_stack_params(jax.random.key(0), 2, 3, 3)["u"].shape
    (2, 3, 4, 3)
    """
    positive_int("num_layers", num_layers)
    keys = jax.random.split(key, num_layers)
    return jax.vmap(
        lambda k: init_lstm_params(k, input_features, hidden, context_features=context_features, dtype=dtype)
    )(keys)


def lstm_param_names(
    params: dict, *, input_axis: str | None = "embed", stacked: bool = False
) -> dict[str, tuple[str | None, ...]]:
    """Logical axis names of an LSTM's params: ``w_x (input_axis, None, hidden)``, ``u (hidden_in, None, hidden)``,
    ``b (None, hidden)``, ``w_c (context, None, hidden)``; ``stacked`` prepends ``layers``.

    >>> lstm_param_names({"u": None}, stacked=True)
    {'u': ('layers', 'hidden_in', None, 'hidden')}
    """
    names = {
        "w_x": (input_axis, None, "hidden"),
        "u": ("hidden_in", None, "hidden"),
        "b": (None, "hidden"),
        "w_c": ("context", None, "hidden"),
    }
    prefix = ("layers",) if stacked else ()
    return {k: prefix + names[k] for k in params}


def lstm_input_projection(
    params: dict[str, Array],
    x: Float[Array, "... Din"] | None,
    context: Float[Array, "... Dc"] | None = None,
    *,
    bias: bool = True,
    dtype=None,
) -> Float[Array, "... 4 n"]:
    r"""The non-recurrent half of the gate pre-activations, ``W x + C c + b``, float32 ``[..., 4, n]``.

    .. math:: a^{\text{in}}_t = W x_t + C c_t + b

    Independent of the previous state, so a scan can compute it for every step in one matmul and add the
    recurrent half ``U h_{t-1}`` in :func:`lstm_cell`.

    Args:
      params: from :func:`init_lstm_params`.
      x: inputs ``[..., Din]``, or ``None`` to project only the context.
      context: ``[..., Dc]``; needs ``"w_c"`` in ``params``.
      bias: add ``b`` (False when summing partial projections computed at different times).
      dtype: matmul operand dtype (default: the input's); the result is float32.

    Returns:
      float32 ``[..., 4, n]``, gates ``(i, f, g, o)``.

    >>> p = init_lstm_params(jax.random.key(0), 5, 3)
    >>> lstm_input_projection(p, jnp.ones((2, 7, 5))).shape
    (2, 7, 4, 3)
    """
    out = jnp.asarray(params["b"], jnp.float32) if bias else jnp.zeros(jnp.shape(params["b"]), jnp.float32)
    if x is not None:
        check_min_rank("x", x, 1)
        check_size("x", x, -1, params["w_x"].shape[0], "the LSTM's input width (rows of w_x)")
        out = out + linear(x, params["w_x"], dtype)
    if context is not None:
        if "w_c" not in params:
            raise ValueError(
                "this LSTM has no context kernel w_c (init_lstm_params(..., context_features=None))"
            )
        check_size("context", context, -1, params["w_c"].shape[0], "the LSTM's context width (rows of w_c)")
        out = out + linear(context, params["w_c"], dtype)
    return out


def _check_projection(x_proj, n: int, what: str) -> None:
    if jnp.shape(x_proj)[-2:] != (_GATES, n):
        raise ValueError(
            f"x_proj must be {what} with (4, {n}) last (lstm_input_projection), got {shape_str(x_proj)}"
        )


def lstm_cell(
    params: dict[str, Array], state: LSTMState, x_proj: Float[Array, "... 4 n"], *, dtype=None
) -> LSTMState:
    r"""One LSTM step from the previous state and the precomputed input projection; float32 state.

    .. math:: a = a^{\text{in}} + U h, \quad i, f, o = \sigma(a_{i,f,o}), \quad g = \tanh(a_g), \quad
        c' \leftarrow f \circ c' + i \circ g, \quad h = o \circ \tanh(c')

    Hochreiter & Schmidhuber (1997) with a forget gate (Gers et al. 2000), the cell GNMT stacks (Wu et al. 2016,
    §3).

    Args:
      params: from :func:`init_lstm_params` (uses ``u [n, 4, n]``).
      state: previous :class:`LSTMState`, each ``[..., n]``.
      x_proj: :func:`lstm_input_projection` of this step's inputs, ``[..., 4, n]``.
      dtype: matmul operand dtype (default float32).

    Returns:
      the new :class:`LSTMState`, float32.

    >>> p = init_lstm_params(jax.random.key(0), 5, 3)
    >>> lstm_cell(p, zero_lstm_state((), 3), lstm_input_projection(p, jnp.ones(5))).h.shape
    (3,)
    """
    n = params["u"].shape[-1]
    check_size("state.h", state.h, -1, n, "the LSTM's state width n (u's last axis)")
    check_size("state.cell", state.cell, -1, n, "the LSTM's state width n (u's last axis)")
    _check_projection(x_proj, n, "[..., 4, n]")
    h = jnp.asarray(state.h, jnp.float32)
    pre = jnp.asarray(x_proj, jnp.float32) + linear(h, params["u"], jnp.float32 if dtype is None else dtype)
    i, f, o = (jax.nn.sigmoid(pre[..., k, :]) for k in (0, 1, 3))
    cell = f * jnp.asarray(state.cell, jnp.float32) + i * jnp.tanh(pre[..., 2, :])
    return LSTMState(h=o * jnp.tanh(cell), cell=cell)


def lstm_scan(
    params: dict[str, Array],
    x_proj: Float[Array, "... T 4 n"],
    mask: Bool[Array, "... T"] | None = None,
    state0: LSTMState | None = None,
    *,
    reverse: bool = False,
    dtype=None,
    remat: str = "none",
) -> tuple[Float[Array, "... T n"], LSTMState]:
    r"""Run :func:`lstm_cell` over the time axis with ``jax.lax.scan``; masked steps carry the state unchanged.

    .. math:: (h_t, c'_t) = \begin{cases} \mathrm{LSTM}(h_{t-1}, c'_{t-1}; a^{\text{in}}_t) & m_t \\
        (h_{t-1}, c'_{t-1}) & \neg m_t \end{cases}, \qquad h_0 = c'_0 = 0 \text{ by default}

    With ``reverse=True`` the scan runs from ``T-1`` down to ``0`` (GNMT's backward encoder LSTM); because masked
    steps are skipped, it starts at each sentence's true last token whatever the padding.

    Args:
      params: from :func:`init_lstm_params`.
      x_proj: input projections ``[..., T, 4, n]`` (:func:`lstm_input_projection` of the whole sequence).
      mask: boolean ``[..., T]``, True at real tokens; ``None`` = all real.
      state0: initial state, each ``[..., n]``; default zeros.
      reverse: scan backwards in time.
      dtype: matmul operand dtype.
      remat: the ``jax.checkpoint`` policy of each step (``model.remat``, ``attn_jax.nn._remat``): the
        backward pass then keeps each step's state and recomputes its gates; ``"none"`` keeps them all.

    Returns:
      ``(outputs [..., T, n], final state)``, float32; ``outputs[..., t, :]`` is ``h`` after step ``t`` (the
      carried ``h`` at masked steps), ``final`` the state after the last unmasked step in scan order.

    >>> p = init_lstm_params(jax.random.key(0), 5, 3)
    >>> hs, last = lstm_scan(p, lstm_input_projection(p, jnp.ones((2, 7, 5))))
    >>> hs.shape, last.cell.shape
    ((2, 7, 3), (2, 3))
    """
    check_min_rank("x_proj", x_proj, 3)
    n = params["u"].shape[-1]
    _check_projection(x_proj, n, "[..., T, 4, n]")
    batch, steps = jnp.shape(x_proj)[:-3], jnp.shape(x_proj)[-3]
    if mask is None:
        mask = jnp.ones(batch + (steps,), bool)
    if jnp.shape(mask) != batch + (steps,):
        want = shape_str(batch + (steps,))
        raise ValueError(f"mask {shape_str(mask)} must be [..., T] = {want} for x_proj {shape_str(x_proj)}")
    check_padding_mask("mask", mask)
    if state0 is None:
        state0 = zero_lstm_state(batch, n)
    state0 = LSTMState(*(jnp.broadcast_to(s, batch + (n,)).astype(jnp.float32) for s in state0))

    def step(state, inputs):
        a, m = inputs
        new = lstm_cell(params, state, a, dtype=dtype)
        new = LSTMState(*(jnp.where(m[..., None], s1, s0) for s1, s0 in zip(new, state, strict=True)))
        return new, new.h

    # Time to the front for the scan: [T, ..., 4, n] and [T, ...].
    xs = (jnp.moveaxis(x_proj, -3, 0), jnp.moveaxis(jnp.asarray(mask, bool), -1, 0))
    final, outputs = jax.lax.scan(remat_scan_body(step, remat), state0, xs, reverse=reverse)
    return jnp.moveaxis(outputs, 0, -2), final


class LSTMCell(nnx.Module):
    """One LSTM layer (optionally with a per-step context input) owning its params; see :func:`lstm_cell`.

    Logical axis names: ``w_x (input_axis, None, hidden)``, ``u (hidden_in, None, hidden)``, ``b (None, hidden)``,
    ``w_c (context, None, hidden)``. ``dtype`` is the compute dtype of the matmuls (the state stays float32).
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
        params = init_lstm_params(
            rngs.params(), in_features, hidden, context_features=context_features, dtype=param_dtype
        )
        self.params = nnx.Dict(wrap(params, lstm_param_names(params, input_axis=input_axis)))
        self.hidden = hidden
        self.dtype = dtype

    def project_inputs(
        self,
        x: Float[Array, "... Din"] | None,
        context: Float[Array, "... Dc"] | None = None,
        *,
        bias: bool = True,
    ) -> Float[Array, "... 4 n"]:
        """``W x + C c + b`` for every gate (see :func:`lstm_input_projection`)."""
        return lstm_input_projection(unwrap(self.params), x, context, bias=bias, dtype=self.dtype)

    def __call__(self, state: LSTMState, x_proj: Float[Array, "... 4 n"]) -> LSTMState:
        """One step (see :func:`lstm_cell`)."""
        return lstm_cell(unwrap(self.params), state, x_proj, dtype=self.dtype)

    def scan(
        self,
        x_proj: Float[Array, "... T 4 n"],
        mask: Bool[Array, "... T"] | None = None,
        state0: LSTMState | None = None,
        *,
        reverse: bool = False,
        remat: str = "none",
    ) -> tuple[Float[Array, "... T n"], LSTMState]:
        """A whole sequence (see :func:`lstm_scan`)."""
        return lstm_scan(
            unwrap(self.params), x_proj, mask, state0, reverse=reverse, dtype=self.dtype, remat=remat
        )


class LSTMStack(nnx.Module):
    """``num_layers`` identical LSTM layers whose params are stacked on a leading ``layers`` axis.

    Only owns the params (``stacked()`` returns the plain pytree); the caller runs them, e.g. a ``lax.scan`` over
    layers of a ``lax.scan`` over time, or a pipeline over the ``layers`` axis.
    """

    def __init__(
        self,
        num_layers: int,
        in_features: int,
        hidden: int,
        *,
        context_features: int | None = None,
        input_axis: str | None = "hidden_in",
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        params = init_lstm_stack_params(
            rngs.params(),
            num_layers,
            in_features,
            hidden,
            context_features=context_features,
            dtype=param_dtype,
        )
        self.params = nnx.Dict(wrap(params, lstm_param_names(params, input_axis=input_axis, stacked=True)))
        self.num_layers = num_layers
        self.hidden = hidden

    def stacked(self) -> dict[str, Array]:
        """The plain param pytree, every leaf ``[layers, ...]``."""
        return unwrap(self.params)

    def param_state(self) -> nnx.State:
        """The params as an ``nnx.State`` of ``nnx.Param``s, every leaf ``[layers, ...]`` with its logical names."""
        return nnx.state(self, nnx.Param)["params"]
