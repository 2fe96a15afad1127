"""GNMT (Wu et al. 2016): the LSTM, the deep residual encoder–decoder, the step interface, beam search on it.

Sizes are odd and distinct (B=3, S=7, T=5, m=9, n=11, A=13, K_x=17, K_y=19) so a swapped axis cannot pass. Two
depth variants between them exercise every kind of layer: ``deep`` (4 + 4 layers, residuals from 3: an encoder
plain layer and a 2-layer encoder stack, a decoder plain layer and a 2-layer decoder stack, normed attention) and
``late`` (2 + 5 layers, residuals from 4: no encoder stack, two decoder plain layers and a 2-layer decoder stack,
plain additive attention). Parameters are redrawn from N(0, 0.5²) for the numerical tests: the U(-0.1, 0.1)
initialisation makes every logit tiny, where a relative comparison would pass almost anything.
"""

import dataclasses
import functools
import sys
import types

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_jax.attention._softmax import assert_valid_attention_weights
from attn_jax.decoding import beam_search, greedy_decode
from attn_jax.models.gnmt import (
    GNMT,
    GNMTConfig,
    GNMTDecoderState,
    _stacked_scan,
    gnmt_cpu_config,
    gnmt_wmt14_config,
)
from attn_jax.models.interface import gather_batch, repeat_batch
from attn_jax.nn.lstm import (
    LSTMState,
    init_lstm_params,
    init_lstm_stack_params,
    lstm_cell,
    lstm_input_projection,
    lstm_scan,
)
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
from tests.reference.lstm import gnmt_ref, lstm_cell_ref, lstm_sequence_ref
from tests.tolerance import assert_close_f32

SIZES = dict(src_vocab=KX, tgt_vocab=KY, embed=9, hidden=11, align=13)
VARIANTS = {
    "deep": dict(encoder_layers=4, decoder_layers=4, residual_start=3, attention="normed_additive"),
    "late": dict(encoder_layers=2, decoder_layers=5, residual_start=4, attention="additive"),
}
BOS, EOS, PAD = 1, 2, 0
# Longest float32 summation chain through GNMT (the deeper of each stack over the variants), the reduction length
# when two float32 programs are compared (teacher forcing vs steps, padded vs alone, pipelined vs plain): S steps of
# up to 4 encoder layers, each summing over a 2·hidden input and the hidden state, then T steps of up to 5 decoder
# layers (input, context and hidden: 4·hidden), the attention (2·hidden + align, softmax and context over S) and the
# output over hidden.
_N = SIZES["hidden"]
MODEL_REDUCTION = S * 4 * (3 * _N) + T * (5 * (4 * _N) + (2 * _N + SIZES["align"] + 2 * S) + _N)


def make_model(variant="deep", seed=0, scale=0.5, **overrides):
    """A GNMT whose every parameter is redrawn from N(0, scale²) with NumPy (built abstractly: no init compile)."""
    cfg = GNMTConfig(**{**SIZES, **VARIANTS[variant], **overrides})
    return redrawn(lambda: GNMT(cfg, rngs=nnx.Rngs(0)), seed, scale)


@functools.cache
def variant(name):
    """``(compiled model, batch, teacher-forced logits, attention)`` for one depth variant, computed once."""
    return forward_once(make_model(name))


# ----------------------------------------------------------------------------------------------------------- LSTM

LSTM_SHAPES = {"w_x": (5, 4, 7), "u": (7, 4, 7), "b": (4, 7), "w_c": (9, 4, 7)}


def random_lstm(rng, context=True):
    return random_params(rng, LSTM_SHAPES, context)


def test_lstm_cell_matches_float64_reference(rng):
    p = random_lstm(rng)
    h, cell = (jnp.asarray(rng.normal(0, 1, (3, 7)), jnp.float32) for _ in range(2))
    x = jnp.asarray(rng.normal(0, 1, (3, 5)), jnp.float32)
    c = jnp.asarray(rng.normal(0, 1, (3, 9)), jnp.float32)
    got = lstm_cell(p, LSTMState(h, cell), lstm_input_projection(p, x, c))
    ref = [lstm_cell_ref(p, *(np.asarray(a[b], np.float64) for a in (h, cell, x, c))) for b in range(3)]
    assert got.h.dtype == got.cell.dtype == jnp.float32
    assert rel_err(got.h, np.stack([r[0] for r in ref])) < 1e-5
    assert rel_err(got.cell, np.stack([r[1] for r in ref])) < 1e-5
    # The gate order is (i, f, g, o): swapping the forget and output gates must change the result.
    swapped = {k: v[..., jnp.array([0, 3, 2, 1]), :] for k, v in p.items()}
    assert (
        rel_err(lstm_cell(swapped, LSTMState(h, cell), lstm_input_projection(swapped, x, c)).h, got.h) > 1e-2
    )


