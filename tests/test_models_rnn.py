"""RNNsearch (Bahdanau et al. 2015) and RNNenc (Cho et al. 2014): the GRU, the encoder, the decoders and the step API.

Sizes are odd and distinct (B=3, S=7, T=5, m=9, n=11, l=3, n'=13, K_x=17, K_y=19) so a swapped axis cannot pass.
Parameters are redrawn from N(0, 0.5²) for the numerical tests: the paper's N(0, 0.01²) initialisation makes every
logit ~1e-5, where a relative comparison would pass almost anything.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_jax.attention import _additive
from attn_jax.attention._softmax import assert_valid_attention_weights
from attn_jax.models import (
    EncoderOutput,
    RNNConfig,
    RNNenc,
    RNNsearch,
    build_model,
    gather_batch,
    paper_config,
    repeat_batch,
    small_config,
)
from attn_jax.models.rnnsearch import make_embedding
from attn_jax.nn.recurrent import gru_cell, gru_input_projection, gru_scan, init_gru_params
from tests.recurrent_models import (
    KX,
    KY,
    LENGTHS,
    B,
    Compiled,
    S,
    T,
    assert_bf16_close,
    forward_once,
    make_batch,
    pure_params,
    random_params,
    redrawn,
    rel_err,
)
from tests.reference.rnn import gru_cell_ref, gru_sequence_ref, rnnenc_ref, rnnsearch_ref
from tests.tolerance import assert_close_f32

SIZES = dict(embed=9, hidden=11, maxout=3, align=13, local_window=2)
# Longest float32 summation chain through a model, the reduction length when two float32 programs are compared
# (teacher-forced vs step by step, jit vs eager, padded vs one by one): S encoder GRU steps, each summing over
# embed + hidden, then T decoder steps: the GRU over embed, hidden and the 2·hidden context, the alignment over
# 2·hidden + align, the softmax and context over S, the readout over hidden + embed + 2·hidden.
_M, _N, _L = SIZES["embed"], SIZES["hidden"], SIZES["align"]


def rnn_reduction(source_length=S, target_length=T):
    """The longest float32 summation chain through an RNNsearch/RNNenc of these sizes (see above)."""
    step = (_M + 3 * _N) + (2 * _N + _L) + 2 * source_length + (_M + 3 * _N)
    return source_length * (_M + _N) + target_length * step


MODEL_REDUCTION = rnn_reduction()

# (arch, scorer, input_feeding): every decoder variant the config can select.
VARIANTS = [
    ("rnnsearch", "additive", False),
    ("rnnsearch", "normed_additive", False),
    ("rnnsearch", "dot", False),
    ("rnnsearch", "general", False),
    ("rnnsearch", "local-p", False),
    ("rnnsearch", "additive", True),
    ("rnnenc", "additive", False),
]
VARIANT_IDS = [f"{a}-{s}{'-feed' if f else ''}" if a == "rnnsearch" else a for a, s, f in VARIANTS]


def make_model(arch="rnnsearch", scorer="additive", input_feeding=False, seed=0, scale=0.5, **overrides):
    """A model whose every parameter is redrawn from N(0, scale²) with NumPy (see ``redrawn``); the real
    initialisers are tested on their own (``test_paper_initialisation``)."""
    sizes = {"src_vocab": KX, "tgt_vocab": KY, **SIZES, **overrides}
    cfg = RNNConfig(arch=arch, scorer=scorer, input_feeding=input_feeding, **sizes)
    return redrawn(lambda: build_model(cfg, rngs=nnx.Rngs(0)), seed, scale)


@functools.cache
def variant(arch, scorer, feed):
    """``(compiled model, batch, teacher-forced logits, attention)`` for one decoder variant, computed once."""
    return forward_once(make_model(arch, scorer, feed))


# ------------------------------------------------------------------------------------------------------------ GRU

GRU_SHAPES = {"w_x": (5, 3, 7), "u": (7, 3, 7), "b": (3, 7), "w_c": (9, 3, 7)}


def random_gru(rng, context=True):
    return random_params(rng, GRU_SHAPES, context)


def test_gru_cell_matches_float64_reference(rng):
    p = random_gru(rng)
    h = jnp.asarray(rng.normal(0, 1, (3, 7)), jnp.float32)
    x = jnp.asarray(rng.normal(0, 1, (3, 5)), jnp.float32)
    c = jnp.asarray(rng.normal(0, 1, (3, 9)), jnp.float32)
    got = gru_cell(p, h, gru_input_projection(p, x, c))
    p64 = {k: np.asarray(v, np.float64) for k, v in p.items()}
    ref = np.stack(
        [
            gru_cell_ref(
                p64, np.asarray(h[b], np.float64), np.asarray(x[b], np.float64), np.asarray(c[b], np.float64)
            )
            for b in range(3)
        ]
    )
    assert got.dtype == jnp.float32
    assert rel_err(got, ref) < 1e-5
    # The reset gate multiplies the state *before* U (Bahdanau A.2.2), not U s (the cuDNN variant): they differ.
    u, a = p["u"], gru_input_projection(p, x, c)
    z = jax.nn.sigmoid(a[:, 0] + h @ u[:, 0])
    r = jax.nn.sigmoid(a[:, 1] + h @ u[:, 1])
    cudnn = (1 - z) * h + z * jnp.tanh(a[:, 2] + r * (h @ u[:, 2]))
    assert rel_err(cudnn, ref) > 1e-3


def test_gru_cell_gradients_and_jit(rng):
    p = random_gru(rng, context=False)
    h = jnp.asarray(rng.normal(0, 1, (2, 7)), jnp.float32)
    a = gru_input_projection(p, jnp.asarray(rng.normal(0, 1, (2, 5)), jnp.float32))
    f = jax.jit(lambda p, h, a: gru_cell(p, h, a))
    assert_close_f32(f(p, h, a), gru_cell(p, h, a), reduction=7)  # jit vs eager: sums over the 7 hidden units
    # float32 finite differences with eps=1e-3: truncation ~eps² plus rounding ~1e-7/eps per entry, hence 1e-2.
    jax.test_util.check_grads(f, (p, h, a), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)


def test_gru_scan_padding_and_direction_match_reference(rng):
    p = random_gru(rng, context=False)
    x = jnp.asarray(rng.normal(0, 1, (3, S, 5)), jnp.float32)
    mask = jnp.arange(S)[None, :] < jnp.asarray(LENGTHS)[:, None]
    proj = gru_input_projection(p, x)
    p64 = {k: np.asarray(v, np.float64) for k, v in p.items()}
    for reverse in (False, True):
        states, final = gru_scan(p, proj, mask, reverse=reverse)
        for b, n in enumerate(LENGTHS):
            ref = gru_sequence_ref(p64, np.asarray(x[b, :n], np.float64), reverse=reverse)
            assert rel_err(states[b, :n], ref) < 1e-5
            # The backward GRU starts at the true last word, so its final carry is ←h_1; the forward one's is →h_n.
            assert rel_err(final[b], ref[0] if reverse else ref[n - 1]) < 1e-5
            if not reverse:  # padding carries the last real state, never updates it
                np.testing.assert_array_equal(
                    states[b, n:], np.broadcast_to(states[b, n - 1], states[b, n:].shape)
                )


def test_paper_initialisation():
    # An RBG key: threefry programs take seconds each to compile on the shared CPU; the distributions are the same.
    key = jax.random.key(0, impl="rbg")
    p = init_gru_params(key, 40, 30, context_features=50)
    for g in range(3):  # appendix B.1: recurrent matrices random orthogonal
        np.testing.assert_allclose(p["u"][:, g].T @ p["u"][:, g], np.eye(30), atol=1e-5)
    assert not np.allclose(p["u"][:, 0], p["u"][:, 1])
    for name in ("w_x", "w_c"):  # "any other weight matrix" ~ N(0, 0.01²)
        assert 0.009 < float(jnp.std(p[name])) < 0.011 and abs(float(jnp.mean(p[name]))) < 1e-3
    np.testing.assert_array_equal(p["b"], 0)
    emb = make_embedding(50, 40, param_dtype=jnp.float32, dtype=jnp.float32, rngs=nnx.Rngs(key))
    assert 0.009 < float(jnp.std(emb.embedding[...])) < 0.011


@pytest.mark.parametrize("arch", ["rnnsearch", "rnnenc"])
def test_parameters_carry_valid_logical_axis_names(arch):
    cfg = RNNConfig(
        src_vocab=KX, tgt_vocab=KY, arch=arch, scorer="local-p", input_feeding=arch == "rnnsearch", **SIZES
    )
    abstract = nnx.eval_shape(lambda: build_model(cfg, rngs=nnx.Rngs(0)))
    specs = nnx.get_partition_spec(nnx.state(abstract, nnx.Param))
    names = [
        v.get_metadata()["out_sharding"]
        for v in jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, nnx.Variable))
    ]
    shapes = [x.shape for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))]
    assert len(names) == len(shapes)
    for n, shape in zip(names, shapes, strict=True):
        assert len(n) == len(shape)
        # A logical name may appear once per parameter (flax's logical_to_mesh_axes rejects duplicates).
        used = [a for a in n if a is not None]
        assert len(used) == len(set(used)), n
        assert set(used) <= {"vocab", "embed", "hidden", "hidden_in", "context", "mlp", "align"}, n
    assert (
        ("vocab", "embed") in names and ("hidden_in", None, "hidden") in names and ("mlp", "vocab") in names
    )


# ---------------------------------------------------------------------------------------------- whole models


@pytest.mark.parametrize(("arch", "scorer", "feed"), VARIANTS, ids=VARIANT_IDS)
def test_forward_matches_float64_reference(arch, scorer, feed):
    compiled, (src, mask, tgt_in), logits, attn = variant(arch, scorer, feed)
    params = pure_params(compiled.model)
    if arch == "rnnenc":
        ref = rnnenc_ref(params, src, mask, tgt_in)
        assert attn is None
    else:
        ref, ref_attn = rnnsearch_ref(
            params, src, mask, tgt_in, scorer=scorer, input_feeding=feed, window=SIZES["local_window"]
        )
        assert attn.shape == (B, T, S) and attn.dtype == jnp.float32
        assert rel_err(attn, ref_attn) < 1e-5
    assert logits.shape == (B, T, KY) and logits.dtype == jnp.float32
    # float32 through 7 encoder and 5 decoder GRU steps of width 11-22: accumulated rounding stays ~1e-6.
    assert rel_err(logits, ref) < 1e-5
    assert np.std(ref) > 0.1  # the comparison is not between near-constants


@pytest.mark.parametrize(("arch", "scorer", "feed"), VARIANTS, ids=VARIANT_IDS)
def test_teacher_forcing_equals_step_by_step_decoding(arch, scorer, feed):
    compiled, batch, logits, attn = variant(arch, scorer, feed)
    step_logits, step_attn = compiled.step_loop(*batch)
    # a scan vs a loop of steps: two programs
    assert_close_f32(step_logits, logits, reduction=MODEL_REDUCTION)
    if arch == "rnnenc":
        assert attn is None and step_attn is None
    else:
        assert_close_f32(step_attn, attn, reduction=MODEL_REDUCTION)


def test_jit_equals_eager():
    compiled, batch, logits, attn = variant("rnnsearch", "additive", False)
    eager_logits, eager_attn = compiled.model(*batch)
    assert_close_f32((eager_logits, eager_attn), (logits, attn), reduction=MODEL_REDUCTION)


@pytest.mark.parametrize("scorer", ["additive", "normed_additive", "dot", "general", "local-p"])
def test_attention_is_an_alignment_over_the_source(scorer):
    _, (_, mask, _), _, attn = variant("rnnsearch", scorer, False)
    if scorer != "local-p":
        # Rows sum to 1 over the *source* axis and padded source words get exactly 0.
        assert_valid_attention_weights(attn, mask[:, None, :])
    else:
        # local-p multiplies the in-window softmax by a Gaussian (Luong §3.2), so rows sum to at most 1; padding
        # and everything outside the 2D+1 window still get exactly 0.
        w = np.asarray(attn)
        assert np.all(w >= 0) and np.all(w.sum(-1) <= 1 + 1e-6) and np.all(w.sum(-1) > 0)
        assert np.all(w[~np.broadcast_to(np.asarray(mask)[:, None, :], w.shape)] == 0)
        assert np.all((w > 0).sum(-1) <= 2 * SIZES["local_window"] + 1)
    # Not uniform and not frozen: the alignment moves with the decoder state.
    assert float(jnp.max(jnp.abs(attn[0, 1:] - attn[0, :-1]))) > 1e-3


@pytest.mark.parametrize(
    ("arch", "scorer", "feed"), [VARIANTS[4], VARIANTS[6]], ids=[VARIANT_IDS[4], VARIANT_IDS[6]]
)
def test_padded_batch_equals_sentences_one_by_one(arch, scorer, feed):
    compiled, (src, mask, tgt_in), _, _ = variant(arch, scorer, feed)
    src = jnp.where(mask, src, 5)  # junk ids in the padding must not matter
    logits, attn = compiled.forward(src, mask, tgt_in)
    # Sentence 1 (4 of 7 source words) alone, truncated on both sides (one new shape to compile: the float64
    # reference test already runs every variant over real tokens only).
    b, n, t = 1, LENGTHS[1], 3
    one_logits, one_attn = compiled.forward(src[b : b + 1, :n], mask[b : b + 1, :n], tgt_in[b : b + 1, :t])
    assert_close_f32(logits[b, :t], one_logits[0], reduction=MODEL_REDUCTION)  # two programs (two shapes)
    if attn is not None:
        assert_close_f32(attn[b, :t, :n], one_attn[0], reduction=MODEL_REDUCTION)
        assert np.all(np.asarray(attn[b, :, n:]) == 0)


@settings(max_examples=10)
@given(
    lengths=st.lists(st.integers(1, S), min_size=B, max_size=B),
    seed=st.integers(0, 2**16),
)
def test_random_padding_matches_reference_property(lengths, seed):
    # Fixed shapes [3, 7] / [3, 5] so every example reuses the one compiled forward; only masks and ids vary.
    compiled, _, _, _ = variant("rnnsearch", "additive", False)
    src, mask, tgt_in = make_batch(seed=seed, lengths=tuple(lengths))
    logits, attn = compiled.forward(src, mask, tgt_in)
    assert_valid_attention_weights(attn, mask[:, None, :])
    ref, ref_attn = rnnsearch_ref(pure_params(compiled.model), src, mask, tgt_in)
    assert rel_err(logits, ref) < 1e-5
    np.testing.assert_allclose(attn, ref_attn, atol=1e-6)


def test_empty_source_gives_finite_outputs():
    compiled, _, _, _ = variant("rnnsearch", "additive", False)
    src, mask, tgt_in = make_batch(seed=4, lengths=(0, 3, 1))
    logits, attn = compiled.forward(src, mask, tgt_in)
    assert np.all(np.isfinite(np.asarray(logits)))
    assert np.all(np.asarray(attn[0]) == 0)  # no source word: zero weights and a zero context, no NaN
    assert_valid_attention_weights(attn, mask[:, None, :])


@pytest.mark.parametrize(
    ("arch", "scorer", "feed"), [VARIANTS[5], VARIANTS[6]], ids=[VARIANT_IDS[5], VARIANT_IDS[6]]
)
def test_future_target_tokens_never_change_earlier_logits(arch, scorer, feed):
    compiled, (src, mask, tgt_in), base, _ = variant(arch, scorer, feed)
    for k in range(1, T):
        changed = np.array(tgt_in)
        changed[:, k] = (changed[:, k] + 1) % KY
        out, _ = compiled.forward(src, mask, jnp.asarray(changed))
        # the same program on the same earlier inputs: earlier steps bitwise equal
        np.testing.assert_array_equal(out[:, :k], base[:, :k])
        assert float(jnp.max(jnp.abs(out[:, k] - base[:, k]))) > 1e-3  # position k reads y_k as its input


def test_encode_projects_the_additive_keys_once(monkeypatch):
    compiled, (src, mask, tgt_in), _, _ = variant("rnnsearch", "additive", False)
    model = compiled.model
    calls = []
    original = _additive.project_keys
    monkeypatch.setattr(_additive, "project_keys", lambda *a, **k: calls.append(1) or original(*a, **k))
    jax.make_jaxpr(lambda: model(src, mask, tgt_in))()
    assert len(calls) == 1  # in encode(), not inside the scan over T
    enc = jax.eval_shape(model.encode, src, mask)
    calls.clear()
    jax.make_jaxpr(lambda e: model.decode_step(e, model.init_decoder_state(e), tgt_in[:, 0]))(enc)
    assert calls == []
    enc, _ = compiled.start(src, mask)
    # inside the jitted encoder vs eagerly: two programs summing over the 2·hidden memory width
    assert_close_f32(enc.keys, model.attention.project_keys(enc.memory), reduction=2 * _N)


@pytest.mark.parametrize("arch", ["rnnsearch", "rnnenc"])
def test_decoder_is_a_scan_not_a_python_loop(arch):
    model = make_model(arch, "additive", input_feeding=arch == "rnnsearch")
    src, mask, _ = make_batch()

    def jaxpr(t):
        return jax.make_jaxpr(lambda: model(src, mask, jnp.zeros((B, t), jnp.int32)))().jaxpr

    short, long = jaxpr(2), jaxpr(9)
    assert len(short.eqns) == len(long.eqns)  # the program does not grow with T
    assert sum(e.primitive.name == "scan" for e in long.eqns) >= 2  # encoder and decoder recurrences


def test_bf16_compute_keeps_fp32_params_and_stays_close():
    assert_bf16_close(
        variant("rnnsearch", "additive", False),
        Compiled(make_model("rnnsearch", "additive", dtype="bfloat16")),
    )  # same seed: the same parameters


def test_repeat_and_gather_batch_tile_the_decoder_over_beams():
    compiled, (src, mask, tgt_in), _, _ = variant("rnnsearch", "additive", True)
    enc, state = compiled.start(src, mask)
    logits, state1, attn = compiled.step(enc, state, tgt_in[:, 0])
    beams = 2
    enc_b, state_b = repeat_batch(enc, beams), repeat_batch(state, beams)
    assert isinstance(enc_b, EncoderOutput) and enc_b.memory.shape[0] == B * beams
    logits_b, state1_b, attn_b = compiled.step(enc_b, state_b, jnp.repeat(tgt_in[:, 0], beams))
    # batch 6 vs batch 3: two programs
    assert_close_f32(logits_b, jnp.repeat(logits, beams, axis=0), reduction=MODEL_REDUCTION)
    assert_close_f32(attn_b, jnp.repeat(attn, beams, axis=0), reduction=MODEL_REDUCTION)
    order = jnp.array([5, 0, 2, 2, 1, 4])  # reordering hypotheses moves every leaf of the state together
    picked = gather_batch(state1_b, order)
    np.testing.assert_array_equal(picked.hidden, state1_b.hidden[order])
    np.testing.assert_array_equal(picked.feed, state1_b.feed[order])


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["rnnsearch", "rnnenc"])
def test_tiny_model_overfits_a_handful_of_pairs(arch):
    # 4 pairs whose target is the reversed source, plain Adam written inline (models never import optax).
    model = make_model(
        arch, seed=0, scale=0.1, src_vocab=10, tgt_vocab=10, embed=16, hidden=32, maxout=16, align=16
    )
    rng = np.random.default_rng(0)
    lengths = np.array([5, 4, 5, 3])
    mask = np.arange(5)[None] < lengths[:, None]
    src = np.where(mask, rng.integers(2, 10, (4, 5)), 0).astype(np.int32)
    tgt_out = np.zeros((4, 6), np.int32)
    for b, n in enumerate(lengths):
        tgt_out[b, :n] = src[b, :n][::-1]
        tgt_out[b, n] = 1  # EOS
    tgt_in = np.concatenate([np.ones((4, 1), np.int32), tgt_out[:, :-1]], 1)  # BOS = 1
    tgt_mask = np.arange(6)[None] <= lengths[:, None]
    graphdef, params = nnx.split(model)

    def loss_fn(p):
        logits, _ = nnx.merge(graphdef, p)(src, mask, tgt_in)
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), tgt_out[..., None], -1)[..., 0]
        return jnp.sum(nll * tgt_mask) / tgt_mask.sum()

    @jax.jit
    def train(p):
        def step(carry, t):
            p, m, v = carry
            loss, g = jax.value_and_grad(loss_fn)(p)
            m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
            v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
            p = jax.tree.map(
                lambda p, m, v: p - 0.02 * (m / (1 - 0.9**t)) / (jnp.sqrt(v / (1 - 0.999**t)) + 1e-8), p, m, v
            )
            return (p, m, v), loss

        zeros = jax.tree.map(jnp.zeros_like, p)
        (p, _, _), losses = jax.lax.scan(step, (p, zeros, zeros), jnp.arange(1, 201, dtype=jnp.float32))
        return losses[0], loss_fn(p)

    first, last = (float(x) for x in train(params))
    assert first > 2.0  # ≈ log 10 for a nearly uniform initial model
    assert last < first / 20, (first, last)


@pytest.mark.parametrize("arch", ["rnnsearch", "rnnenc"])
def test_paper_preset_parameter_count(arch):
    # Appendix A's matrices (plus the biases the equations omit), with K_x = K_y = 30000, m = 620, n = 1000,
    # l = 500, n' = 1000.
    kx = ky = 30000
    m, n, lo, a = 620, 1000, 500, 1000  # lo: the paper's l
    gru = lambda din, dc=0: 3 * (din * n + n * n + n) + 3 * dc * n  # W, U, b for (z, r, h̃) + C for a context
    deep_output = lambda dc: (
        2 * lo * (n + m + dc) + 2 * lo + lo * ky + ky
    )  # U_o, V_o, C_o, b_o; W_o, its bias
    embeddings = kx * m + ky * m
    if arch == "rnnsearch":
        # 2 encoder GRUs; W_s, b_s; decoder GRU with C [2n]; attention W_a [n, n'], U_a [2n, n'], v_a, b_a.
        expected = (
            embeddings
            + 2 * gru(m)
            + (n * n + n)
            + gru(m, 2 * n)
            + (n * a + 2 * n * a + 2 * a)
            + deep_output(2 * n)
        )
    else:
        # 1 encoder GRU; V, b_V (c = tanh(V h_T)); W_s, b_s; decoder GRU with C [n]; deep output with C_o [n].
        expected = embeddings + gru(m) + 2 * (n * n + n) + gru(m, n) + deep_output(n)
    cfg = paper_config(arch)
    abstract = nnx.eval_shape(lambda: build_model(cfg, rngs=nnx.Rngs(0)))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert (cfg.embed, cfg.hidden, cfg.maxout, cfg.align, cfg.src_vocab) == (620, 1000, 500, 1000, 30000)
    assert count == expected == {"rnnsearch": 80_443_000, "rnnenc": 69_579_000}[arch]


def test_config_and_input_errors_are_one_line_value_errors():
    with pytest.raises(ValueError, match="scorer"):
        RNNConfig(src_vocab=5, tgt_vocab=5, scorer="bilinear")
    with pytest.raises(ValueError, match="input_feeding"):
        RNNConfig(src_vocab=5, tgt_vocab=5, arch="rnnenc", input_feeding=True)
    with pytest.raises(ValueError, match="dtype"):
        RNNConfig(src_vocab=5, tgt_vocab=5, dtype="int8")
    with pytest.raises(ValueError, match="hidden"):
        small_config(src_vocab=5, tgt_vocab=5, hidden=0)
    assert RNNConfig(src_vocab=5, tgt_vocab=5, dtype=jnp.bfloat16).dtype == "bfloat16"
    assert small_config("rnnenc", src_vocab=5, tgt_vocab=7).replace(hidden=3).hidden == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        RNNConfig(src_vocab=5, tgt_vocab=5).hidden = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="arch"):
        RNNenc(RNNConfig(src_vocab=5, tgt_vocab=5), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="arch"):
        RNNsearch(RNNConfig(src_vocab=5, tgt_vocab=5, arch="rnnenc"), rngs=nnx.Rngs(0))
    model = variant("rnnsearch", "additive", False)[0].model
    src, mask, tgt_in = make_batch()
    with pytest.raises(ValueError, match="src must be integer"):
        model(src.astype(jnp.float32), mask, tgt_in)
    with pytest.raises(ValueError, match="src_mask"):
        model(src, mask[:, :3], tgt_in)
    with pytest.raises(ValueError, match="batch size"):
        model(src, mask, tgt_in[:2])
    with pytest.raises(ValueError, match="prev_tokens"):
        model.decode_step(jax.eval_shape(model.encode, src, mask), None, tgt_in)
