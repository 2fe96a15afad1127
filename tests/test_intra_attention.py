"""Intra-attention (LSTMN-style, Cheng, Dong & Lapata 2016, with a GRU) encoder: the layer and the RNN models using it.

Sizes are odd and distinct (B=3, S=7, Din=9, n=11, A=13) so a swapped axis cannot pass. Parameters are drawn from
N(0, 0.5²): large enough that the energies, and so the attention weights, are far from uniform.
"""

import doctest

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_jax.nn.intra as intra_module
import tests.reference.rnn as rnn_reference
from attn_jax.attention._softmax import assert_valid_attention_weights
from attn_jax.models import RNNConfig, build_model, paper_config
from attn_jax.nn.intra import BidirectionalIntraGRU, IntraGRU, init_intra_params, intra_gru_scan
from attn_jax.nn.recurrent import gru_cell, gru_input_projection, gru_scan
from tests.reference.intra import intra_model_params, intra_sequence_ref, intra_states_ref
from tests.test_models_rnn import (
    KX,
    KY,
    LENGTHS,
    MODEL_REDUCTION,
    SIZES,
    Compiled,
    make_batch,
    make_model,
    pure_params,
    rel_err,
)
from tests.tolerance import assert_close_f32

B, S, DIN, N, A = 3, 7, 9, 11, 13
# Longest float32 summation chain through the layer (S steps, each: the GRU over Din + N, the intra-attention scores
# over A, its softmax and context over S): the reduction length for comparing two float32 programs. The models add
# the same intra-attention to each encoder step of test_models_rnn's chain.
LAYER_REDUCTION = S * (DIN + N + A + 2 * S)
INTRA_MODEL_REDUCTION = MODEL_REDUCTION + S * (SIZES["align"] + 2 * S)


def random_layer(rng, din=DIN, n=N, a=A, scale=0.5):
    """GRU and intra-attention params from N(0, scale²), float32."""
    draw = lambda shape: jnp.asarray(rng.normal(0, scale, shape), jnp.float32)
    gru = {"w_x": draw((din, 3, n)), "u": draw((n, 3, n)), "b": draw((3, n))}
    intra = {
        "w_h": draw((n, a)),
        "w_x": draw((din, a)),
        "w_tilde": draw((n, a)),
        "v": draw((a,)),
        "b": draw((a,)),
    }
    return gru, intra


def lengths_mask(lengths, s=S):
    return jnp.arange(s)[None, :] < jnp.asarray(lengths)[:, None]


def read_before(mask, reverse):
    """``[B, S, S]``: key ``j`` is attended at query ``t`` iff both are real and ``j`` was read before ``t``."""
    m = np.asarray(mask, bool)
    idx = np.arange(m.shape[-1])
    order = idx[None, :] > idx[:, None] if reverse else idx[None, :] < idx[:, None]  # [t, j]
    return order[None] & m[:, None, :] & m[:, :, None]


def run(gru, intra, x, mask, h0=None, reverse=False):
    """The layer with its weights; h0 always passed, so every test reuses one compiled program per direction
    (``intra_gru_scan`` compiles its scan once per shape even when called eagerly)."""
    h0 = jnp.zeros(x.shape[:-2] + (gru["u"].shape[-1],)) if h0 is None else h0
    return intra_gru_scan(gru, intra, x, mask, h0, reverse=reverse, return_weights=True)


@jax.jit
def layer_vjp(gru, intra, x, mask, h0, cotangents):
    """Gradients of ``<cotangents, (states, final)>`` w.r.t. ``(gru, intra, x, h0)``: one compiled program shared
    by the gradient tests."""
    _, vjp = jax.vjp(lambda g, p, x, h0: intra_gru_scan(g, p, x, mask, h0), gru, intra, x, h0)
    return vjp(cotangents)