def test_lstm_cell_gradients_and_jit(rng):
    p = random_lstm(rng, context=False)
    state = LSTMState(*(jnp.asarray(rng.normal(0, 1, (2, 7)), jnp.float32) for _ in range(2)))
    a = lstm_input_projection(p, jnp.asarray(rng.normal(0, 1, (2, 5)), jnp.float32))
    f = jax.jit(lambda p, s, a: lstm_cell(p, s, a))
    assert_close_f32(
        f(p, state, a).h, lstm_cell(p, state, a).h, reduction=7
    )  # jit vs eager: sums over 7 units
    # float32 finite differences with eps=1e-3: truncation ~eps² plus rounding ~1e-7/eps per entry, hence 1e-2.
    jax.test_util.check_grads(f, (p, state, a), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)


def test_lstm_scan_padding_and_direction_match_reference(rng):
    p = random_lstm(rng, context=False)
    x = jnp.asarray(rng.normal(0, 1, (3, S, 5)), jnp.float32)
    mask = jnp.arange(S)[None, :] < jnp.asarray(LENGTHS)[:, None]
    proj = lstm_input_projection(p, x)
    for reverse in (False, True):
        outputs, final = lstm_scan(p, proj, mask, reverse=reverse)
        for b, n in enumerate(LENGTHS):
            ref, (ref_h, ref_c) = lstm_sequence_ref(p, np.asarray(x[b, :n], np.float64), reverse=reverse)
            assert rel_err(outputs[b, :n], ref) < 1e-5
            # Padding is skipped: the backward LSTM starts at the true last word; the final carry is the state
            # after the last real word in scan order (both h and the cell).
            assert rel_err(final.h[b], ref_h) < 1e-5 and rel_err(final.cell[b], ref_c) < 1e-5
            if not reverse:  # padding carries the last real output, never updates it
                np.testing.assert_array_equal(
                    outputs[b, n:], np.broadcast_to(outputs[b, n - 1], outputs[b, n:].shape)
                )


def test_lstm_initialisation():
    # An RBG key: threefry programs take seconds each to compile on the shared CPU; the distributions are the same.
    key = jax.random.key(0, impl="rbg")

    @jax.jit  # one program instead of one per random op
    def init(key):
        return init_lstm_params(key, 40, 30, context_features=20), init_lstm_stack_params(key, 3, 30, 30)

    p, stack = init(key)
    for name in ("w_x", "u", "w_c"):  # tf/nmt GNMT: uniform in [-0.1, 0.1]
        w = np.asarray(p[name])
        assert w.min() >= -0.1 and w.max() <= 0.1 and abs(float(np.std(w)) - 0.1 / np.sqrt(3)) < 0.003
    np.testing.assert_array_equal(p["b"], np.array([0.0, 1.0, 0.0, 0.0])[:, None] * np.ones((4, 30)))
    assert stack["u"].shape == (3, 30, 4, 30) and not np.allclose(stack["u"][0], stack["u"][1])


# -------------------------------------------------------------------------------------------------- whole model


@pytest.mark.parametrize("name", list(VARIANTS))
def test_forward_matches_float64_reference(name):
    compiled, (src, mask, tgt_in), logits, attn = variant(name)
    ref, ref_attn = gnmt_ref(
        pure_params(compiled.model), src, mask, tgt_in, residual_start=VARIANTS[name]["residual_start"]
    )
    assert logits.shape == (B, T, KY) and logits.dtype == jnp.float32
    assert attn.shape == (B, T, S) and attn.dtype == jnp.float32
    # float32 through 7 source and 5 target steps of 4-5 LSTM layers of width 9-22: rounding stays ~1e-6.
    assert rel_err(logits, ref) < 1e-5
    np.testing.assert_allclose(attn, ref_attn, rtol=1e-5, atol=1e-6)  # weights lie in [0, 1]
    assert np.std(ref) > 0.1  # the comparison is not between near-constants
    assert_valid_attention_weights(attn, mask[:, None, :])
    assert float(jnp.max(jnp.abs(attn[0, 1:] - attn[0, :-1]))) > 1e-3  # the alignment moves with the decoder


