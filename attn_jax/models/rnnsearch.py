"""RNNsearch: the attention-based encoder–decoder of Bahdanau, Cho & Bengio (2015), appendix A.

Encoder (A.2.1). Source words are embedded (``E x_j``, width ``m``) and read by a forward and a backward GRU
(``n`` units each, the embedding shared, nothing else); the annotation of word ``j`` is ``h_j = [→h_j; ←h_j]``
(``2n``). Padding is skipped by the recurrences (the backward GRU starts at each sentence's true last word)
and annotations at padding are zero.

Decoder (A.2.2), at target position ``i`` with previous word ``y_{i-1}`` and state ``s_{i-1}``::

    s_0 = tanh(W_s ←h_1 + b_s)                              ←h_1: the backward state at the first word
    c_i = Σ_j α_ij h_j,  α_i = softmax_j(score(s_{i-1}, h_j))  attention reads s_{i-1}
    s_i = GRU(s_{i-1}; E y_{i-1}, c_i)                      s̃_i = tanh(W E y_{i-1} + U[r_i ∘ s_{i-1}] + C c_i)
    t_i = maxout_2(U_o s_{i-1} + V_o E y_{i-1} + C_o c_i)   deep output, l units
    p(y_i | y_<i, x) = softmax(W_o t_i)

Scorers (``RNNConfig.scorer``), all reading the query ``s_{i-1}`` and normalised over the source with padding
masked, by a softmax as in the paper or, with ``RNNConfig.normalizer``, by sparsemax (Martins & Astudillo 2016) or
1.5-entmax (Peters et al. 2019), which can give source words exactly zero weight:

* ``additive`` — the paper's ``v_aᵀ tanh(W_a s_{i-1} + U_a h_j)``; ``U_a h_j`` is computed once in
  :meth:`encode`.
* ``normed_additive`` — the same with weight-normalised ``v_a`` (tf/nmt ``normed_bahdanau``).
* ``general`` — Luong's ``s_{i-1}ᵀ W h_j`` with ``W [n, 2n]``; ``W h_j`` is computed once in :meth:`encode`.
* ``dot`` — Luong's parameter-free ``s_{i-1}ᵀ k_j``. Luong's dot needs keys as wide as the query, but the
  annotations are ``2n`` wide and the state ``n``; the keys are the *sum* of the two directions,
  ``k_j = →h_j + ←h_j`` (OpenNMT's ``brnn_merge="sum"``), so ``dot`` stays parameter-free and distinct from
  ``general``. The context still mixes the full ``h_j``.
* ``local-p`` — Luong's predictive local attention with the general score: centre
  ``p_i = (S_len - 1)·sigmoid(v_pᵀ tanh(W_p s_{i-1}))``, window ``±D``, Gaussian ``σ = D/2`` (its weights do
  not sum to 1, by design; see ``attn_jax.attention._local``). ``S_len`` is the number of real source tokens,
  so the source must be left-aligned (right padding).

Luong input feeding (``input_feeding=True``). Luong et al. (2015, §3.3) feed the previous *attentional vector*
``h̃_{t-1}`` — the vector the previous word was predicted from — into the next step's recurrence alongside
``y_{t-1}``. Here that vector is the maxout readout ``t_{i-1}`` (the only input of the output softmax), so the
decoder GRU becomes ``s_i = GRU(s_{i-1}; [E y_{i-1}; t_{i-1}], c_i)`` with an extra kernel ``W_f [l, 3, n]``
(``t_0 = 0``); the word and its readout are paired as in Luong. Because Bahdanau's query is ``s_{i-1}``, the
fed vector reaches the attention one step later than in Luong's design (where the query is the state computed
*from* the fed input); it is the closest wiring that keeps the paper's query and every scorer's widths
unchanged. Note that Bahdanau's GRU already receives ``c_i``, which is why Luong et al. call the two designs
similar.

Intra-attention encoder (``intra_attention=True``; off by default, which leaves the model exactly as above).
Both encoder GRUs become LSTMN-style intra-attention GRUs (Cheng, Dong & Lapata 2016, with the GRU in place of
their LSTM; ``attn_jax.nn.intra``): at word ``j`` the previous state is replaced by an additive-attention summary
of the states the direction has already produced, ``→h̃_j = Σ_{k<j} s_{jk} →h_k`` (the backward direction
attends over ``←h_k``, ``k > j``), and ``→h_j = GRU(E x_j, →h̃_j)``; the scores are
``vᵀ tanh(W_h h_k + W_x E x_j + W_h̃ h̃_{j-1} + b)`` with width ``n'`` (``align``), one scorer per direction.
Padding is neither read nor attended; the annotations, ``←h_1`` and the decoder are unchanged in form.

Coverage (``coverage=True``; off by default, which leaves the model exactly as above). Tu et al. (2016) and See,
Liu & Manning (2017, eq. 11): the decoder state carries ``c_i = Σ_{i'<i} α_{i'}`` (``c_1 = 0``; beam search
reorders it with the rest of the state), and the additive score becomes ``v_aᵀ tanh(W_a s_{i-1} + U_a h_j +
w_c c_ij + b)``, so a source word that has been attended to can be scored down; the trainer's coverage loss
(``lambda_coverage``, :func:`attn_jax.train.coverage_loss`) makes re-attending cost. Additive scorers only.

Copy (``copy=True``; off by default, which leaves the model exactly as above). The pointer-generator of See, Liu &
Manning (2017, eq. 8-9): ``p_gen = σ(w_hᵀ c_i + w_sᵀ s_{i-1} + w_xᵀ E y_{i-1} + b)`` reads the same three
vectors as the deep output (Bahdanau's readout predicts ``y_i`` from ``s_{i-1}``, where See et al.'s decoder
reads its new state), and ``P(w) = p_gen P_vocab(w) + (1 − p_gen) Σ_{j: x_j = w} α_ij`` over the target
vocabulary extended by the sentence's out-of-vocabulary source words
(:func:`attn_jax.pointer_generator_log_probs`); ``w_h, w_s, w_x ~ N(0, 0.01²)``, ``b = 0``, so ``p_gen`` starts
near 1/2. Teacher forcing then needs ``src_ext``, the source in that extended vocabulary (``E = V + S``: a
sentence has at most ``S`` distinct source words), and returns log-probabilities instead of logits; so does
:meth:`decode_step` with ``encode(src, src_mask, src_ext)``, reading a copied word (id ``>= V``) back as ``<unk>``.

Where the paper is silent or this code departs from it: biases are kept (GRU, ``b_s``, ``b_o``, output bias;
the paper omits them from its equations); the deep output reads ``s_{i-1}`` exactly as appendix A.2.2 writes
it (section 3.1's ``g(y_{i-1}, s_i, c_i)`` would read ``s_i``); the scorers' parameters are initialised by
the attention core: fan-in-scaled normals by default, the paper's ``W_a, U_a ~ N(0, 0.001²)``, ``v_a = 0`` with
``RNNConfig.attention_init="paper"`` (additive scorer; the demo's recipe); everything else follows appendix B.1 (orthogonal recurrent matrices, ``N(0, 0.01²)`` elsewhere, zero biases).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attn_jax.attention import _local, _luong
from attn_jax.attention._copy import pointer_generator_log_probs
from attn_jax.attention._normalizers import attend_normalized
from attn_jax.models.interface import EncoderOutput, RNNDecoderState, check_source, check_tokens
from attn_jax.models.presets import RNNConfig
from attn_jax.nn._params import partitioned, unwrap, wrap
from attn_jax.nn._remat import remat_scan_body
from attn_jax.nn.attention import AdditiveAttention
from attn_jax.nn.intra import BidirectionalIntraGRU
from attn_jax.nn.recurrent import BidirectionalGRU, GRUCell, MaxoutOutput, linear
from attn_jax.typing import Array, Bool, Float, Int

__all__ = ["RNNsearch", "make_embedding"]

_STD = 0.01  # appendix B.1: "any other weight matrix" ~ N(0, 0.01²)


def make_embedding(vocab: int, features: int, *, param_dtype, dtype, rngs: nnx.Rngs) -> nnx.Embed:
    """A word-embedding table ``E [V, m]`` (logical axes ``vocab, embed``), ``N(0, 0.01²)`` (appendix B.1)."""
    init = nnx.with_partitioning(nnx.initializers.normal(_STD), ("vocab", "embed"), eager_sharding=False)
    return nnx.Embed(vocab, features, dtype=dtype, param_dtype=param_dtype, embedding_init=init, rngs=rngs)


def normal_param(key, shape: tuple[int, ...], names: tuple[str | None, ...], dtype) -> nnx.Param:
    """An ``N(0, 0.01²)`` kernel annotated with logical axis ``names``."""
    return partitioned((_STD * jax.random.normal(key, shape, jnp.float32)).astype(dtype), names)


UNK_ID = 3  # <unk> in attn_jax.data's special-id layout (models do not import data)


def _check_src_ext(copy: bool, src, src_ext) -> None:
    """Raise unless ``src_ext`` is given exactly to a copy model, with ``src``'s shape."""
    if copy != (src_ext is not None):
        raise ValueError(
            f"src_ext (the source in the extended vocabulary) is needed exactly by a copy model; copy={copy}, "
            f"src_ext {'given' if src_ext is not None else 'not given'}"
        )
    if src_ext is not None and jnp.shape(src_ext) != jnp.shape(src):
        raise ValueError(
            f"src_ext must have src's shape {list(jnp.shape(src))}, got {list(jnp.shape(src_ext))}"
        )