def check_against_reference(gru, intra, x, mask, h0, reverse, states, final, weights):
    """Every real row of ``states``/``weights`` and ``final`` against the float64 loop, sentence by sentence."""
    m = np.asarray(mask, bool)
    for b in range(x.shape[0]):
        real = np.flatnonzero(m[b])
        ref_states, ref_w = intra_sequence_ref(
            gru, intra, np.asarray(x[b, real], np.float64), reverse=reverse, h0=np.asarray(h0[b], np.float64)
        )
        if len(real):
            assert rel_err(states[b, real], ref_states) < 1e-5
            assert rel_err(final[b], ref_states[0 if reverse else -1]) < 1e-5
            np.testing.assert_allclose(weights[b][np.ix_(real, real)], ref_w, rtol=1e-5, atol=1e-6)
        else:  # nothing read: the state never moves from h0
            np.testing.assert_array_equal(final[b], h0[b])
        # Masked steps carry the state of the last real step in scan order (h0 before the first one).
        for t in np.flatnonzero(~m[b]):
            before = real[real > t] if reverse else real[real < t]
            carried = h0[b] if len(before) == 0 else states[b, before[0] if reverse else before[-1]]
            np.testing.assert_array_equal(states[b, t], carried)
            assert np.all(np.asarray(weights[b, t]) == 0)


# ------------------------------------------------------------------------------------------------------ the layer


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "backward"])
def test_layer_matches_float64_reference_with_padding(rng, reverse):
    gru, intra = random_layer(rng)
    x = jnp.asarray(rng.normal(0, 1, (B, S, DIN)), jnp.float32)
    mask = lengths_mask((7, 4, 1))  # a full, a padded and a one-word sentence
    h0 = jnp.zeros((B, N))
    states, final, weights = run(gru, intra, x, mask, h0, reverse)
    assert states.shape == (B, S, N) and final.shape == (B, N) and weights.shape == (B, S, S)
    assert states.dtype == final.dtype == weights.dtype == jnp.float32
    check_against_reference(gru, intra, x, mask, h0, reverse, states, final, weights)
    assert float(np.std(np.asarray(states))) > 0.1  # not a comparison of near-constants
    # Not the plain GRU with the same cell (where h̃_t would be h_{t-1}): the attention mixes several states.
    plain, _ = gru_scan(gru, gru_input_projection(gru, x), mask, reverse=reverse)
    assert rel_err(states[0], plain[0]) > 1e-2
    # A row with one key gives it weight 1; every row of the full sentence with several keys spreads its weight.
    several = read_before(mask, reverse)[0].sum(-1) >= 2
    assert several.sum() == S - 2 and float(np.max(np.asarray(weights[0])[several])) < 0.999


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "backward"])
def test_weights_sum_to_one_over_the_positions_read_before(rng, reverse):
    gru, intra = random_layer(rng)
    x = jnp.asarray(rng.normal(0, 1, (B, S, DIN)), jnp.float32)
    mask = jnp.asarray(np.array([[1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 0, 0], [0, 0, 1, 0, 0, 0, 0]], bool))
    h0 = jnp.asarray(rng.normal(0, 1, (B, N)), jnp.float32)
    states, final, weights = run(gru, intra, x, mask, h0, reverse)
    allowed = read_before(mask, reverse)
    # Rows sum to 1 over the keys read before t; every other key (later, padded) and every padded row get exactly 0;
    # the first real position has nothing to read: an all-zero row.
    assert_valid_attention_weights(weights, allowed)
    has_key = allowed.any(-1)
    np.testing.assert_array_equal(has_key.sum(-1), np.asarray(mask).sum(-1) - (np.asarray(mask).sum(-1) > 0))
    # Where nothing was read before, h̃_t = h0: the first real step is GRU(x_t, h0), here with a non-zero h0.
    for b, t in ((0, 6 if reverse else 0), (1, 4 if reverse else 0), (2, 2)):
        assert not has_key[b, t]
        want = gru_cell(gru, h0[b], gru_input_projection(gru, x[b, t]))
        assert_close_f32(states[b, t], want, reduction=DIN + N)  # inside the scan vs one eager cell
    check_against_reference(gru, intra, x, mask, h0, reverse, states, final, weights)


