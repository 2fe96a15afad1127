"""The Transformer (Vaswani et al. 2017): float64 reference, causality, cached decoding, padding, multi-head,
tied embeddings, dropout, beam search, overfitting, config errors.

Sizes are distinct (B=5, S=7, T=6, L_enc=2, L_dec=3, H=4, K=8, D=32, d_ff=13, C=max_length=9, V_src=17,
V_tgt=19) so a swapped axis cannot pass. Parameters are redrawn with NumPy (kernels N(0, 1/fan_in), biases and
LayerNorm parameters visibly non-trivial) so every parameter matters in the comparisons; the real initialisers
are exercised by the jit-initialised overfitting and naming tests.
"""

import functools
import re

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import optax
import pytest
from flax import nnx

from attn_jax.attention._multihead import multi_head_attention, project_heads, project_output
from attn_jax.attention._softmax import assert_valid_attention_weights
from attn_jax.decoding import beam_search, greedy_decode
from attn_jax.models import RNNConfig, gather_batch, repeat_batch
from attn_jax.models.transformer import (
    Transformer,
    TransformerConfig,
    TransformerDecoderState,
    TransformerDecodingState,
    _dropout,
    _self_attention,
    transformer_base_config,
    transformer_cpu_config,
)
from tests.reference.transformer import f64, layer, mha_ref, transformer_ref
from tests.tolerance import assert_close_f32

B, S, T = 5, 7, 6
LENGTHS = (7, 4, 1, 6, 2)  # a full, a padded and a one-word sentence, ...
VS, VT = 17, 19
D, H, K = 32, 4, 8
SIZES = dict(d_model=D, heads=H, d_ff=13, encoder_layers=2, decoder_layers=3, max_length=9, dropout=0.1)
# Longest float32 summation chains, the reduction lengths when two float32 programs are compared (cached vs full,
# wide vs narrow padding, jit vs eager): an attention sub-layer projects over D, takes logits over K, a softmax and a
# context over S and projects back over H·K = D; an encoder layer adds the FFN (over D and d_ff) and two layer norms
# (mean and variance over D); a decoder layer adds cross-attention and a third norm; the output projects over D.
ATTENTION_REDUCTION = D + K + 2 * S + D
_LAYER = ATTENTION_REDUCTION + D + SIZES["d_ff"] + 2 * 2 * D
ENCODER_REDUCTION = SIZES["encoder_layers"] * _LAYER
MODEL_REDUCTION = ENCODER_REDUCTION + SIZES["decoder_layers"] * (_LAYER + ATTENTION_REDUCTION + 2 * D) + D

# Each variant's norm, positions and sharing; together they cover post-/pre-LN, all three position kinds and
# all three sharing modes. dropout=0.1 everywhere: the model must still be deterministic without a key.
VARIANTS = {
    "post-sinusoidal-untied": dict(norm="post", positions="sinusoidal", share_embeddings="none"),
    "pre-learned-tied": dict(norm="pre", positions="learned", share_embeddings="decoder"),
    "pre-rope-shared": dict(norm="pre", positions="rope", share_embeddings="all"),
    # Press et al. 2022 and Shaw et al. 2018; k = 2 < T - 1 so the clipping is exercised. The relative variant
    # also has grouped-query attention (2 key/value heads for 4 query heads, Ainslie et al. 2023): the relative
    # tables and the shared key/value heads meet in relative_attention and in the KV cache.
    "post-alibi-tied": dict(norm="post", positions="alibi", share_embeddings="decoder"),
    "pre-relative-gqa-untied": dict(
        norm="pre", positions="relative", share_embeddings="none", max_relative_positions=2, num_kv_heads=2
    ),
}


def rel_err(a, b):
    """``max|a - b| / max|b|``: the error relative to the reference's scale."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def config(name, **overrides):
    opts = VARIANTS[name]
    vocab = dict(src_vocab=VT if opts["share_embeddings"] == "all" else VS, tgt_vocab=VT)
    return TransformerConfig(**vocab, **SIZES, **opts).replace(**overrides)


def _random_leaf(path, shape, rng):
    """A random value for the parameter at ``path`` (a tuple of dict keys) with a fan-in-scaled spread."""
    name, parent = path[-1], path[-2] if len(path) > 1 else ""
    if name == "scale":
        return 1.0 + 0.3 * rng.standard_normal(shape)
    if name in ("bias", "b_1", "b_2"):
        return 0.3 * rng.standard_normal(shape)
    if name in ("src_embed", "tgt_embed"):
        return rng.standard_normal(shape) / np.sqrt(shape[-1])
    if name in ("src_positions", "tgt_positions") or parent == "relative":
        return 0.5 * rng.standard_normal(shape)
    if name == "kernel" and parent == "out":  # multi-head output [L, H, K, D]
        fan_in = shape[-3] * shape[-2]
    elif name == "kernel" and parent == "output":  # [D, V]
        fan_in = shape[0]
    elif name == "kernel":  # query/key/value [L, D, H, K]
        fan_in = shape[-3]
    else:  # w_1 [L, D, F], w_2 [L, F, D]
        fan_in = shape[-2]
    return rng.standard_normal(shape) / np.sqrt(fan_in)


def _fill(tree, rng, path=()):
    if isinstance(tree, dict):
        return {k: _fill(v, rng, (*path, k)) for k, v in sorted(tree.items())}
    return jnp.asarray(_random_leaf(path, tree.shape, rng), tree.dtype)


def make_model(cfg, seed=0):
    """``cfg``'s model with every parameter redrawn with NumPy (built abstractly: no eager initialisers)."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    params = _fill(nnx.to_pure_dict(state), np.random.default_rng(seed))
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)


