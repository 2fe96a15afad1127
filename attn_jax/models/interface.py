"""The decoding-step interface every translation model implements (RNNenc, RNNsearch, GNMT, Transformer).

Beam search and greedy decoding (``attn_jax.decoding``) see a model only through four methods::

    enc = model.encode(src, src_mask)                      # once per batch of source sentences
    state = model.init_decoder_state(enc)                  # the decoder's state before the first target word
    logits, state, attn = model.decode_step(enc, state, prev_tokens)   # one target position, [B] -> [B, V]
    logits, attn = model(src, src_mask, tgt_in)            # teacher forcing, all positions (a scan inside)

A model may also define ``for_decoding()``: the searches call it (through :func:`for_decoding`) before their loop
and step what it returns, so work that does not change between steps is done once.

Both ``EncoderOutput`` and the decoder states are pytrees (``NamedTuple``\\ s) whose every array leaf has the
batch as its **leading** axis, so a beam search can tile them to ``B * beam`` rows with :func:`repeat_batch`
and reorder hypotheses with :func:`gather_batch`, whatever the model. Optional fields are ``None`` (an empty
pytree node), never a zero-sized placeholder.

Conventions: ``src``/``tgt_in``/``prev_tokens`` are int32 token ids; ``src_mask`` is boolean, True at real
tokens; ``tgt_in`` is the target shifted right (``tgt_in[:, 0]`` is BOS), so ``logits[:, i]`` predicts
``tgt_out[:, i]`` from ``tgt_in[:, :i + 1]`` only. Logits are float32 and unnormalised; attention weights are
float32 ``[B, S]`` (``[B, T, S]`` from the teacher-forced call), or ``None`` for a model without attention.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol, TypeVar

import jax
import jax.numpy as jnp

from attn_jax.attention._checks import positive_int
from attn_jax.nn._remat import REMAT_POLICIES, remat_scan_body
from attn_jax.typing import Array, Bool, Float, Int

__all__ = [
    "EncoderOutput",
    "RNNDecoderState",
    "Seq2SeqModel",
    "check_source",
    "check_tokens",
    "for_decoding",
    "gather_batch",
    "initial_state",
    "repeat_batch",
]


class EncoderOutput(NamedTuple):
    """What the encoder hands to every decoder step; batch-leading arrays or ``None``.

    Attributes:
      memory: ``[B, S, Dv]`` what attention mixes (RNNsearch: the annotations ``h_j``); ``None`` without
        attention.
      keys: ``[B, S, Dk]`` the step-independent half of the scorer, computed once in ``encode`` (additive:
        ``U_a h_j`` ``[B, S, A]``; dot/general/local-p: the key vectors the query is dotted with); ``None``
        without attention.
      mask: ``[B, S]`` boolean, True at real source tokens.
      summary: ``[B, Dc]`` a fixed-size vector per sentence (RNNsearch: ``←h_1``, which ``s_0`` is computed
        from; RNNenc: the context ``c`` fed to every step); ``None`` if the model has none.
      src_ext: ``[B, S]`` int32, the source in the extended target vocabulary when the model copies source words
        (RNNsearch ``copy=True``); ``None`` otherwise.
    """

    memory: Float[Array, "B S Dv"] | None
    keys: Float[Array, "B S Dk"] | None
    mask: Bool[Array, "B S"]
    summary: Float[Array, "B Dc"] | None
    src_ext: Int[Array, "B S"] | None = None


class RNNDecoderState(NamedTuple):
    """The recurrent decoder's state between steps.

    Attributes:
      hidden: ``s_{i-1}`` ``[B, n]``, float32.
      feed: ``[B, l]`` the previous step's maxout readout ``t_{i-1}`` when Luong-style input feeding is on
        (zeros before the first step); ``None`` otherwise.
      coverage: ``[B, S]`` float32, the attention each source word has received so far, ``Σ_{i'<i} α_{i'}``,
        when the model has coverage (zeros before the first step); ``None`` otherwise.
    """

    hidden: Float[Array, "B n"]
    feed: Float[Array, "B l"] | None
    coverage: Float[Array, "B S"] | None = None


StateT = TypeVar("StateT")


class Seq2SeqModel(Protocol[StateT]):
    """The step interface (structural: any model with these methods qualifies)."""

    def encode(self, src: Int[Array, "B S"], src_mask: Bool[Array, "B S"]) -> EncoderOutput:
        """Run the encoder once per source batch; precompute everything step-independent."""
        ...

    def init_decoder_state(self, enc: EncoderOutput) -> StateT:
        """The decoder state before the first target token."""
        ...

    def decode_step(
        self, enc: EncoderOutput, state: StateT, prev_tokens: Int[Array, " B"]
    ) -> tuple[Float[Array, "B V"], StateT, Float[Array, "B S"] | None]:
        """One target position: ``(logits [B, V] float32, new state, attention [B, S] or None)``."""
        ...

    def __call__(
        self, src: Int[Array, "B S"], src_mask: Bool[Array, "B S"], tgt_in: Int[Array, "B T"]
    ) -> tuple[Float[Array, "B T V"], Float[Array, "B T S"] | None]:
        """Teacher forcing: ``(logits [B, T, V] float32, attention [B, T, S] or None)``."""
        ...


def initial_state(model: Any, enc: EncoderOutput, length: int) -> Any:
    """The decoder state before the first of at most ``length`` steps.

    A model whose ``init_decoder_state`` takes ``cache_length`` (the Transformer) gets a cache of exactly
    ``length`` slots. A step then attends ``length`` slots, not the model's ``max_length``, which a
    checkpoint's 512 positions would make many times slower. Other models take no such argument.
    """
    import inspect

    if "cache_length" in inspect.signature(model.init_decoder_state).parameters:
        return model.init_decoder_state(enc, cache_length=length)
    return model.init_decoder_state(enc)


def for_decoding(model: Any) -> Any:
    """``model`` as a decoding loop should step it: ``model.for_decoding()`` where the model defines one.

    Call it inside the traced search, before the loop. The Transformer slices its stacked decoder weights there
    once; other models are returned as they are.
    """
    prepare = getattr(model, "for_decoding", None)
    return model if prepare is None else prepare()


def repeat_batch(tree: Any, n: int) -> Any:
    """Repeat each leaf ``n`` times on its leading (batch) axis: row ``b`` becomes rows ``b·n .. b·n+n-1``.

    Tiles an ``EncoderOutput`` or decoder state over beams (``B -> B * beam``), the hypotheses of one sentence
    adjacent.

    >>> repeat_batch({"x": jnp.array([1, 2])}, 3)["x"]
    Array([1, 1, 1, 2, 2, 2], dtype=int32)
    """
    n = positive_int("repeat count", n)
    return jax.tree.map(lambda x: jnp.repeat(x, n, axis=0), tree)


def gather_batch(tree: Any, indices: Int[Array, " N"]) -> Any:
    """Select rows ``indices`` along every leaf's leading (batch) axis (reorders beam hypotheses).

    >>> gather_batch({"x": jnp.array([10, 20, 30])}, jnp.array([2, 2, 0]))["x"]
    Array([30, 30, 10], dtype=int32)
    """
    return jax.tree.map(lambda x: jnp.take(x, indices, axis=0), tree)


def check_source(src, src_mask) -> None:
    """Raise a one-line ``ValueError`` unless ``src`` is integer ``[B, S]`` and ``src_mask`` bool like it."""
    src_dtype, mask_dtype = jnp.asarray(src).dtype, jnp.asarray(src_mask).dtype
    if jnp.ndim(src) != 2 or not jnp.issubdtype(src_dtype, jnp.integer):
        raise ValueError(
            f"src must be integer token ids [B, S], got {src_dtype} of shape {list(jnp.shape(src))}"
        )
    if jnp.shape(src_mask) != jnp.shape(src) or mask_dtype != jnp.bool_:
        raise ValueError(
            f"src_mask must be boolean [B, S] like src {list(jnp.shape(src))}, got {mask_dtype} "
            f"of shape {list(jnp.shape(src_mask))}"
        )


def check_tokens(name: str, tokens, batch: int, rank: int) -> None:
    """Raise unless ``tokens`` are integers with ``rank`` axes and ``batch`` rows (``[B, T]`` or ``[B]``)."""
    shape = list(jnp.shape(tokens))
    if jnp.ndim(tokens) != rank or not jnp.issubdtype(jnp.asarray(tokens).dtype, jnp.integer):
        what = "[B, T]" if rank == 2 else "[B]"
        raise ValueError(
            f"{name} must be integer token ids {what}, got {jnp.asarray(tokens).dtype} of shape {shape}"
        )
    if shape[0] != batch:
        raise ValueError(f"{name} has batch size {shape[0]} (shape {shape}) but the source batch has {batch}")


def check_remat(where: str, remat: str) -> None:
    """Raise a one-line ``ValueError`` unless ``remat`` names a :data:`REMAT_POLICIES` entry."""
    if remat not in REMAT_POLICIES:
        raise ValueError(f"{where}: remat must be one of {', '.join(REMAT_POLICIES)}; got {remat!r}")


_LAYER_PARAMS: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("layer_params", default=None)


@contextlib.contextmanager
def layer_params_hook(fn: Callable) -> Iterator[None]:
    """Trace the models with ``fn`` applied to each layer's parameters inside their scans over layers.

    ``fn`` takes and returns one layer's slice of the stacked parameters, an ``nnx.State`` of ``nnx.Param``s (or a
    whole stack, where a model projects every layer at once). The trainer's fully sharded strategy passes a
    function that gathers it (``jax.lax.with_sharding_constraint``): each layer's weights are then whole only
    while it runs. Models stay free of mesh code; outside this context the scans take their slices as they are.
    """
    token = _LAYER_PARAMS.set(fn)
    try:
        yield
    finally:
        _LAYER_PARAMS.reset(token)


def layer_params(params):
    """``params`` (one layer's slice, inside a scan over layers) through the ambient :func:`layer_params_hook`."""
    fn = _LAYER_PARAMS.get()
    return params if fn is None else fn(params)


# The Transformer's name for it: each layer is the body of a scan over layers.
remat_layer = remat_scan_body