@settings(max_examples=10)
@given(
    mask=st.lists(st.lists(st.booleans(), min_size=S, max_size=S), min_size=B, max_size=B),
    reverse=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_masks_match_reference_property(mask, reverse, seed):
    # Arbitrary masks (holes, empty rows) at fixed shapes, so every example reuses the two compiled programs.
    rng = np.random.default_rng(seed)
    gru, intra = random_layer(rng)
    x = jnp.asarray(rng.normal(0, 1, (B, S, DIN)), jnp.float32)
    mask = jnp.asarray(np.array(mask, bool))
    h0 = jnp.asarray(rng.normal(0, 1, (B, N)), jnp.float32)
    states, final, weights = run(gru, intra, x, mask, h0, reverse)
    assert_valid_attention_weights(weights, read_before(mask, reverse))
    check_against_reference(gru, intra, x, mask, h0, reverse, states, final, weights)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "backward"])
def test_a_later_input_never_changes_an_earlier_state(rng, reverse):
    gru, intra = random_layer(rng)
    x = jnp.asarray(rng.normal(0, 1, (B, S, DIN)), jnp.float32)
    mask = lengths_mask((7, 7, 7))
    base, _, _ = run(gru, intra, x, mask, None, reverse)
    j = 3
    before = slice(j + 1, S) if reverse else slice(0, j)  # positions read before j in scan order
    after = slice(0, j + 1) if reverse else slice(j, S)
    changed, _, _ = run(gru, intra, x.at[:, j].add(1.0), mask, None, reverse)
    np.testing.assert_array_equal(changed[:, before], base[:, before])
    assert float(jnp.min(jnp.max(jnp.abs(changed[:, after] - base[:, after]), axis=-1))) > 1e-4
    if not reverse:  # the same with a gradient (one compile suffices: the backward direction is a flip)
        cot = jnp.asarray(rng.normal(0, 1, (B, S, N)), jnp.float32).at[:, after].set(0.0)
        grad = layer_vjp(gru, intra, x, mask, jnp.zeros((B, N)), (cot, jnp.zeros((B, N))))[2]
        np.testing.assert_array_equal(grad[:, after], 0.0)  # d(earlier states)/d(x_j, later x) is exactly 0
        assert float(jnp.min(jnp.max(jnp.abs(grad[:, before]), axis=-1))) > 1e-6


def test_layer_gradients(rng):
    gru, intra = random_layer(rng)
    x = jnp.asarray(rng.normal(0, 1, (B, S, DIN)), jnp.float32)
    mask = lengths_mask(LENGTHS)  # padded sentences exercise the masked steps and keys
    h0 = jnp.asarray(rng.normal(0, 1, (B, N)), jnp.float32)
    f = lambda g, p, x, h0: run(g, p, x, mask, h0)[:2]
    f_vjp = lambda *args: (f(*args), lambda ct: layer_vjp(*args[:3], mask, args[3], ct))
    # float32 finite differences with eps=1e-3: truncation ~eps² plus rounding ~1e-7/eps per entry, hence 1e-2.
    jax.test_util.check_vjp(f, f_vjp, (gru, intra, x, h0), eps=1e-3, atol=1e-2, rtol=1e-2)
    cot = (jnp.asarray(rng.normal(0, 1, (B, S, N)), jnp.float32), jnp.ones((B, N)))
    grads = layer_vjp(gru, intra, x, mask, h0, cot)
    for leaf in jax.tree.leaves(grads):
        assert np.all(np.isfinite(np.asarray(leaf))) and float(jnp.max(jnp.abs(leaf))) > 0
    np.testing.assert_array_equal(grads[2][1, LENGTHS[1] :], 0.0)  # padded inputs are never read


def test_jit_vmap_and_leading_batch_axes(rng):
    gru, intra = random_layer(rng)
    x = jnp.asarray(rng.normal(0, 1, (B, S, DIN)), jnp.float32)
    mask = lengths_mask(LENGTHS)
    h0 = jnp.zeros((B, N))
    states, final, weights = run(gru, intra, x, mask, h0)
    # vmap over the batch == a Python loop over its rows (unbatched [S, Din] inputs).
    vmapped = jax.vmap(lambda x, m: intra_gru_scan(gru, intra, x, m)[0])(x, mask)
    for b in range(B):
        one = intra_gru_scan(gru, intra, x[b], mask[b])[0]
        assert_close_f32(vmapped[b], one, reduction=LAYER_REDUCTION)
        assert_close_f32(one, states[b], reduction=LAYER_REDUCTION)
    # Under jit, with two leading batch axes [1, B, S, Din] and a broadcast h0 [n]: the same as eagerly on [B, S, Din].
    s4, f4, w4 = jax.jit(
        lambda g, p, x: intra_gru_scan(g, p, x, mask[None], jnp.zeros(N), return_weights=True)
    )(gru, intra, x[None])
    assert_close_f32((s4[0], f4[0], w4[0]), (states, final, weights), reduction=LAYER_REDUCTION)