def make_batch(seed=0, lengths=LENGTHS, t=T, src_vocab=VS, tgt_vocab=VT, width=S):
    rng = np.random.default_rng(seed)
    src = rng.integers(3, src_vocab, (len(lengths), width)).astype(np.int32)
    mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
    src = np.where(mask, src, 0)
    tgt_in = rng.integers(3, tgt_vocab, (len(lengths), t)).astype(np.int32)
    tgt_in[:, 0] = 1  # BOS
    return jnp.asarray(src), jnp.asarray(mask), jnp.asarray(tgt_in)


def pure_params(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


class Compiled:
    """A model with jitted teacher forcing, encode+init and decode step; parameters are an argument, so new
    values (perturbations) reuse the compiled programs.

    ``__call__``, ``intermediates`` and ``cross_attention_weights`` are compiled as one program (one
    compilation instead of three; XLA shares their common work).
    """

    def __init__(self, model):
        self.model = model
        self.graphdef, self.state = nnx.split(model)
        g = self.graphdef

        def run(st, *a):
            m = nnx.merge(g, st)
            return m(*a), m.intermediates(*a), m.cross_attention_weights(*a)

        self._run = jax.jit(run)

        def start(st, src, mask, cache_length=None):
            m = nnx.merge(g, st)
            enc = m.encode(src, mask)
            return enc, m.init_decoder_state(enc, cache_length)

        self._start = jax.jit(start, static_argnames="cache_length")
        self._step = jax.jit(lambda st, e, d, y: nnx.merge(g, st).decode_step(e, d, y))
        self._dropout = jax.jit(lambda st, key, *a: nnx.merge(g, st)(*a, dropout_rng=key))

    def forward(self, *args, state=None):
        """``model(src, src_mask, tgt_in)``: ``(logits, attention)``."""
        return self._run(self.state if state is None else state, *args)[0]

    def intermediates(self, *args):
        return self._run(self.state, *args)[1]

    def cross_attention_weights(self, *args):
        return self._run(self.state, *args)[2]

    def forward_with_dropout(self, key, *args):
        return self._dropout(self.state, key, *args)

    def start(self, src, mask, cache_length=None):
        return self._start(self.state, src, mask, cache_length)

    def step(self, enc, dec, prev):
        return self._step(self.state, enc, dec, prev)

    def step_loop(self, src, mask, tokens):
        """Feed ``tokens[:, i]`` one position at a time from an empty cache; ``(logits, attention, state)``."""
        enc, dec = self.start(src, mask)
        logits, attn = [], []
        for i in range(tokens.shape[1]):
            lo, dec, a = self.step(enc, dec, tokens[:, i])
            logits.append(lo)
            attn.append(a)
        return jnp.stack(logits, 1), jnp.stack(attn, 1), dec


@functools.cache
def variant(name):
    """``(compiled model, batch, logits, attention)`` of one variant, computed once per session."""
    cfg = config(name)
    compiled = Compiled(make_model(cfg))
    batch = make_batch(src_vocab=cfg.src_vocab)
    logits, attn = compiled.forward(*batch)
    return compiled, batch, logits, attn


@functools.cache
def model_params(name):
    """The variant's parameters as a plain dict (no compilation)."""
    return pure_params(make_model(config(name)))


@functools.cache
def reference(name):
    compiled, batch, _, _ = variant(name)
    opts = {
        k: v for k, v in VARIANTS[name].items() if k != "num_kv_heads"
    }  # the reference reads G from the kernels
    return transformer_ref(pure_params(compiled.model), *batch, **opts)


# ------------------------------------------------------------------------------------------------- config


def test_presets():
    base = transformer_base_config()
    assert (base.d_model, base.heads, base.d_ff, base.encoder_layers, base.decoder_layers) == (
        512,
        8,
        2048,
        6,
        6,
    )
    assert (base.dropout, base.norm, base.positions, base.src_vocab) == (0.1, "post", "sinusoidal", 37000)
    cpu = transformer_cpu_config(100, 120)
    assert (cpu.d_model, cpu.heads, cpu.encoder_layers, cpu.decoder_layers, cpu.norm) == (64, 4, 2, 2, "pre")
    assert (cpu.src_vocab, cpu.tgt_vocab) == (100, 120)
    assert transformer_base_config(dropout=0.3).dropout == 0.3
    # The paper's base model with a joint 37k vocabulary has ~65M parameters (Table 3); count abstractly.
    shared = transformer_base_config(share_embeddings="all")
    abstract = nnx.eval_shape(lambda: Transformer(shared, rngs=nnx.Rngs(0)))
    n = sum(int(x.size) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert 60e6 < n < 66e6, n


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("d_model", 30, "divisible by heads"),
        ("heads", 0, "heads must be a positive int"),
        ("d_ff", 2.5, "d_ff must be a positive int"),
        ("encoder_layers", 0, "encoder_layers must be a positive int"),
        ("dropout", 1.0, r"dropout must be a number in \[0, 1\)"),
        ("norm", "sandwich", "norm must be one of pre, post"),
        ("positions", "absolute", "positions must be one of"),
        ("max_relative_positions", 0, "max_relative_positions must be a positive int"),
        ("share_embeddings", "encoder", "share_embeddings must be one of"),
        ("dtype", "int8", "dtype must be one of"),
        ("arch", "rnnsearch", "arch must be 'transformer'"),
        ("max_length", -1, "max_length must be a positive int"),
    ],
)
def test_config_errors_are_one_line(field, value, message):
    with pytest.raises(ValueError, match=message) as info:
        TransformerConfig(src_vocab=10, tgt_vocab=10, d_model=32, heads=4).replace(**{field: value})
    assert "\n" not in str(info.value)