def test_residual_layers_are_where_the_config_says():
    # Removing the residual from one stacked layer (a reference with r one higher) must change the result, so the
    # reference comparison above really pins the residual connections down.
    compiled, (src, mask, tgt_in), logits, _ = variant("deep")
    moved, _ = gnmt_ref(pure_params(compiled.model), src, mask, tgt_in, residual_start=4)
    assert rel_err(logits, moved) > 1e-2


@pytest.mark.parametrize("name", list(VARIANTS))
def test_teacher_forcing_equals_step_by_step_decoding(name):
    compiled, batch, logits, attn = variant(name)
    step_logits, step_attn = compiled.step_loop(*batch)
    # a loop of decode steps vs the teacher-forced scan: two programs
    assert_close_f32((step_logits, step_attn), (logits, attn), reduction=MODEL_REDUCTION)


def test_future_target_tokens_never_change_earlier_logits():
    compiled, (src, mask, tgt_in), base, _ = variant("deep")
    for k in (1, T - 1):
        changed = np.array(tgt_in)
        changed[:, k] = (changed[:, k] + 1) % KY
        out, _ = compiled.forward(src, mask, jnp.asarray(changed))
        # the same program on the same earlier inputs: earlier steps bitwise equal
        np.testing.assert_array_equal(out[:, :k], base[:, :k])
        assert float(jnp.max(jnp.abs(out[:, k] - base[:, k]))) > 1e-3  # position k reads y_k as its input


def test_encode_is_padding_invariant():
    compiled, (src, mask, tgt_in), logits, attn = variant("deep")
    enc, _ = compiled.start(src, mask)
    junk_enc, _ = compiled.start(jnp.where(mask, src, 5), mask)  # junk ids in the padding must not matter
    np.testing.assert_array_equal(junk_enc.memory, enc.memory)  # the same program: bitwise
    assert np.all(np.asarray(enc.memory)[~np.asarray(mask)] == 0)  # padding rows are zero
    # Sentence 1 (4 of 7 words) alone, without padding: the same top-layer outputs and keys at its real words
    # (the backward LSTM and the masked stack skip the padding), up to float32 rounding: another program.
    b, n = 1, LENGTHS[1]
    alone, _ = compiled.start(src[b : b + 1, :n], mask[b : b + 1, :n])
    assert_close_f32(enc.memory[b, :n], alone.memory[0], reduction=MODEL_REDUCTION)
    assert_close_f32(enc.keys[b, :n], alone.keys[0], reduction=MODEL_REDUCTION)
    # Hence the whole translation model too (teacher forcing on the padded and the unpadded source).
    one_logits, one_attn = compiled.forward(src[b : b + 1, :n], mask[b : b + 1, :n], tgt_in[b : b + 1])
    assert_close_f32((logits[b], attn[b, :, :n]), (one_logits[0], one_attn[0]), reduction=MODEL_REDUCTION)


def test_empty_source_gives_finite_outputs():
    compiled, _, _, _ = variant("deep")
    src, mask, tgt_in = make_batch(seed=4, lengths=(0, 3, 1))
    logits, attn = compiled.forward(src, mask, tgt_in)
    assert np.all(np.isfinite(np.asarray(logits)))
    assert np.all(np.asarray(attn[0]) == 0)  # no source word: zero weights and a zero context, no NaN


@pytest.mark.slow
def test_gradients_are_finite_and_reach_every_parameter():
    compiled, (src, mask, tgt_in), _, _ = variant("deep")
    graphdef = nnx.graphdef(compiled.model)
    tgt_out = jnp.roll(tgt_in, -1, axis=1)
    src, mask = (
        src.at[2].set(0),
        mask.at[2].set(False),
    )  # an empty source row too: its gradients must stay finite

    @jax.jit
    def grads(state):
        def loss(st):
            logits, _ = nnx.merge(graphdef, st)(src, mask, tgt_in)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tgt_out[..., None], -1))

        return jax.grad(loss)(state)

    flat = jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(grads(compiled.state)))
    assert len(flat) == len(jax.tree.leaves(compiled.state))
    for path, g in flat:
        g = np.asarray(g)
        assert np.all(np.isfinite(g)), path
        # Every parameter is used (no layer silently skipped), every stacked layer separately.
        norms = (
            np.sqrt((g.reshape(g.shape[0], -1) ** 2).sum(-1))
            if "stack" in str(path[0])
            else [np.abs(g).sum()]
        )
        assert np.all(np.asarray(norms) > 0), path