def test_low_precision_compute_is_finite_and_close(rng):
    # Large scores (params ×3 → energies of tens) with padding, bf16 matmul operands and bf16/fp16 inputs.
    gru, intra = random_layer(rng, scale=1.5)
    x = jnp.asarray(rng.normal(0, 1, (B, S, DIN)), jnp.float32)
    mask = lengths_mask(LENGTHS)
    ref, _, _ = run(gru, intra, x, mask)
    for in_dtype in (jnp.bfloat16, jnp.float16):
        states, final, weights = jax.jit(
            lambda g, p, x: intra_gru_scan(g, p, x, mask, dtype=jnp.bfloat16, return_weights=True)
        )(gru, intra, x.astype(in_dtype))
        assert states.dtype == jnp.float32 and weights.dtype == jnp.float32
        assert np.all(np.isfinite(np.asarray(states)))
        assert_valid_attention_weights(weights, read_before(mask, False))
        # bf16 rounds every matmul operand to 8 mantissa bits (2^-9 relative) at each of 7 recurrent steps, and
        # saturated tanh/sigmoid keep the states in [-1, 1]: a few percent of the scale, not 1e-5.
        assert rel_err(states, ref) < 1e-1


def test_layer_input_errors_are_value_errors(rng):
    gru, intra = random_layer(rng)
    x = jnp.ones((B, S, DIN))
    with pytest.raises(ValueError, match="mask"):
        intra_gru_scan(gru, intra, x, jnp.ones((B, S - 1), bool))
    with pytest.raises(ValueError, match="boolean"):
        intra_gru_scan(gru, intra, x, jnp.ones((B, S), jnp.float32))
    with pytest.raises(ValueError, match="input width"):
        intra_gru_scan(gru, intra, jnp.ones((B, S, DIN + 1)))
    with pytest.raises(ValueError, match="w_tilde"):
        intra_gru_scan(gru, {**intra, "w_tilde": jnp.ones((N + 1, A))}, x)
    with pytest.raises(ValueError, match="need"):
        intra_gru_scan(gru, {k: v for k, v in intra.items() if k != "b"}, x)
    with pytest.raises(ValueError, match="attention_dim"):
        init_intra_params(jax.random.key(0), 3, 4, 0)