def test_config_cross_field_errors():
    with pytest.raises(ValueError, match="joint vocabulary"):
        TransformerConfig(src_vocab=10, tgt_vocab=11, share_embeddings="all")
    with pytest.raises(ValueError, match="rope needs an even head width"):
        TransformerConfig(d_model=12, heads=4, positions="rope")
    with pytest.raises(ValueError, match="sinusoidal positions need an even d_model"):
        TransformerConfig(d_model=9, heads=3)
    assert TransformerConfig(dtype=jnp.bfloat16).dtype == "bfloat16"
    with pytest.raises(ValueError, match="needs a TransformerConfig"):
        Transformer(RNNConfig(), rngs=nnx.Rngs(0))


# ------------------------------------------------------------------------------------- float64 reference


@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_float64_reference(name):
    compiled, batch, logits, attn = variant(name)
    ref = reference(name)
    inter = compiled.intermediates(*batch)
    assert logits.dtype == jnp.float32 and logits.shape == (B, T, config(name).tgt_vocab)
    # float32 vs float64 through 2 + 3 layers: rel 1e-5 of the reference's scale (house rule).
    assert rel_err(logits, ref["logits"]) < 1e-5
    assert rel_err(inter.logits, ref["logits"]) < 1e-5
    assert rel_err(inter.encoder, ref["encoder"]) < 1e-5
    assert rel_err(inter.decoder, ref["decoder"]) < 1e-5
    # Attention weights are probabilities (scale 1): absolute 1e-5.
    np.testing.assert_allclose(inter.cross_attention, ref["cross"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(attn, ref["cross"][:, -1].mean(axis=1), rtol=0, atol=1e-5)
    # The returned attention is over the source axis with padding exactly 0, every head of every layer.
    src_mask = np.asarray(batch[1])
    assert_valid_attention_weights(attn, src_mask[:, None, :])
    assert_valid_attention_weights(inter.cross_attention, src_mask[:, None, None, None, :])
    enc, _ = compiled.start(batch[0], batch[1])
    assert rel_err(enc.memory, ref["memory"]) < 1e-5
    np.testing.assert_array_equal(np.asarray(enc.memory)[~src_mask], 0.0)


def test_cross_attention_weights_method():
    compiled, batch, _, attn = variant("post-sinusoidal-untied")
    heads = compiled.cross_attention_weights(*batch)
    assert heads.shape == (B, SIZES["decoder_layers"], H, T, S)
    # the mean over heads in NumPy vs in the model (which may also fuse the weights differently): float32 rounding
    assert_close_f32(heads[:, -1].mean(axis=1), attn, reduction=MODEL_REDUCTION)
    # Heads differ from one another (otherwise "all heads" would be a trivial broadcast).
    assert float(jnp.max(jnp.abs(heads[:, :, 0] - heads[:, :, 1]))) > 1e-2


# ----------------------------------------------------------------------------------------------- causality


@pytest.mark.parametrize("name", list(VARIANTS))
def test_causal_mask_hides_the_future_in_every_layer(name):
    compiled, batch, _, _ = variant(name)
    src, mask, tgt_in = batch
    base = compiled.intermediates(*batch)
    for j in (2, T - 1):
        changed = np.array(tgt_in)
        changed[:, j] = (changed[:, j] + 5) % VT
        other = compiled.intermediates(src, mask, jnp.asarray(changed))
        # The encoder never sees the target.
        np.testing.assert_array_equal(other.encoder, base.encoder)
        # Positions before j are bit-identical in every decoder layer (masked keys get weight exactly 0).
        np.testing.assert_array_equal(other.decoder[:, :, :j], base.decoder[:, :, :j])
        np.testing.assert_array_equal(other.cross_attention[:, :, :, :j], base.cross_attention[:, :, :, :j])
        np.testing.assert_array_equal(other.logits[:, :j], base.logits[:, :j])
        # ... and position j itself changes in every layer, so the comparison above can fail.
        moved = jnp.max(jnp.abs(other.decoder[:, :, j] - base.decoder[:, :, j]), axis=-1)  # [B, L_dec]
        assert float(jnp.min(moved)) > 1e-3


# ------------------------------------------------------------------------------------------ cached decoding


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cached_decoding_equals_full_recomputation(name):
    compiled, batch, logits, attn = variant(name)
    src, mask, tgt_in = batch
    step_logits, step_attn, state = compiled.step_loop(src, mask, tgt_in)
    # Same float32 arithmetic except the length of the masked key axis (T vs the cache's C): two programs.
    assert_close_f32((step_logits, step_attn), (logits, attn), reduction=MODEL_REDUCTION)
    assert isinstance(state, TransformerDecoderState)
    cache = config(name).max_length
    kv_heads = VARIANTS[name].get("num_kv_heads", H)  # grouped-query attention caches G heads, not H
    assert state.keys.shape == (B, SIZES["decoder_layers"], kv_heads, cache, K)
    np.testing.assert_array_equal(state.position, T)
    # The slots after the last decoded position were never written.
    np.testing.assert_array_equal(state.keys[:, :, :, T:], 0.0)
    assert float(jnp.min(jnp.abs(state.keys[:, :, :, :T]).max(-1))) > 0


def test_decoding_past_the_cache_gives_nan_not_garbage():
    compiled, batch, _, _ = variant("post-sinusoidal-untied")
    src, mask, _ = batch
    enc, dec = compiled.start(src, mask)
    prev = jnp.full((B,), 1, jnp.int32)
    for i in range(SIZES["max_length"] + 1):
        logits, dec, _ = compiled.step(enc, dec, prev)
        assert bool(jnp.all(jnp.isfinite(logits))) == (i < SIZES["max_length"]), i


def _while_bodies(hlo: str) -> list[str]:
    """The text of every computation a ``while`` of the optimised HLO module ``hlo`` runs as its body."""
    names = set(re.findall(r"body=%?([\w.\-]+)", hlo))
    blocks = re.split(r"\n(?=%?[\w.\-]+ \()", hlo)
    return [b for b in blocks if re.match(r"%?([\w.\-]+) \(", b) and re.match(r"%?([\w.\-]+)", b)[1] in names]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="reads XLA:CPU's optimised HLO")
def test_for_decoding_steps_like_the_model_with_stacked_arrays_out_of_the_loop():
    """``for_decoding`` slices the decoder layers and splits the caches per layer once: its steps equal the
    model's bit for bit, and a compiled beam search carries per-layer weights and caches into its loop, not the
    stacked ``[L_dec, D, H, K]`` weights or ``[B·K, L_dec, G, C, K]`` cache that XLA would slice (and copy)
    again at every step. A structural check of the compiled program, not a timing."""
    cfg = config("post-sinusoidal-untied", dropout=0.0, encoder_layers=1)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    src = jnp.asarray(rng.integers(3, VS, (B, S)), jnp.int32)
    mask = jnp.asarray(np.arange(S)[None, :] < rng.integers(2, S + 1, (B, 1)))
    enc = model.encode(src, mask)
    dec = model.init_decoder_state(enc)
    view = model.for_decoding()
    assert view.config is model.config and len(view.layers) == SIZES["decoder_layers"]
    enc_v = view.encode(src, mask)
    dec_v = view.init_decoder_state(enc_v)
    assert isinstance(dec_v, TransformerDecodingState) and len(dec_v.keys) == SIZES["decoder_layers"]
    for _ in range(3):  # three positions, so each step reads what the one before wrote
        prev = jnp.asarray(rng.integers(3, VT, (B,)), jnp.int32)
        (got, dec_v, got_attn), (want, dec, want_attn) = (
            view.decode_step(enc_v, dec_v, prev),
            model.decode_step(enc, dec, prev),
        )
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_attn, want_attn)
        np.testing.assert_array_equal(jnp.stack(dec_v.keys, axis=1), dec.keys)
        np.testing.assert_array_equal(jnp.stack(dec_v.values, axis=1), dec.values)
        np.testing.assert_array_equal(dec_v.position, dec.position)

    from tests.test_decoding import compiled_search_hlo

    beam, length = 2, 6
    hlo = compiled_search_hlo(*nnx.split(model), src, mask, beam_size=beam, length=length)
    stacked = f"f32[{SIZES['decoder_layers']},{D},{H},{K}]"
    cache = f"f32[{B * beam},{SIZES['decoder_layers']},{H},{length},{K}]"
    bodies = _while_bodies(hlo)
    assert bodies, "no while loop found in the compiled search"
    assert not [b for b in bodies if stacked in b], f"a decode loop carries the stacked weights {stacked}"
    assert not [b for b in bodies if cache in b], f"a decode loop carries the stacked cache {cache}"
    per_layer = f"f32[{B * beam},{H},{length},{K}]"
    assert [b for b in bodies if per_layer in b], f"no decode loop carries a per-layer cache {per_layer}"
    # Nor does a step transpose a loop-invariant [D, H, K] projection kernel into another layout.
    blocks = {re.match(r"%?([\w.\-]+)", b)[1]: b for b in re.split(r"\n(?=%?[\w.\-]+ \()", hlo)}
    called = {name for b in bodies for name in re.findall(r"calls=%?([\w.\-]+)", b)}
    kernel = f"f32[{D},{H},{K}]"
    moved = [n for n in called if kernel in blocks.get(n, "") and "transpose(" in blocks.get(n, "")]
    assert not moved, f"a decode step transposes a {kernel} kernel: {moved}"