class RNNsearch(nnx.Module):
    """Bahdanau et al. (2015) RNNsearch with a selectable scorer; implements the step interface of
    ``attn_jax.models.interface``.

    >>> from attn_jax.models.presets import RNNConfig
    >>> cfg = RNNConfig(src_vocab=11, tgt_vocab=13, embed=4, hidden=6, maxout=3, align=5)
    >>> model = RNNsearch(cfg, rngs=nnx.Rngs(0))
    >>> logits, attn = model(jnp.ones((2, 7), jnp.int32), jnp.ones((2, 7), bool), jnp.ones((2, 3), jnp.int32))
    >>> logits.shape, attn.shape
    ((2, 3, 13), (2, 3, 7))
    """

    def __init__(self, config: RNNConfig, *, rngs: nnx.Rngs):
        if config.arch != "rnnsearch":
            raise ValueError(f"RNNsearch needs config.arch == 'rnnsearch', got {config.arch!r}")
        self.config = config
        m, n, lo = config.embed, config.hidden, config.maxout
        pd, cd = jnp.dtype(config.param_dtype), jnp.dtype(config.dtype)
        self.src_embed = make_embedding(config.src_vocab, m, param_dtype=pd, dtype=cd, rngs=rngs)
        self.tgt_embed = make_embedding(config.tgt_vocab, m, param_dtype=pd, dtype=cd, rngs=rngs)
        if config.intra_attention:
            self.encoder = BidirectionalIntraGRU(m, n, config.align, param_dtype=pd, dtype=cd, rngs=rngs)
        else:
            self.encoder = BidirectionalGRU(m, n, param_dtype=pd, dtype=cd, rngs=rngs)
        self.init_state = nnx.Dict(
            w_s=normal_param(rngs.params(), (n, n), ("hidden_in", "hidden"), pd),
            b_s=partitioned(jnp.zeros((n,), pd), ("hidden",)),
        )
        self.decoder = GRUCell(m, n, context_features=2 * n, param_dtype=pd, dtype=cd, rngs=rngs)
        self.feed_kernel = nnx.data(
            normal_param(rngs.params(), (lo, 3, n), ("mlp", None, "hidden"), pd)
            if config.input_feeding
            else None
        )
        self.output = MaxoutOutput(n, m, 2 * n, lo, config.tgt_vocab, param_dtype=pd, dtype=cd, rngs=rngs)
        attention, score = None, None
        if config.scorer in ("additive", "normed_additive"):
            attention = AdditiveAttention(
                n,
                2 * n,
                config.align,
                normalize=config.scorer == "normed_additive",
                init=config.attention_init,
                normalizer=config.normalizer,
                coverage=config.coverage,
                param_dtype=pd,
                rngs=rngs,
            )
        elif config.scorer in ("general", "local-p"):
            params = {"general": _luong.init_general_params(rngs.params(), n, 2 * n, pd)}
            names = {"general": {"w": ("hidden", "context")}}
            if config.scorer == "local-p":
                params["position"] = _local.init_local_p_params(rngs.params(), n, config.align, pd)
                names["position"] = {"w_p": ("hidden", "align"), "v_p": ("align",)}
            score = nnx.Dict(wrap(params, names))
        self.copy_gate = nnx.data(
            nnx.Dict(
                w_h=normal_param(rngs.params(), (2 * n,), ("context",), pd),
                w_s=normal_param(rngs.params(), (n,), ("hidden",), pd),
                w_x=normal_param(rngs.params(), (m,), ("embed",), pd),
                b=partitioned(jnp.zeros((), pd), ()),
            )
            if config.copy
            else None
        )
        self.attention = nnx.data(attention)  # AdditiveAttention or None
        self.score = nnx.data(score)  # general / local-p parameters or None

    # ----------------------------------------------------------------------------------------------- encoder

    def encode(
        self, src: Int[Array, "B S"], src_mask: Bool[Array, "B S"], src_ext: Int[Array, "B S"] | None = None
    ) -> EncoderOutput:
        """Annotations ``h_j`` ``[B, S, 2n]`` (compute dtype), the scorer's precomputed keys and ``←h_1`` (and,
        for a copy model, ``src_ext``: the source in the extended target vocabulary, which decoding needs)."""
        check_source(src, src_mask)
        _check_src_ext(self.config.copy, src, src_ext)
        annotations, (_, backward_first) = self.encoder(
            self.src_embed(src), src_mask, remat=self.config.remat
        )
        memory = annotations.astype(self.config.dtype)
        enc = EncoderOutput(memory=memory, keys=self._keys(memory), mask=src_mask, summary=backward_first)
        return enc if src_ext is None else enc._replace(src_ext=jnp.asarray(src_ext, jnp.int32))

    def _keys(self, memory: Float[Array, "B S 2n"]) -> Float[Array, "B S Dk"]:
        """The step-independent half of the score, computed once per source batch."""
        scorer, n = self.config.scorer, self.config.hidden
        if self.attention is not None:
            return self.attention.project_keys(memory)  # U_a h_j: [B, S, A]
        if scorer == "dot":
            return memory[..., :n] + memory[..., n:]  # →h_j + ←h_j: [B, S, n]
        w = unwrap(self.score)["general"]["w"]  # [n, 2n]; general_scores' W_a h̄_s, hoisted out of the steps
        return jnp.einsum("bse,de->bsd", memory, w.astype(memory.dtype), preferred_element_type=jnp.float32)

    # ----------------------------------------------------------------------------------------------- decoder

    def init_decoder_state(self, enc: EncoderOutput) -> RNNDecoderState:
        """``s_0 = tanh(W_s ←h_1 + b_s)`` (and ``t_0 = 0`` with input feeding, a zero coverage with coverage)."""
        p = unwrap(self.init_state)
        s0 = jnp.tanh(linear(enc.summary, p["w_s"], self.config.dtype) + p["b_s"].astype(jnp.float32))
        feed = (
            jnp.zeros(s0.shape[:-1] + (self.config.maxout,), jnp.float32)
            if self.config.input_feeding
            else None
        )
        if not self.config.coverage:
            return RNNDecoderState(hidden=s0, feed=feed)
        return RNNDecoderState(hidden=s0, feed=feed, coverage=jnp.zeros(enc.mask.shape, jnp.float32))

    def _attend(
        self, enc: EncoderOutput, query: Float[Array, "B n"], coverage: Float[Array, "B S"] | None = None
    ) -> tuple[Float[Array, "B 2n"], Float[Array, "B S"]]:
        """``(c_i, α_i)`` for the query ``s_{i-1}`` (and the coverage so far, with coverage)."""
        q = query.astype(self.config.dtype)
        if self.attention is not None:
            if coverage is not None:
                return self.attention.step(q, enc.keys, enc.memory, enc.mask, coverage=coverage)
            return self.attention.step(q, enc.keys, enc.memory, enc.mask)
        mask = enc.mask[:, None, :]  # [B, 1, S]
        scores = _luong.dot_scores(q[:, None, :], enc.keys)  # [B, 1, S]
        if self.config.scorer == "local-p":
            lengths = jnp.sum(enc.mask, axis=-1)  # true lengths of left-aligned sentences
            centers = _local.predictive_centers(
                unwrap(self.score)["position"], q[:, None, :], lengths
            )  # [B, 1]
            ctx, w = _local.local_attention(
                scores,
                enc.memory,
                centers,
                window=self.config.local_window,
                mask=mask,
                gaussian=True,
                return_weights=True,
                normalizer=self.config.normalizer,
            )
        else:
            ctx, w = attend_normalized(scores, enc.memory, mask, normalizer=self.config.normalizer)
        return ctx[:, 0], w[:, 0]

    def _step(
        self,
        enc: EncoderOutput,
        state: RNNDecoderState,
        embedding: Float[Array, "B m"],
        embedding_proj: Float[Array, "B 3 n"],
    ):
        """The recurrent part of one position; the caller precomputes ``embedding_proj = W E y_{i-1} + b``.

        Returns ``(new_state, (s_{i-1}, c_i, α_i, t_i or None))``; ``t_i`` only with input feeding (otherwise
        the readout is computed outside the scan, for all positions at once).
        """
        s_prev = state.hidden
        ctx, weights = self._attend(enc, s_prev, state.coverage)
        x_proj = embedding_proj + self.decoder.project_inputs(None, ctx, bias=False)
        readout = None
        if state.feed is not None:
            x_proj = x_proj + linear(state.feed, self.feed_kernel[...], self.config.dtype)
            readout = self.output.readout(s_prev, embedding, ctx)
        new_state = RNNDecoderState(hidden=self.decoder(s_prev, x_proj), feed=readout)
        if state.coverage is not None:
            new_state = new_state._replace(coverage=state.coverage + weights)
        return new_state, (s_prev, ctx, weights, readout)

    def decode_step(
        self, enc: EncoderOutput, state: RNNDecoderState, prev_tokens: Int[Array, " B"]
    ) -> tuple[Float[Array, "B V"], RNNDecoderState, Float[Array, "B S"]]:
        """One target position: ``(logits [B, V] float32, new state, attention α_i [B, S] float32)``.

        A copy model returns the pointer-generator's log-probabilities ``[B, V + S]`` instead (``enc`` from
        ``encode(..., src_ext)``), and reads a previous token ``>= V`` (a copied word) as ``<unk>``.
        """
        check_tokens("prev_tokens", prev_tokens, enc.mask.shape[0], rank=1)
        if self.config.copy:
            if enc.src_ext is None:
                raise ValueError(
                    "a copy model decodes from encode(src, src_mask, src_ext): enc.src_ext is None"
                )
            # an extended id has no embedding: the copied word is fed back as <unk> (See et al. 2017)
            prev_tokens = jnp.where(prev_tokens >= self.config.tgt_vocab, UNK_ID, prev_tokens)
        emb = self.tgt_embed(prev_tokens)
        new_state, (s_prev, ctx, weights, readout) = self._step(
            enc, state, emb, self.decoder.project_inputs(emb)
        )
        if readout is None:
            readout = self.output.readout(s_prev, emb, ctx)
        logits = self.output.logits(readout)
        if not self.config.copy:
            return logits, new_state, weights
        gate = self.copy_gate_logits(s_prev, emb, ctx)  # [B]
        extended = self.config.tgt_vocab + enc.mask.shape[1]
        log_probs = pointer_generator_log_probs(logits, weights, enc.src_ext, gate, extended, enc.mask)
        return log_probs, new_state, weights

    def copy_gate_logits(
        self, state: Float[Array, "... n"], embedding: Float[Array, "... m"], context: Float[Array, "... 2n"]
    ) -> Float[Array, "..."]:
        """``w_hᵀ c_i + w_sᵀ s_{i-1} + w_xᵀ E y_{i-1} + b``, float32: the logit of ``p_gen`` (See et al., eq. 8)."""
        p = unwrap(self.copy_gate)
        f32 = jnp.float32
        return (
            jnp.einsum("...d,d->...", context, p["w_h"].astype(context.dtype), preferred_element_type=f32)
            + jnp.einsum("...d,d->...", state, p["w_s"].astype(state.dtype), preferred_element_type=f32)
            + jnp.einsum(
                "...d,d->...", embedding, p["w_x"].astype(embedding.dtype), preferred_element_type=f32
            )
            + p["b"].astype(f32)
        )

    def __call__(
        self,
        src: Int[Array, "B S"],
        src_mask: Bool[Array, "B S"],
        tgt_in: Int[Array, "B T"],
        src_ext: Int[Array, "B S"] | None = None,
    ) -> tuple[Float[Array, "B T V"], Float[Array, "B T S"]]:
        """Teacher forcing: float32 ``(logits [B, T, V], attention [B, T, S])`` via one ``lax.scan``.

        With ``copy``, ``src_ext`` (the source in the extended target vocabulary, ids ``< V + S``) is required
        and the first output is the pointer-generator's log-probabilities ``[B, T, V + S]``.
        """
        _check_src_ext(self.config.copy, src, src_ext)
        check_source(src, src_mask)
        check_tokens("tgt_in", tgt_in, src.shape[0], rank=2)
        enc = self.encode(src, src_mask, src_ext)
        emb = self.tgt_embed(tgt_in)  # [B, T, m]
        emb_proj = self.decoder.project_inputs(emb)  # [B, T, 3, n]: every W E y_{i-1} + b in one matmul

        def body(state, xs):
            return self._step(enc, state, *xs)

        xs = (jnp.moveaxis(emb, 1, 0), jnp.moveaxis(emb_proj, 1, 0))  # time-major
        body = remat_scan_body(body, self.config.remat)  # a step's attention is recomputed, not kept
        _, (s_prev, ctx, weights, readout) = jax.lax.scan(body, self.init_decoder_state(enc), xs)
        s_prev, ctx, weights = (jnp.moveaxis(x, 0, 1) for x in (s_prev, ctx, weights))  # [B, T, ...]
        if readout is None:
            readout = self.output.readout(s_prev, emb, ctx)  # all positions at once, outside the recurrence
        else:
            readout = jnp.moveaxis(readout, 0, 1)
        logits = self.output.logits(readout)
        if not self.config.copy:
            return logits, weights
        gate = self.copy_gate_logits(s_prev, emb, ctx)  # [B, T]
        extended = self.config.tgt_vocab + src.shape[1]
        log_probs = pointer_generator_log_probs(
            logits, weights, src_ext[:, None, :], gate, extended, src_mask[:, None, :]
        )
        return log_probs, weights