def test_module_docstring_examples():
    result = doctest.testmod(intra_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_modules_hold_named_params():
    layer = nnx.eval_shape(lambda: IntraGRU(DIN, N, A, rngs=nnx.Rngs(0)))
    names = {
        "/".join(path): v.get_metadata()["out_sharding"]
        for path, v in nnx.to_flat_state(nnx.state(layer, nnx.Param))
    }
    assert {k: v for k, v in names.items() if k.startswith("attention")} == {
        "attention/b": ("align",),
        "attention/v": ("align",),
        "attention/w_h": ("hidden", "align"),
        "attention/w_tilde": ("hidden", "align"),
        "attention/w_x": ("embed", "align"),
    }, names
    # BidirectionalIntraGRU's outputs are checked end to end by the RNNsearch float64 test below.
    bi = nnx.eval_shape(lambda: BidirectionalIntraGRU(DIN, N, A, rngs=nnx.Rngs(0)))
    assert isinstance(bi.forward, IntraGRU) and isinstance(bi.backward, IntraGRU)
    assert bi.forward.attention["w_tilde"].shape == (N, A) and bi.forward.cell.hidden == N


# ----------------------------------------------------------------------------------------------------- the models

_VARIANTS = {}


def variant(arch):
    """``(compiled model with intra_attention=True, batch, teacher-forced logits, attention)``, built once."""
    if arch not in _VARIANTS:
        compiled = Compiled(make_model(arch, intra_attention=True))
        batch = make_batch()
        _VARIANTS[arch] = (compiled, batch, *compiled.forward(*batch))
    return _VARIANTS[arch]


@pytest.mark.parametrize("arch", ["rnnsearch", "rnnenc"])
def test_model_forward_matches_float64_reference(arch, monkeypatch):
    compiled, (src, mask, tgt_in), logits, attn = variant(arch)
    # The models' references with each encoder GRU replaced by the intra-attention loop (decoder unchanged).
    monkeypatch.setattr(rnn_reference, "gru_sequence_ref", intra_states_ref)
    params = intra_model_params(pure_params(compiled.model))
    assert logits.shape == (B, 5, KY) and logits.dtype == jnp.float32
    if arch == "rnnsearch":
        ref, ref_attn = rnn_reference.rnnsearch_ref(params, src, mask, tgt_in)
        assert rel_err(attn, ref_attn) < 1e-5
        assert_valid_attention_weights(attn, mask[:, None, :])
    else:
        ref = rnn_reference.rnnenc_ref(params, src, mask, tgt_in)
        assert attn is None
    # float32 through 7 intra-attention encoder steps and 5 decoder steps of width 11-22: rounding stays ~1e-6.
    assert rel_err(logits, ref) < 1e-5
    assert np.std(ref) > 0.1
    # The reference really is the intra one: the plain-GRU reference on the same GRU weights disagrees.
    monkeypatch.undo()
    plain = dict(params)
    if arch == "rnnsearch":
        plain["encoder"] = {
            d: {"params": params["encoder"][d]["params"]["gru"]} for d in ("forward", "backward")
        }
        assert rel_err(rnn_reference.rnnsearch_ref(plain, src, mask, tgt_in)[0], ref) > 1e-3
    else:
        plain["encoder"] = {"params": params["encoder"]["params"]["gru"]}
        assert rel_err(rnn_reference.rnnenc_ref(plain, src, mask, tgt_in), ref) > 1e-3


@pytest.mark.parametrize("arch", ["rnnsearch", "rnnenc"])
def test_model_decode_step_equals_teacher_forcing(arch):
    compiled, batch, logits, attn = variant(arch)
    step_logits, step_attn = compiled.step_loop(*batch)
    assert_close_f32(step_logits, logits, reduction=INTRA_MODEL_REDUCTION)  # a loop of steps vs a scan
    if arch == "rnnsearch":
        assert_close_f32(step_attn, attn, reduction=INTRA_MODEL_REDUCTION)
    else:
        assert step_attn is None


@pytest.mark.parametrize("arch", ["rnnsearch", "rnnenc"])
def test_model_encode_is_padding_invariant(arch):
    compiled, (src, mask, tgt_in), _, _ = variant(arch)
    enc, _ = compiled.start(src, mask)
    junk, _ = compiled.start(jnp.where(mask, src, 5), mask)  # junk ids in the padding must not matter
    for a, b in zip(jax.tree.leaves(enc), jax.tree.leaves(junk), strict=True):
        np.testing.assert_array_equal(a, b)  # the same program; padding is never read
    b, n = 1, LENGTHS[1]  # sentence 1 (4 of 7 words) alone, without padding: another program
    one, _ = compiled.start(src[b : b + 1, :n], mask[b : b + 1, :n])
    assert_close_f32(enc.summary[b], one.summary[0], reduction=INTRA_MODEL_REDUCTION)
    if arch == "rnnsearch":
        assert_close_f32(enc.memory[b, :n], one.memory[0], reduction=INTRA_MODEL_REDUCTION)
        assert np.all(np.asarray(enc.memory[b, n:]) == 0)


@pytest.mark.parametrize("arch", ["rnnsearch", "rnnenc"])
def test_model_gradients_are_finite_and_reach_the_intra_scorer(arch):
    compiled, (src, mask, tgt_in), _, _ = variant(arch)
    graphdef, params = nnx.split(compiled.model, nnx.Param)

    @jax.jit
    def grad(p):
        # Through the step interface: encode, s_0 and one decoder step. The decoder's own gradients are tested
        # with the plain encoder; one step keeps this program small while every encoder parameter matters.
        def loss(p):
            model = nnx.merge(graphdef, p)
            enc = model.encode(src, mask)
            logits, _, _ = model.decode_step(enc, model.init_decoder_state(enc), tgt_in[:, 0])
            return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[:, 0])

        return jax.grad(loss)(p)

    g = nnx.to_pure_dict(grad(params))
    for leaf in jax.tree.leaves(g):
        assert np.all(np.isfinite(np.asarray(leaf)))
    scorers = (
        [g["encoder"]["attention"]]
        if arch == "rnnenc"
        else [g["encoder"][d]["attention"] for d in ("forward", "backward")]
    )
    for scorer in scorers:
        for name, leaf in scorer.items():
            assert float(jnp.max(jnp.abs(leaf))) > 1e-6, name