def _zeroing_fusions(hlo: str, shapes: tuple[str, ...]) -> list[str]:
    """Names of the fusions a ``while`` body of ``hlo`` calls that select between an operand and float zeros
    into one of ``shapes``: the zeroing of unread key/value rows that :func:`dot_product_attention` does."""
    blocks = {re.match(r"%?([\w.\-]+)", b)[1]: b for b in re.split(r"\n(?=%?[\w.\-]+ \()", hlo)}
    called = {name for b in _while_bodies(hlo) for name in re.findall(r"calls=%?([\w.\-]+)", b)}
    found = []
    for name in called:
        block = blocks.get(name, "")
        zero = re.search(r"(%[\w.\-]+) = f32\[\] constant\(0\)", block)
        if zero is None:
            continue
        selects = re.findall(r"= (f32\[[\d,]+\])\{[\d,]*\} select\(([^)]*)\)", block)
        zeros = {zero[1]} | set(
            re.findall(rf"(%[\w.\-]+) = f32\[[\d,]+\]\{{[\d,]*\}} broadcast\({zero[1]}\)", block)
        )
        if any(shape in shapes and zeros & {a.strip() for a in args.split(",")} for shape, args in selects):
            found.append(name)
    return found


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="reads XLA:CPU's optimised HLO")
def test_for_decoding_zeroes_padding_once_not_at_every_step():
    """``for_decoding``'s ``encode`` zeroes the padded cross-attention keys and values once, and its cache is
    zero past each position. So a compiled beam search does not zero them again inside its loop, as
    ``dot_product_attention`` does for every layer at every step. Its steps still equal the model's, bit for
    bit (the test above). A structural check of the compiled program, not a timing."""
    model = make_model(config("post-sinusoidal-untied", dropout=0.0, encoder_layers=1))  # random biases
    rng = np.random.default_rng(1)
    lengths = np.array([S, 2, 5, 1, 4])
    src = jnp.asarray(rng.integers(3, VS, (B, S)), jnp.int32)
    mask = jnp.asarray(np.arange(S)[None, :] < lengths[:, None])
    full = model.encode(src, mask).keys  # [B, L_dec, 2, G, S, K]
    view = model.for_decoding().encode(src, mask).keys
    pad = ~np.asarray(mask)
    by_position = np.asarray(full).transpose(0, 4, 1, 2, 3, 5)  # [B, S, L_dec, 2, G, K]
    assert np.abs(by_position[pad]).max() > 0, "the model's own padded keys are zero: nothing to check"
    for i, pair in enumerate(view):
        for j, x in enumerate(pair):
            x = np.asarray(x).transpose(0, 2, 1, 3)  # [B, S, G, K]
            assert (x[pad] == 0).all(), f"layer {i}: padded rows of the {('keys', 'values')[j]} are not zero"
            np.testing.assert_array_equal(x[~pad], by_position[:, :, i, j][~pad])

    from tests.test_decoding import compiled_search_hlo

    beam, length = 2, 6
    hlo = compiled_search_hlo(*nnx.split(model), src, mask, beam_size=beam, length=length)
    shapes = (f"f32[{B * beam},{H},{length},{K}]", f"f32[{B * beam},{H},{S},{K}]")
    assert not _zeroing_fusions(hlo, shapes), (
        f"a decode step zeroes {shapes} rows: {_zeroing_fusions(hlo, shapes)}"
    )