def test_state_tiles_over_beams():
    compiled, (src, mask, tgt_in), _, _ = variant("late")
    enc, state = compiled.start(src, mask)
    assert isinstance(state, GNMTDecoderState) and len(state.plain) == 2 and state.stack.h.shape == (B, 2, 11)
    logits, state1, attn = compiled.step(enc, state, tgt_in[:, 0])
    beams = 2
    enc_b, state_b = repeat_batch(enc, beams), repeat_batch(state, beams)
    logits_b, state1_b, attn_b = compiled.step(enc_b, state_b, jnp.repeat(tgt_in[:, 0], beams))
    # batch 6 vs batch 3: two programs
    assert_close_f32(logits_b, jnp.repeat(logits, beams, axis=0), reduction=MODEL_REDUCTION)
    assert_close_f32(attn_b, jnp.repeat(attn, beams, axis=0), reduction=MODEL_REDUCTION)
    order = jnp.array([5, 0, 2, 2, 1, 4])  # reordering hypotheses moves every leaf of the state together
    picked = gather_batch(state1_b, order)
    np.testing.assert_array_equal(picked.stack.cell, state1_b.stack.cell[order])
    np.testing.assert_array_equal(picked.plain[1].h, state1_b.plain[1].h[order])


def test_greedy_decoding_is_the_argmax_loop():
    compiled, (src, mask, _), _, _ = variant("deep")
    model = compiled.model
    # Greedy decoding (beam 1, no penalties) is the argmax loop over decode_step, </s> forced at the limit.
    greedy = greedy_decode(model, src, mask, max_length=T, max_length_ratio=None, bos_id=BOS, eos_id=EOS)
    enc, dec = compiled.start(src, mask)
    prev, done = jnp.full((B,), BOS, jnp.int32), np.zeros(B, bool)
    expected = np.full((B, T), PAD, np.int32)
    for t in range(T):
        logits, dec, _ = compiled.step(enc, dec, prev)
        logits = np.asarray(logits).copy()
        logits[:, [PAD, BOS]] = -np.inf
        word = np.where(t == T - 1, EOS, logits.argmax(-1))
        expected[~done, t] = word[~done]
        done |= word == EOS
        prev = jnp.asarray(word, jnp.int32)
    np.testing.assert_array_equal(greedy.tokens[:, 0], expected)


@pytest.mark.slow
def test_beam_search_scores_and_attention_are_the_models():
    # Beam search's log-probabilities and attention are the model's: rescore its hypotheses by teacher forcing
    # (max_length = T so the rescoring reuses the compiled [3, 5] forward). A wrong reordering of any leaf of the
    # decoder state by the back-pointers would make them disagree.
    compiled, (src, mask, _), _, _ = variant("deep")
    model = compiled.model
    beam = beam_search(model, src, mask, beam_size=3, num_return=1, max_length=T, max_length_ratio=None)
    tokens, lengths = np.asarray(beam.tokens[:, 0]), np.asarray(beam.lengths[:, 0])
    tgt_in = np.concatenate([np.full((B, 1), BOS, np.int32), tokens[:, :-1]], axis=1)
    logits, attn = compiled.forward(src, mask, jnp.asarray(tgt_in))
    logp = np.asarray(jax.nn.log_softmax(logits))
    for b in range(B):
        n = lengths[b]
        assert tokens[b, n - 1] == EOS and np.all(tokens[b, n:] == PAD)
        # beam search's cached steps vs teacher forcing: two float32 programs
        lp = sum(logp[b, i, tokens[b, i]] for i in range(n))
        assert_close_f32(beam.log_probs[b, 0], lp, reduction=MODEL_REDUCTION + T)
        assert_close_f32(beam.attention[b, 0, :n], attn[b, :n], reduction=MODEL_REDUCTION)


def test_decoder_and_stacks_are_scans_not_python_loops():
    def jaxpr(t, **overrides):
        cfg = GNMTConfig(**{**SIZES, **VARIANTS["deep"], **overrides})
        graphdef, state = nnx.split(nnx.eval_shape(lambda: GNMT(cfg, rngs=nnx.Rngs(0))))
        src, mask, _ = make_batch()
        fn = lambda st: nnx.merge(graphdef, st)(src, mask, jnp.zeros((B, t), jnp.int32))  # noqa: E731
        return jax.make_jaxpr(fn)(state).jaxpr

    base = len(jaxpr(2).eqns)
    assert len(jaxpr(9).eqns) == base  # the program does not grow with T
    # Nor with the depth of the residual stacks (a scan over layers), 2 + 2 -> 5 + 6 stacked layers.
    assert len(jaxpr(2, encoder_layers=7, decoder_layers=8).eqns) == base