def test_model_encoder_is_a_scan_not_a_python_loop():
    model = make_model("rnnsearch", intra_attention=True)

    def count(s):
        src, mask = jnp.zeros((B, s), jnp.int32), jnp.ones((B, s), bool)
        return len(jax.make_jaxpr(lambda: model.encode(src, mask))().jaxpr.eqns)

    assert count(3) == count(9)


# ------------------------------------------------------------------------------------------------- config, default


def test_config_validation():
    cfg = RNNConfig(src_vocab=5, tgt_vocab=5)
    assert cfg.intra_attention is False
    assert RNNConfig(src_vocab=5, tgt_vocab=5, intra_attention=False) == cfg
    assert cfg.replace(intra_attention=True).intra_attention is True
    assert RNNConfig(src_vocab=5, tgt_vocab=5, arch="rnnenc", intra_attention=True).intra_attention
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="intra_attention must be a bool"):
            RNNConfig(src_vocab=5, tgt_vocab=5, intra_attention=bad)
    with pytest.raises(ValueError, match="intra_attention"):
        cfg.replace(intra_attention="true")


def _param_shapes(cfg):
    abstract = nnx.eval_shape(lambda: build_model(cfg, rngs=nnx.Rngs(0)))
    flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))[0]
    return {"/".join(k.key for k in path): tuple(x.shape) for path, x in flat}


@pytest.mark.parametrize("arch", ["rnnsearch", "rnnenc"])
def test_default_off_leaves_the_parameters_unchanged(arch):
    m, n, a = SIZES["embed"], SIZES["hidden"], SIZES["align"]
    sizes = dict(src_vocab=KX, tgt_vocab=KY, arch=arch, **{k: v for k, v in SIZES.items()})
    off, on = _param_shapes(RNNConfig(**sizes)), _param_shapes(RNNConfig(**sizes, intra_attention=True))
    gru = {"w_x": (m, 3, n), "u": (n, 3, n), "b": (3, n)}
    scorer = {"w_h": (n, a), "w_x": (m, a), "w_tilde": (n, a), "v": (a,), "b": (a,)}
    directions = ["encoder/forward/", "encoder/backward/"] if arch == "rnnsearch" else ["encoder/"]
    # Off: the encoder is the papers' plain GRU(s), parameter for parameter.
    assert {k: v for k, v in off.items() if k.startswith("encoder/")} == {
        f"{d}params/{k}": s for d in directions for k, s in gru.items()
    }
    # On: the same GRU weights under `cell`, one scorer per direction, and nothing else changes.
    want_on = {f"{d}cell/params/{k}": s for d in directions for k, s in gru.items()}
    want_on |= {f"{d}attention/{k}": s for d in directions for k, s in scorer.items()}
    assert {k: v for k, v in on.items() if k.startswith("encoder/")} == want_on
    assert {k: v for k, v in off.items() if not k.startswith("encoder/")} == {
        k: v for k, v in on.items() if not k.startswith("encoder/")
    }


def test_default_paper_preset_is_unchanged():
    # The paper presets' parameter counts (tests/test_models_rnn.py derives them from appendix A) hold with the
    # new field at its default; turning it on adds 2·(2·n·n' + m·n' + 2·n') for RNNsearch's two directions.
    counts = {}
    for intra in (False, True):
        abstract = nnx.eval_shape(
            lambda intra=intra: build_model(paper_config(intra_attention=intra), rngs=nnx.Rngs(0))
        )
        counts[intra] = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert counts[False] == 80_443_000
    assert counts[True] - counts[False] == 2 * (2 * 1000 * 1000 + 620 * 1000 + 2 * 1000)