def test_decoder_state_tiles_and_reorders_for_beams():
    """``repeat_batch``/``gather_batch`` on the encoder output and state == decoding the selected rows."""
    compiled, batch, _, _ = variant("pre-rope-shared")
    src, mask, tgt_in = batch
    enc, dec = compiled.start(src, mask)
    _, dec, _ = compiled.step(enc, dec, tgt_in[:, 0])
    rows = jnp.array([4, 4, 0, 2, 1])
    enc2, dec2 = gather_batch(enc, rows), gather_batch(dec, rows)
    got, _, _ = compiled.step(enc2, dec2, tgt_in[rows, 1])
    want, _, _ = compiled.step(enc, dec, tgt_in[:, 1])
    # rows in other batch positions (or repeated) of the same program: float32 rounding at most
    assert_close_f32(got, want[rows], reduction=MODEL_REDUCTION)
    tiled = repeat_batch(dec, 2)
    assert tiled.keys.shape[0] == 2 * B and tiled.position.shape == (2 * B,)


# ----------------------------------------------------------------------------------------------- padding


def test_encoder_invariant_to_padding_content_and_length():
    # The RoPE variant: its positions must not depend on the padded width either.
    compiled, batch, logits, attn = variant("pre-rope-shared")
    src, mask, tgt_in = batch
    enc, _ = compiled.start(src, mask)
    junk = jnp.where(mask, src, jnp.asarray(np.random.default_rng(1).integers(3, VS, src.shape), jnp.int32))
    enc_junk, _ = compiled.start(junk, mask)
    np.testing.assert_array_equal(enc_junk.memory, enc.memory)
    np.testing.assert_array_equal(enc_junk.keys, enc.keys)
    logits_junk, attn_junk = compiled.forward(junk, mask, tgt_in)
    np.testing.assert_array_equal(logits_junk, logits)
    np.testing.assert_array_equal(attn_junk, attn)
    # Three more padding columns: the real positions are unchanged (up to float32 rounding: another program), the
    # new ones are 0.
    wide, wide_mask = jnp.pad(src, ((0, 0), (0, 3))), jnp.pad(mask, ((0, 0), (0, 3)))
    enc_wide, _ = compiled.start(wide, wide_mask)
    assert_close_f32(enc_wide.memory[:, :S], enc.memory, reduction=ENCODER_REDUCTION)
    np.testing.assert_array_equal(enc_wide.memory[:, S:], 0.0)
    real = np.asarray(mask)[:, None, None, None, :, None]  # keys: [B, L_dec, 2, H, S, K]
    assert_close_f32(
        np.where(real, enc_wide.keys[..., :S, :], 0),
        np.where(real, enc.keys, 0),
        reduction=ENCODER_REDUCTION + D,
    )
    # One decoder step from the wide encoding: its attention covers the real words only, as before.
    _, dec = compiled.start(src, mask)
    logits0, _, attn0 = compiled.step(enc, dec, tgt_in[:, 0])
    _, dec_wide = compiled.start(wide, wide_mask)
    logits0_wide, _, attn0_wide = compiled.step(enc_wide, dec_wide, tgt_in[:, 0])
    assert_close_f32((logits0_wide, attn0_wide[:, :S]), (logits0, attn0), reduction=MODEL_REDUCTION)
    np.testing.assert_array_equal(attn0_wide[:, S:], 0.0)


# -------------------------------------------------------------------------------------------- multi-head