def test_pipelined_stacks_go_through_attn_jax_parallel(monkeypatch):
    # pipeline_stages > 1 hands both stacks of the teacher-forced pass to attn_jax.parallel.pipelined_stack (a
    # stand-in here that runs the plain scan and records its calls); decode steps keep the plain scan.
    calls = []

    def pipelined_stack(layer_fn, stacked_params, init_carry, xs, *, stage_axis="stage", batch_axis=None):
        calls.append(jax.tree.leaves(stacked_params)[0].shape[0])
        return _stacked_scan(layer_fn, stacked_params, init_carry, xs)

    fake = types.ModuleType("attn_jax.parallel")
    fake.pipelined_stack = pipelined_stack
    monkeypatch.setitem(sys.modules, "attn_jax.parallel", fake)
    src, mask, tgt_in = make_batch()

    def jaxpr(stages):
        cfg = GNMTConfig(**SIZES, **VARIANTS["deep"], pipeline_stages=stages)
        graphdef, state = nnx.split(nnx.eval_shape(lambda: GNMT(cfg, rngs=nnx.Rngs(0))))
        return jax.make_jaxpr(lambda st: nnx.merge(graphdef, st)(src, mask, tgt_in))(state), graphdef, state

    plain, _, _ = jaxpr(1)
    assert calls == []
    piped, graphdef, state = jaxpr(2)
    assert calls == [2, 2]  # the encoder's and the decoder's stacks, 2 layers each
    assert str(piped) == str(
        plain
    )  # and nothing else changed: the stand-in computes what the plain path does
    enc = jax.eval_shape(lambda st: nnx.merge(graphdef, st).encode(src, mask), state)
    calls.clear()

    def step(st, e):
        model = nnx.merge(graphdef, st)
        return model.decode_step(e, model.init_decoder_state(e), tgt_in[:, 0])

    jax.make_jaxpr(step)(state, enc)
    assert calls == []


def test_bf16_compute_keeps_fp32_params_and_stays_close():
    assert_bf16_close(
        variant("deep"), Compiled(make_model("deep", dtype="bfloat16"))
    )  # same seed: the same parameters


# ---------------------------------------------------------------------------------------- parameters and config


def test_wmt14_parameter_count_without_allocation():
    # Wu et al. (2016) sizes: 32k vocabularies, m = n = A = 1024, 8 + 8 layers, residuals from layer 3.
    v, m, n, a = 32000, 1024, 1024, 1024
    lstm = lambda din, dc=0: 4 * n * (din + n + 1) + 4 * n * dc  # W_x, U, b of (i, f, g, o), plus C  # noqa: E731
    encoder = 2 * lstm(m) + lstm(2 * n) + 6 * lstm(n)  # bidirectional layer 1, layer 2 (2n -> n), 6 residual
    decoder = lstm(m, n) + 7 * lstm(n, n)  # every layer also reads the context a (n wide)
    attention = n * a + n * a + a + a + 1  # W_q, W_k, v, b, the weight-norm gain g
    expected = 2 * v * m + encoder + attention + decoder + (n * v + v)  # embeddings, ..., softmax W_o and b_o
    cfg = gnmt_wmt14_config()
    abstract = nnx.eval_shape(lambda: GNMT(cfg, rngs=nnx.Rngs(0)))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert (cfg.embed, cfg.hidden, cfg.align, cfg.encoder_layers, cfg.decoder_layers) == (1024,) * 3 + (8, 8)
    assert count == expected == 280_859_905


