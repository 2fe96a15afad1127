"""Flax NNX modules around the pure attention functions: they own parameters and call ``attn_jax.attention``.

Each module builds its parameters with the core's ``init_*`` function (one definition of every shape and
initialiser), wraps them in ``nnx.Param``s annotated with logical axis names (``hidden``, ``align``, ``embed``,
``heads``, ``kv``), and on every call hands the plain pytree back to the functional core. No attention math lives here.
"""

from __future__ import annotations

from typing import Literal

import jax.numpy as jnp
from flax import nnx

from attn_jax.attention import _additive, _dot_product, _local, _luong, _masks, _multihead, _padding
from attn_jax.attention._normalizers import attend_normalized, check_normalizer
from attn_jax.nn._params import unwrap, wrap
from attn_jax.typing import Array, Bool, Float, Int


class AdditiveAttention(nnx.Module):
    """Bahdanau et al. (2015) additive attention ``e_ij = vᵀ tanh(W_q s_i + W_k h_j + b)``; normed with ``normalize``.

    ``project_keys`` once per source sentence, then ``step`` (one query, inside a scan) or ``__call__`` (all queries).
    ``fused=True`` (the default) scores with ``attn_jax.fused_additive_scores``, whose backward recomputes the tanh
    instead of saving a ``[..., T, S, A]`` tensor (one ``[B, S, A]`` per step of a decoder scan); ``fused=False`` is
    the plain autodiff of the formula (use it for forward-mode ``jax.jvp``). ``normalizer`` turns the scores into
    weights: ``"softmax"`` (default), ``"sparsemax"`` or ``"entmax15"`` (``attn_jax.masked_normalize``).
    ``coverage=True`` adds the coverage weight ``w_c`` (See et al. 2017): every call then takes the accumulated
    attention ``coverage`` (``attn_jax.additive_attention``).
    """

    def __init__(
        self,
        query_features: int,
        key_features: int,
        attention_dim: int,
        *,
        use_bias: bool = True,
        normalize: bool = False,
        fused: bool = True,
        init: str = "fan_in",
        normalizer: str = "softmax",
        coverage: bool = False,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.fused = fused
        self.normalizer = check_normalizer(normalizer)
        params = _additive.init_additive_params(
            rngs.params(),
            query_features,
            key_features,
            attention_dim,
            use_bias=use_bias,
            normalize=normalize,
            init=init,
            coverage=coverage,
            dtype=param_dtype,
        )
        names = {
            "w_q": ("hidden", "align"),
            "w_k": ("context", "align"),
            "v": ("align",),
            "b": ("align",),
            "g": (),
            "w_c": ("align",),
        }
        self.params = nnx.Dict(wrap(params, {k: names[k] for k in params}))

    def project_keys(self, keys: Float[Array, "... S Dk"]) -> Float[Array, "... S A"]:
        """``W_k h``: computed once per source sentence, reused at every decoder step."""
        return _additive.project_keys(unwrap(self.params), keys)

    def __call__(
        self,
        query: Float[Array, "... T Dq"],
        keys: Float[Array, "... S Dk"],
        values: Float[Array, "... S Dv"] | None = None,
        mask: Bool[Array, "... T S"] | None = None,
        *,
        projected_keys: Float[Array, "... S A"] | None = None,
        return_weights: bool = False,
        coverage: Float[Array, "... T S"] | None = None,
    ):
        """All queries at once; see ``attn_jax.additive_attention``."""
        return _additive.additive_attention(
            unwrap(self.params),
            query,
            keys,
            values,
            mask,
            projected_keys=projected_keys,
            return_weights=return_weights,
            fused=self.fused,
            normalizer=self.normalizer,
            coverage=coverage,
        )

    def step(
        self,
        query: Float[Array, "... Dq"],
        projected_keys: Float[Array, "... S A"],
        values: Float[Array, "... S Dv"],
        mask: Bool[Array, "... S"] | None = None,
        *,
        coverage: Float[Array, "... S"] | None = None,
    ) -> tuple[Float[Array, "... Dv"], Float[Array, "... S"]]:
        """One decoder step: ``(context, weights)`` for a single query against all keys (and the coverage)."""
        return _additive.additive_attention_step(
            unwrap(self.params),
            query,
            projected_keys,
            values,
            mask,
            fused=self.fused,
            normalizer=self.normalizer,
            coverage=coverage,
        )


class DotProductAttention(nnx.Module):
    """Parameter-free scaled dot-product attention ``softmax(QKᵀ·scale)V`` (Vaswani et al., 2017).

    ``local_window=(left, right)`` (or one int ``w`` for ``(w, w)``) restricts query ``i`` to keys
    ``i - left <= j <= i + right`` on every call: sliding-window attention, see
    ``attn_jax.dot_product_attention``. ``normalizer`` turns the logits into weights: ``"softmax"`` (default),
    ``"sparsemax"`` or ``"entmax15"`` (``attn_jax.masked_normalize``).
    """

    def __init__(
        self,
        *,
        scale: float | None = None,
        local_window: int | tuple[int, int] | None = None,
        normalizer: str = "softmax",
    ):
        self.scale = scale
        self.local_window = _masks.sliding_window(local_window)
        self.normalizer = check_normalizer(normalizer)

    def __call__(
        self,
        query: Float[Array, "... T K"],
        key: Float[Array, "... S K"],
        value: Float[Array, "... S Kv"],
        mask: Bool[Array, "... T S"] | None = None,
        *,
        return_weights: bool = False,
    ):
        """See ``attn_jax.dot_product_attention``."""
        return _dot_product.dot_product_attention(
            query,
            key,
            value,
            mask,
            scale=self.scale,
            return_weights=return_weights,
            local_window=self.local_window,
            normalizer=self.normalizer,
        )


LuongScore = Literal["dot", "general", "concat", "location"]


class LuongAttention(nnx.Module):
    """Luong, Pham & Manning (2015) global or local attention with a ``dot``/``general``/``concat``/``location`` score.

    ``local=None`` is global attention; ``"m"`` is local-m (centre p_t = t, window ``±window``); ``"p"`` is local-p
    (predicted centre p_t = (S − 1)·sigmoid(v_pᵀ tanh(W_p h_t)) with S the true source length, 0-indexed; the
    paper's S·sigmoid is for 1-indexed positions; Gaussian weighting with σ = window/2).
    The score is chosen once, here; the call path is a plain function per score. ``normalizer`` turns the scores
    into weights (inside the window for local attention): ``"softmax"`` (default), ``"sparsemax"`` or
    ``"entmax15"`` (``attn_jax.masked_normalize``).
    """

    def __init__(
        self,
        query_features: int,
        key_features: int,
        *,
        score: LuongScore = "general",
        attention_dim: int | None = None,
        max_source_length: int | None = None,
        local: Literal["m", "p"] | None = None,
        window: int = 10,
        normalizer: str = "softmax",
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.normalizer = check_normalizer(normalizer)
        if score not in ("dot", "general", "concat", "location"):
            raise ValueError(f"LuongAttention score must be dot, general, concat or location, got {score!r}")
        if local not in (None, "m", "p"):
            raise ValueError(f"LuongAttention local must be None, 'm' or 'p', got {local!r}")
        if score == "dot" and query_features != key_features:
            raise ValueError(
                f"dot score needs query_features == key_features, got {query_features} and {key_features}"
            )
        self.score, self.local, self.window = score, local, window
        attention_dim = attention_dim or query_features
        params, names = {}, {}
        if score == "general":
            params["score"] = _luong.init_general_params(
                rngs.params(), query_features, key_features, param_dtype
            )
            names["score"] = {"w": ("hidden", "context")}
        elif score == "concat":
            params["score"] = _additive.init_additive_params(
                rngs.params(), query_features, key_features, attention_dim, dtype=param_dtype
            )
            names["score"] = {
                "w_q": ("hidden", "align"),
                "w_k": ("context", "align"),
                "v": ("align",),
                "b": ("align",),
            }
        elif score == "location":
            if max_source_length is None:
                raise ValueError("location score needs max_source_length")
            params["score"] = _luong.init_location_params(
                rngs.params(), query_features, max_source_length, param_dtype
            )
            names["score"] = {"w": ("hidden", None)}
        if local == "p":
            params["position"] = _local.init_local_p_params(
                rngs.params(), query_features, attention_dim, param_dtype
            )
            names["position"] = {"w_p": ("hidden", "align"), "v_p": ("align",)}
        self.params = nnx.Dict(wrap(params, names))

    def scores(
        self, query: Float[Array, "... T Dq"], keys: Float[Array, "... S Dk"]
    ) -> Float[Array, "... T S"]:
        """The alignment energies ``score(h_t, h̄_s)`` before normalisation."""
        p = unwrap(self.params)
        if self.score == "dot":
            return _luong.dot_scores(query, keys)
        if self.score == "general":
            return _luong.general_scores(p["score"], query, keys)
        if self.score == "concat":
            return _luong.concat_scores(p["score"], query, keys)
        scores = _luong.location_scores(p["score"], query, keys.shape[-2])
        return jnp.broadcast_to(
            scores, jnp.broadcast_shapes(scores.shape, keys.shape[:-2] + scores.shape[-2:])
        )

    def __call__(
        self,
        query: Float[Array, "... T Dq"],
        keys: Float[Array, "... S Dk"],
        values: Float[Array, "... S Dv"] | None = None,
        mask: Bool[Array, "... T S"] | None = None,
        *,
        source_lengths: Int[Array, "..."] | None = None,
        query_positions: Int[Array, "... T"] | None = None,
        return_weights: bool = False,
    ):
        """Context vectors ``[..., T, Dv]`` (and float32 weights ``[..., T, S]`` when ``return_weights``).

        For local attention, ``source_lengths`` (true lengths, default: the padded length) bound the centres and
        ``query_positions`` (default ``0..T-1``) are the decoder time steps t used by local-m.
        """
        values = keys if values is None else values
        # The scorers see no mask: zero the rows it never reads (padding) so NaN there cannot reach a gradient.
        query = _padding.zero_masked_queries(query, mask)
        keys = _padding.zero_masked_keys(keys, mask)
        values = _padding.zero_masked_keys(values, mask)
        scores = self.scores(query, keys)
        if self.local is None:
            ctx, w = attend_normalized(scores, values, mask, normalizer=self.normalizer)
        else:
            S, T = keys.shape[-2], query.shape[-2]
            lengths = jnp.full(keys.shape[:-2], S) if source_lengths is None else source_lengths
            if self.local == "m":
                centers = _local.monotonic_centers(T, lengths)
                if query_positions is not None:
                    centers = jnp.minimum(query_positions, jnp.asarray(lengths)[..., None] - 1).astype(
                        jnp.float32
                    )
            else:
                centers = _local.predictive_centers(unwrap(self.params)["position"], query, lengths)
            ctx, w = _local.local_attention(
                scores,
                values,
                centers,
                window=self.window,
                mask=mask,
                gaussian=self.local == "p",
                return_weights=True,
                normalizer=self.normalizer,
            )
        return (ctx, w) if return_weights else ctx


class MultiHeadAttention(nnx.Module):
    """Multi-head attention (Vaswani et al., 2017) over ``attn_jax.multi_head_attention``; self or cross.

    Kernels: query ``[D, H, K]``, key/value ``[D, G, K]`` (logical ``embed, heads, kv``), output ``[H, K, D]``.
    ``num_kv_heads=G < H`` is grouped-query attention (Ainslie et al., 2023; ``G = 1`` multi-query), the key and
    value projections shrinking by ``H / G``; ``value_features`` gives the values an input of their own width,
    passed as ``inputs_v`` (PyTorch's ``kdim``/``vdim``). ``normalizer`` turns each head's logits into weights:
    ``"softmax"`` (default), ``"sparsemax"`` or ``"entmax15"`` (``attn_jax.masked_normalize``).
    """

    def __init__(
        self,
        num_heads: int,
        in_features: int,
        *,
        kv_features: int | None = None,
        qkv_features: int | None = None,
        out_features: int | None = None,
        value_features: int | None = None,
        num_kv_heads: int | None = None,
        use_bias: bool = True,
        normalizer: str = "softmax",
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.normalizer = check_normalizer(normalizer)
        params = _multihead.init_multi_head_params(
            rngs.params(),
            num_heads,
            in_features,
            key_features=kv_features,
            qkv_features=qkv_features,
            out_features=out_features,
            use_bias=use_bias,
            dtype=param_dtype,
            value_features=value_features,
            num_kv_heads=num_kv_heads,
        )
        proj = {"kernel": ("embed", "heads", "kv"), "bias": ("heads", "kv")}
        names = {
            "query": proj,
            "key": proj,
            "value": proj,
            "out": {"kernel": ("heads", "kv", "embed"), "bias": ("embed",)},
        }
        self.num_heads = num_heads
        self.params = nnx.Dict(wrap(params, {k: {n: names[k][n] for n in params[k]} for k in params}))

    def __call__(
        self,
        inputs_q: Float[Array, "... T Dq"],
        inputs_kv: Float[Array, "... S Dk"] | None = None,
        mask: Bool[Array, "... T S"] | None = None,
        *,
        inputs_v: Float[Array, "... S Dv"] | None = None,
        return_weights: bool = False,
    ):
        """Self-attention when ``inputs_kv`` is None; ``inputs_v``: the values' own input (see
        ``attn_jax.multi_head_attention``)."""
        return _multihead.multi_head_attention(
            unwrap(self.params),
            inputs_q,
            inputs_kv,
            mask,
            inputs_v=inputs_v,
            return_weights=return_weights,
            normalizer=self.normalizer,
        )