@pytest.mark.parametrize("rope", [False, True])
def test_model_attention_is_h_single_heads_concatenated(rope, rng):
    """The model's attention sub-layer (encoder layer 0, its real parameters) == H independent single-head
    attentions in float64, concatenated and projected by W^O. The core's multi_head_attention has the same test
    in isolation (tests/test_multihead.py::test_matches_per_head_reference); this one covers the model's path
    through project_heads / dot_product_attention / project_output, with and without RoPE."""
    p = layer(model_params("post-sinusoidal-untied")["encoder"]["attention"], 0)
    x = jnp.asarray(rng.standard_normal((3, S, D)), jnp.float32)
    valid = np.arange(S)[None, :] < np.array([7, 3, 5])[:, None]
    mask = jnp.asarray(valid)[:, None, None, :]
    out, weights = jax.jit(_self_attention, static_argnums=3)(p, x, mask, rope)
    p64, x64 = f64(p), np.asarray(x, np.float64)
    for b in range(3):
        ref, ref_w = mha_ref(p64, list(x64[b]), list(x64[b]), lambda i, j, b=b: valid[b, j], rope=rope)
        assert rel_err(out[b], ref) < 1e-5
        np.testing.assert_allclose(weights[b], ref_w, rtol=0, atol=1e-6)
    if not rope:  # without RoPE it is exactly the core's multi-head attention with the same parameters
        core = jax.jit(multi_head_attention)(p, x, mask=jnp.asarray(valid)[:, None, :])
        assert_close_f32(out, core, reduction=ATTENTION_REDUCTION)  # two programs


def _project_heads_ref(p, x):
    """``y[..., h, t, k] = Σ_d x[..., t, d] W[d, h, k] + b[h, k]`` with explicit loops (float64)."""
    w, b = np.asarray(p["kernel"], np.float64), np.asarray(p["bias"], np.float64)
    x = np.asarray(x, np.float64)
    *batch, t_len, _ = x.shape
    h_count, k_width = w.shape[1:]
    out = np.zeros((*batch, h_count, t_len, k_width))
    for idx in np.ndindex(*batch):
        for h in range(h_count):
            for t in range(t_len):
                out[idx + (h, t)] = x[idx + (t,)] @ w[:, h, :] + b[h]
    return out


def _project_output_ref(p, c):
    """``y[..., t, o] = Σ_h Σ_k c[..., h, t, k] W[h, k, o] + b[o]`` with explicit loops (float64)."""
    w, b = np.asarray(p["kernel"], np.float64), np.asarray(p["bias"], np.float64)
    c = np.asarray(c, np.float64)
    *batch, h_count, t_len, _ = c.shape
    out = np.zeros((*batch, t_len, w.shape[-1]))
    for idx in np.ndindex(*batch):
        for t in range(t_len):
            out[idx + (t,)] = sum(c[idx + (h, t)] @ w[h] for h in range(h_count)) + b
    return out


def test_projection_helpers_reference_jit_vmap_grads_and_bf16(rng):
    p = layer(model_params("post-sinusoidal-untied")["encoder"]["attention"], 0)
    x = jnp.asarray(rng.standard_normal((2, 3, 5, D)), jnp.float32)  # two leading batch axes
    c = jnp.asarray(rng.standard_normal((2, 3, H, 5, K)), jnp.float32)
    heads, out = jax.jit(project_heads)(p["query"], x), jax.jit(project_output)(p["out"], c)
    assert heads.shape == (2, 3, H, 5, K) and out.shape == (2, 3, 5, D)
    assert rel_err(heads, _project_heads_ref(p["query"], x)) < 1e-5
    assert rel_err(out, _project_output_ref(p["out"], c)) < 1e-5
    assert_close_f32(project_heads(p["query"], x), heads, reduction=D)  # eager == jit: two programs
    looped = jnp.stack([project_output(p["out"], c[i]) for i in range(2)])
    assert_close_f32(jax.vmap(project_output, (None, 0))(p["out"], c), looped, reduction=H * K)
    # float32 finite differences, eps 1e-3: truncation ~eps² plus rounding ~1e-7/eps, hence 1e-2.
    jax.test_util.check_grads(
        lambda q, xx: project_output(p["out"], project_heads(q, xx[None])), (p["query"], x[0, 0]), 1,
        modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2,
    )  # fmt: skip
    # bf16 inputs: bf16 output from float32 accumulation; the inputs' own rounding (2^-8) bounds the error.
    half = project_heads(p["query"], x.astype(jnp.bfloat16))
    assert half.dtype == jnp.bfloat16
    assert rel_err(half, heads) < 2e-2


def test_projection_helpers_errors(rng):
    p = layer(model_params("post-sinusoidal-untied")["encoder"]["attention"], 0)
    with pytest.raises(ValueError, match="expects 32"):
        project_heads(p["query"], jnp.ones((2, 3, 31)))
    with pytest.raises(ValueError, match="must be floating"):
        project_heads(p["query"], jnp.ones((2, 3, 32), jnp.int32))
    with pytest.raises(ValueError, match=r"\[\.\.\., H, T, K\]"):
        project_output(p["out"], jnp.ones((2, 3, 5, K)))
    with pytest.raises(ValueError, match="kernel"):
        project_heads({"w": p["query"]["kernel"]}, jnp.ones((2, 3, 32)))


# ------------------------------------------------------------------------------------------ tied weights


def with_params(compiled, **top_level):
    """A copy of ``compiled``'s state with some top-level parameters replaced (the original is untouched)."""
    state = nnx.split(nnx.merge(compiled.graphdef, compiled.state))[1]
    nnx.replace_by_pure_dict(state, {**nnx.to_pure_dict(state), **top_level})
    return state