def test_parameters_carry_valid_logical_axis_names():
    abstract = nnx.eval_shape(lambda: GNMT(GNMTConfig(**SIZES, **VARIANTS["deep"]), rngs=nnx.Rngs(0)))
    state = nnx.state(abstract, nnx.Param)
    names = {
        jax.tree_util.keystr(path): v.get_metadata()["out_sharding"]
        for path, v in jax.tree_util.tree_leaves_with_path(
            nnx.get_partition_spec(state), is_leaf=lambda x: isinstance(x, nnx.Variable)
        )
    }
    shapes = {
        jax.tree_util.keystr(path): v.shape
        for path, v in jax.tree_util.tree_leaves_with_path(
            state, is_leaf=lambda x: isinstance(x, nnx.Variable)
        )
    }
    assert names.keys() == shapes.keys()
    for path, axes in names.items():
        assert len(axes) == len(shapes[path]), path
        used = [x for x in axes if x is not None]
        assert len(used) == len(set(used)), path  # flax's logical_to_mesh_axes rejects a repeated name
        assert set(used) <= {"vocab", "embed", "hidden", "hidden_in", "context", "align", "layers"}, path
        if "stack" in path:
            assert axes[0] == "layers" and shapes[path][0] == 2, path
        if any(k in path for k in ("'w_x'", "'u'", "'w_c'")):
            assert axes[-2:] == (None, "hidden") and shapes[path][-2] == 4, (
                path
            )  # [in, 4, n]: gates split together
    assert names["['src_embed']['embedding']"] == ("vocab", "embed")
    assert names["['output']['w']"] == ("hidden_in", "vocab")
    assert names["['decoder_stack']['params']['w_c']"] == ("layers", "context", None, "hidden")


def test_config_validation_errors_are_one_line_value_errors():
    for field, bad, match in [
        ("hidden", 0, "hidden"),
        ("encoder_layers", 1, "encoder_layers"),
        ("decoder_layers", 0, "decoder_layers"),
        ("residual_start", 2, "residual_start"),
        ("attention", "dot", "attention"),
        ("pipeline_stages", 4, "pipeline_stages"),  # 6 residual layers do not split into 4 stages
        ("dtype", "int8", "dtype"),
        ("align", True, "align"),
    ]:
        with pytest.raises(ValueError, match=match) as info:
            gnmt_wmt14_config(**{field: bad})
        assert "\n" not in str(info.value)
    assert gnmt_wmt14_config(pipeline_stages=3).pipeline_stages == 3
    assert gnmt_wmt14_config(dtype=jnp.bfloat16).dtype == "bfloat16"
    cpu = gnmt_cpu_config(100, 120)
    assert (cpu.hidden, cpu.encoder_layers, cpu.residual_start, cpu.arch) == (64, 4, 3, "gnmt")
    assert cpu.replace(residual_start=9).decoder_stack_layers == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cpu.hidden = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="GNMTConfig"):
        GNMT(dict(hidden=3), rngs=nnx.Rngs(0))
    model = variant("deep")[0].model
    src, mask, tgt_in = make_batch()
    with pytest.raises(ValueError, match="src must be integer"):
        model(src.astype(jnp.float32), mask, tgt_in)
    with pytest.raises(ValueError, match="batch size"):
        model(src, mask, tgt_in[:2])
    with pytest.raises(ValueError, match="prev_tokens"):
        model.decode_step(jax.eval_shape(model.encode, src, mask), None, tgt_in)


@settings(max_examples=5)
@given(lengths=st.lists(st.integers(1, S), min_size=B, max_size=B), seed=st.integers(0, 2**16))
def test_random_padding_matches_reference_property(lengths, seed):
    # Fixed shapes [3, 7] / [3, 5] so every example reuses the one compiled forward; only masks and ids vary.
    compiled, _, _, _ = variant("deep")
    src, mask, tgt_in = make_batch(seed=seed, lengths=tuple(lengths))
    logits, attn = compiled.forward(src, mask, tgt_in)
    ref, ref_attn = gnmt_ref(pure_params(compiled.model), src, mask, tgt_in, residual_start=3)
    assert rel_err(logits, ref) < 1e-5
    np.testing.assert_allclose(attn, ref_attn, rtol=1e-5, atol=1e-6)


def test_pipelined_model_on_two_stages_equals_the_plain_one():
    # The real wavefront (attn_jax.parallel.pipelined_stack under jax.shard_map) on 2 of the 8 fake CPU devices:
    # each stack's 2 layers become 2 stages; logits and attention equal the plain scans'.
    from attn_jax.parallel import make_mesh

    compiled, (src, mask, tgt_in), logits, attn = variant("deep")
    cfg = dataclasses.replace(compiled.model.config, pipeline_stages=2)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: GNMT(cfg, rngs=nnx.Rngs(0))))
    with jax.set_mesh(make_mesh(stage=2, devices=jax.devices()[:2])):
        piped_logits, piped_attn = jax.jit(lambda st: nnx.merge(graphdef, st)(src, mask, tgt_in))(
            compiled.state
        )
    # sharded over two devices vs one program: float32 rounding apart
    assert_close_f32((piped_logits, piped_attn), (logits, attn), reduction=MODEL_REDUCTION)