def _count_shape(model, shape):
    return sum(1 for x in jax.tree.leaves(pure_params(model)) if x.shape == shape)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_tied_embeddings_are_one_parameter(name):
    compiled, batch, _, _ = variant(name)
    sharing = VARIANTS[name]["share_embeddings"]
    params = pure_params(compiled.model)
    assert ("kernel" in params["output"]) == (sharing == "none")
    assert ("src_embed" in params) == (sharing != "all")
    assert _count_shape(compiled.model, (VT, D)) == (1 if sharing == "all" else 1 + (VS == VT))
    # Perturb the target-embedding row of a word that occurs in neither tgt_in nor src: only a tied softmax
    # can notice, through that word's logit.
    src, mask, tgt_in = batch
    # Inputs drawn from words 3..8 only (same shapes: no recompilation), so word 18 never occurs.
    src, tgt_in = jnp.where(mask, src % 6 + 3, 0), tgt_in.at[:, 1:].set(tgt_in[:, 1:] % 6 + 3)
    batch, unused = (src, mask, tgt_in), VT - 1
    logits, _ = compiled.forward(*batch)
    table = params["tgt_embed"]
    # A random direction: LayerNorm would erase a constant shift of the row (its mean is subtracted).
    delta = jnp.asarray(np.random.default_rng(2).standard_normal(D), jnp.float32)
    moved, _ = compiled.forward(*batch, state=with_params(compiled, tgt_embed=table.at[unused].add(delta)))
    diff = np.abs(np.asarray(moved) - np.asarray(logits))
    if sharing == "none":
        np.testing.assert_array_equal(diff, 0.0)
    else:
        assert diff[..., unused].min() > 1e-3
        np.testing.assert_array_equal(np.delete(diff, unused, axis=-1), 0.0)
    if sharing == "all":  # the same table embeds the source: a row used there moves the encoder
        used = int(np.asarray(src)[0, 0])
        moved_enc, _ = compiled._start(with_params(compiled, tgt_embed=table.at[used].add(delta)), src, mask)
        base_enc, _ = compiled.start(src, mask)
        assert float(jnp.max(jnp.abs(moved_enc.memory - base_enc.memory))) > 1e-3


# ----------------------------------------------------------------------------------------------- dropout


def test_dropout_is_on_only_with_a_key(key):
    """Without a key the model (dropout=0.1) is deterministic: test_matches_float64_reference compares exactly
    that call with the dropout-free float64 reference. With a key, dropout is random but reproducible."""
    compiled, batch, logits, _ = variant("pre-learned-tied")
    k1, k2 = jax.random.split(key)
    a, attn_a = compiled.forward_with_dropout(k1, *batch)
    a2, _ = compiled.forward_with_dropout(k1, *batch)
    b, _ = compiled.forward_with_dropout(k2, *batch)
    np.testing.assert_array_equal(a, a2)
    assert float(jnp.max(jnp.abs(a - logits))) > 1e-2 and float(jnp.max(jnp.abs(a - b))) > 1e-2
    assert bool(jnp.all(jnp.isfinite(a)))
    # Dropout acts on embeddings and residual branches, never on the attention weights: still distributions.
    assert_valid_attention_weights(attn_a, np.asarray(batch[1])[:, None, :])


def test_dropout_masks_and_scaling(key):
    compiled, _, _, _ = variant("pre-learned-tied")
    enc_keep, dec_keep = compiled.model._keep_masks(key, (B, S), (B, T))
    # The embedding's mask, then one per sub-layer: 2 per encoder layer, 3 per decoder layer.
    assert enc_keep.shape == (1 + 2 * 2, B, S, D) and dec_keep.shape == (1 + 3 * 3, B, T, D)
    dropped = 1 - float(jnp.mean(jnp.concatenate([enc_keep.ravel(), dec_keep.ravel()])))
    assert abs(dropped - 0.1) < 0.01  # 16 480 Bernoulli(0.1) draws: std 0.0023
    assert float(jnp.mean(enc_keep[0] != enc_keep[1])) > 0.1  # independent masks, not one reused
    assert compiled.model._keep_masks(None, (B, S), (B, T)) == (None, None)
    x = jnp.full((B, S, D), 2.0)
    y = _dropout(x, 0.1, enc_keep[0])
    np.testing.assert_allclose(np.unique(np.asarray(y)), [0.0, 2.0 / 0.9], rtol=1e-6)  # inverted dropout
    assert _dropout(x, 0.1, None) is x


# ------------------------------------------------------------------------------------------ beam search


@pytest.mark.slow  # two beam-search compilations: ~20 s of CPU
@pytest.mark.parametrize("name", ["pre-rope-shared", "post-alibi-tied", "pre-relative-gqa-untied"])
def test_beam_search_works_unchanged_and_beam_one_is_greedy(name):
    compiled, batch, _, _ = variant(name)
    model = nnx.merge(compiled.graphdef, compiled.state)
    src, mask, _ = batch
    length = T  # <= the cache (max_length 9); T reuses the compiled teacher-forced program
    greedy = greedy_decode(model, src, mask, max_length=length)
    # A manual argmax loop over decode_step (pad 0 and BOS 1 never produced, </s> 2 forced at the limit).
    enc, dec = compiled.start(src, mask)
    prev, tokens, finished = jnp.full((B,), 1, jnp.int32), [], np.zeros(B, bool)
    for t in range(length):
        logits, dec, _ = compiled.step(enc, dec, prev)
        logits = logits.at[:, :2].set(-jnp.inf)
        if t == length - 1:
            logits = jnp.where(jnp.arange(VT) == 2, logits, -jnp.inf)
        prev = jnp.argmax(logits, -1).astype(jnp.int32)
        tokens.append(np.where(finished, 0, np.asarray(prev)))
        finished |= np.asarray(prev) == 2
    np.testing.assert_array_equal(greedy.tokens[:, 0], np.stack(tokens, 1))

    # Beam search's scores and attention are the teacher-forced model's for the returned words.
    out = beam_search(
        model, src, mask, beam_size=3, num_return=2, max_length=length, length_penalty_alpha=0.0
    )
    for n in range(2):
        words = np.asarray(out.tokens[:, n])
        tgt_in = jnp.asarray(np.concatenate([np.ones((B, 1), np.int32), words[:, :-1]], 1))
        logits, attn = compiled.forward(src, mask, tgt_in)
        logp = jax.nn.log_softmax(logits, -1)
        lengths = np.asarray(out.lengths[:, n])
        valid = np.arange(length)[None, :] < lengths[:, None]
        picked = np.take_along_axis(np.asarray(logp), words[..., None], -1)[..., 0]
        # beam search's cached steps vs the teacher-forced program, then a sum over up to T log-probabilities
        assert_close_f32(
            np.where(valid, picked, 0).sum(1), out.log_probs[:, n], reduction=MODEL_REDUCTION + T
        )
        assert_close_f32(np.where(valid[..., None], attn, 0), out.attention[:, n], reduction=MODEL_REDUCTION)
    assert bool(jnp.all(out.scores[:, 0] >= out.scores[:, 1]))


# ------------------------------------------------------------------------------------ init and training


# A tiny real-initialised model, shared by the init and overfitting tests (one compilation of the initialiser).
TINY = TransformerConfig(
    src_vocab=13,
    tgt_vocab=11,
    d_model=32,
    heads=2,
    d_ff=64,
    encoder_layers=2,
    decoder_layers=1,
    dropout=0.0,
    norm="pre",
    max_length=8,
    share_embeddings="none",
)


@functools.partial(jax.jit, static_argnums=0)
def _init(cfg, key):
    return nnx.split(Transformer(cfg, rngs=nnx.Rngs(key)))[1]


def test_real_init_logical_names_and_scale(key):
    model = nnx.merge(
        nnx.split(nnx.eval_shape(lambda: Transformer(TINY, rngs=nnx.Rngs(0))))[0], _init(TINY, key)
    )
    paths = []
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        names = var.get_metadata()["out_sharding"]
        assert len(names) == var[...].ndim, path
        assert (names[0] == "layers") == (path[0] in ("encoder", "decoder")), path
        assert set(names) <= {"layers", "embed", "heads", "kv", "mlp", "vocab", None}, path
        paths.append(path)
    assert ("output", "kernel") in paths and ("encoder_norm", "scale") in paths
    p = pure_params(model)
    # Embeddings N(0, 1/d): E·√d has unit scale; LayerNorm starts as the identity; layers are drawn separately.
    assert abs(float(jnp.std(p["src_embed"])) * np.sqrt(TINY.d_model) - 1) < 0.1
    np.testing.assert_array_equal(p["decoder"]["ffn_norm"]["scale"], 1.0)
    w = p["encoder"]["ffn"]["w_1"]
    assert float(jnp.max(jnp.abs(w[0] - w[1]))) > 0.1
    # LeCun normal: variance 1/fan_in (fan_in = d_model for W_1; the truncation keeps the variance).
    assert abs(float(jnp.var(w)) * TINY.d_model - 1) < 0.15


def test_bf16_compute_is_close_to_float32():
    compiled, batch, logits, attn = variant("pre-learned-tied")
    half = nnx.merge(nnx.split(make_model(config("pre-learned-tied", dtype="bfloat16")))[0], compiled.state)
    lo, at = jax.jit(lambda m, *a: m(*a))(half, *batch)
    assert lo.dtype == jnp.float32 and at.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(lo)))
    # bf16 operands carry 8 mantissa bits (rel 4e-3 each); through 5 layers the logits drift ~1e-2 relative.
    assert rel_err(lo, logits) < 5e-2
    np.testing.assert_allclose(at, attn, atol=3e-2)


@pytest.mark.slow  # compiling forward + backward + Adam takes ~20 s of CPU; the 300 steps take < 1 s
def test_overfits_eight_pairs(key):
    """A real-initialised tiny pre-LN model memorises 8 sentence pairs with Adam (loss < 0.1 nats/token)."""
    cfg = TINY
    graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))[0]
    params = nnx.to_pure_dict(_init(cfg, key))
    lengths = (5, 3, 6, 2, 4, 6, 1, 5)
    src, mask, tgt = make_batch(seed=3, lengths=lengths, t=7, src_vocab=13, tgt_vocab=11)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    tx = optax.adam(3e-3)

    def loss_fn(params):
        logits, _ = nnx.merge(graphdef, params)(src, mask, tgt_in)
        return optax.softmax_cross_entropy_with_integer_labels(logits, tgt_out).mean()

    @jax.jit
    def train(params, opt_state):  # every step inside one program: no per-step dispatch
        def step(carry, _):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), None, length=300)
        return params, losses

    params, losses = train(params, tx.init(params))
    assert float(losses[0]) > 1.5  # starts near log(11) = 2.4
    assert float(losses[-1]) < 0.1, losses[-5:]


# ---------------------------------------------------------------------------------------------- errors


def test_bad_inputs_raise_one_line_errors():
    compiled, batch, _, _ = variant("pre-learned-tied")
    model = nnx.merge(compiled.graphdef, compiled.state)
    src, mask, tgt_in = batch
    with pytest.raises(ValueError, match="src_mask must be boolean"):
        model(src, mask.astype(jnp.int32), tgt_in)
    with pytest.raises(ValueError, match="tgt_in has batch size 2"):
        model(src, mask, tgt_in[:2])
    with pytest.raises(ValueError, match="learned position table has max_length=9"):
        model(src, mask, jnp.ones((B, 10), jnp.int32))
    enc, dec = compiled.start(src, mask)
    with pytest.raises(ValueError, match=r"prev_tokens must be integer token ids \[B\]"):
        model.decode_step(enc, dec, tgt_in)
    with pytest.raises(ValueError, match="cache_length must be a positive int"):
        model.init_decoder_state(enc, cache_length=0)
    with pytest.raises(ValueError, match="state.keys has shape"):
        model.decode_step(enc, dec._replace(keys=dec.keys[:, :1]), tgt_in[:, 0])
