"""The Pallas flash kernel (``implementation="pallas"``), run by Pallas' interpreter on the CPU.

Values and gradients against the float64 references of tests/reference at float32 tolerance: padding as
lengths, causal, a sliding window, grouped-query heads, ``T != S``, and ``T``, ``S``, ``K`` that are not
multiples of the blocks. Blocks of 16 here, so every case spans several blocks and padded ones. Then
properties (padded == truncated, NaN in padding changes nothing), the refusals, and ``implementation="auto"``.
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import attn_jax.attention._cudnn as cudnn_module
import attn_jax.attention._dispatch as dispatch_module
import attn_jax.attention._pallas as pallas_module
from attn_jax.attention import dot_product_attention, dot_product_implementation
from tests.reference.chunked import attention_grads_ref, gqa_attention_grads_ref
from tests.reference.masks_dot import causal_mask_ref, dot_attention_ref, gqa_attention_ref, padding_mask_ref
from tests.tolerance import assert_close_f32

# Odd, distinct sizes, none a multiple of the 16-row blocks: B=2, H=3 (or 4 over G=2), T=37, S=53, K=11, Kv=5.
B, H, T, S, K, KV = 2, 3, 37, 53, 11, 5
Q_LENGTHS = np.array([[30], [37]])  # [B, 1]: per sentence, shared by the heads
K_LENGTHS = np.array([[50], [0]])  # sentence 1 has no key: every query of it is fully masked
WINDOW = (5, 3)


@pytest.fixture(autouse=True, scope="module")
def small_blocks():
    """16 x 16 blocks: T = 37 and S = 53 span 3 and 4 blocks, the last of each padded.

    Module-scoped (hypothesis refuses function-scoped fixtures), and read when a program is traced.
    """
    saved = pallas_module.BLOCK_Q, pallas_module.BLOCK_K
    pallas_module.BLOCK_Q = pallas_module.BLOCK_K = 16
    yield
    pallas_module.BLOCK_Q, pallas_module.BLOCK_K = saved


def _normal(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _window_ref(t, s, left, right):
    """``m[i, j] = i - left <= j <= i + right``, one entry at a time."""
    return np.array([[i - left <= j <= i + right for j in range(s)] for i in range(t)])


def _allowed_ref(t, s, *, causal=False, window=None, q_lengths=None, k_lengths=None):
    """The pairs attention may read, ``[B|1, 1, T, S]``, from the float64 references' own masks."""
    allowed = np.ones((1, 1, t, s), bool)
    if causal:
        allowed = allowed & causal_mask_ref(t, s)
    if window is not None:
        allowed = allowed & _window_ref(t, s, *window)
    if q_lengths is not None:
        allowed = allowed & padding_mask_ref(q_lengths, t)[..., :, None]
    if k_lengths is not None:
        allowed = allowed & padding_mask_ref(k_lengths, s)[..., None, :]
    return allowed


def _vjp(**options):
    """``(q, k, v, g) -> (out, (dq, dk, dv))`` of ``Σ g · attention``, jitted, on the Pallas path."""

    @jax.jit
    def run(q, k, v, g):
        out, vjp = jax.vjp(
            lambda q, k, v: dot_product_attention(q, k, v, implementation="pallas", **options), q, k, v
        )
        return out, vjp(g)

    return run


CASES = {
    "full": dict(),
    "causal, lengths": dict(causal=True, query_lengths=Q_LENGTHS, key_lengths=K_LENGTHS),
    "window, key lengths": dict(local_window=WINDOW, key_lengths=K_LENGTHS),
    "gqa, causal, T > S": dict(num_kv_heads=2, causal=True, key_lengths=K_LENGTHS),
}


@pytest.mark.parametrize("case", list(CASES))
def test_values_and_grads_match_float64_reference(rng, case):
    options = CASES[case]
    grouped = "num_kv_heads" in options
    t, s = (S, T) if grouped else (T, S)  # T > S once
    heads, kv_heads = (4, 2) if grouped else (H, 1)  # without GQA, one key shared by the heads (broadcast)
    q, k, v = (
        _normal(rng, (B, heads, t, K)),
        _normal(rng, (B, kv_heads, s, K)),
        _normal(rng, (B, heads, s, KV)),
    )
    if grouped:
        v = _normal(rng, (B, kv_heads, s, KV))
    g = _normal(rng, (B, heads, t, KV))
    out, grads = _vjp(**options)(q, k, v, g)

    allowed = _allowed_ref(
        t,
        s,
        causal=options.get("causal", False),
        window=options.get("local_window"),
        q_lengths=options.get("query_lengths"),
        k_lengths=options.get("key_lengths"),
    )
    if grouped:
        out_ref, _ = gqa_attention_ref(q, k, v, 2, allowed)
        grads_ref = gqa_attention_grads_ref(q, k, v, g, 2, allowed)
    else:
        out_ref, _ = dot_attention_ref(q, k, v, allowed)
        grads_ref = attention_grads_ref(q, k, v, g, allowed)[:3]
    assert out.dtype == jnp.float32 and out.shape == (B, heads, t, KV)
    # float32 vs float64: logits over K, then the softmax and the context over S.
    assert_close_f32(out, out_ref, reduction=K + 2 * s)
    # The gradients add dP over Kv, the row sums Δ over Kv, and dK, dV sum over the T queries.
    for name, grad, ref in zip(("dq", "dk", "dv"), grads, grads_ref, strict=True):
        assert grad.shape == ref.shape, name
        assert_close_f32(grad, ref, reduction=K + 2 * s + KV + t, err_msg=name)

    # Queries with no visible key (sentence 1 has none): zero context, zero dq, finite gradients.
    dead = ~np.broadcast_to(allowed, (B, heads, t, s)).any(-1)
    if "key_lengths" in options:
        assert dead[1].all()
    assert np.all(np.asarray(out)[dead] == 0.0)
    assert np.all(np.asarray(grads[0])[dead] == 0.0)
    assert all(np.all(np.isfinite(x)) for x in grads)


@pytest.mark.numerics
def test_pallas_matches_xla_and_chunked(rng):
    # Three float32 programs of one function: the interpreted kernel, the plain path and the blocked one.
    q, k, v = _normal(rng, (B, H, T, K)), _normal(rng, (B, H, S, K)), _normal(rng, (B, H, S, KV))
    g = _normal(rng, (B, H, T, KV))
    options = dict(causal=True, query_lengths=Q_LENGTHS, key_lengths=K_LENGTHS)
    out, grads = _vjp(**options)(q, k, v, g)
    for other in ("xla", "chunked"):

        def attention(q, k, v, other=other):
            return dot_product_attention(q, k, v, implementation=other, **options)

        want, vjp = jax.vjp(attention, q, k, v)
        assert_close_f32(out, want, reduction=K + 2 * S, err_msg=other)
        assert_close_f32(grads, vjp(g), reduction=K + 2 * S + KV + T, err_msg=other)


@jax.jit
def _with_lengths(q, k, v, g, query_lengths, key_lengths):
    """One compiled program for any lengths: they are values, so hypothesis reruns it without tracing."""
    out, vjp = jax.vjp(
        lambda q, k, v: dot_product_attention(
            q, k, v, implementation="pallas", query_lengths=query_lengths, key_lengths=key_lengths
        ),
        q,
        k,
        v,
    )
    return out, vjp(g)


@given(
    q_len=st.integers(-1, T + 2),
    k_len=st.integers(-1, S + 2),
    seed=st.integers(0, 2**16),
)
def test_padding_is_as_if_truncated(q_len, k_len, seed):
    # Padded == truncated, for every length: queries past q_len get zeros, keys past k_len weigh nothing.
    rng = np.random.default_rng(seed)
    q, k, v = _normal(rng, (1, 1, T, K)), _normal(rng, (1, 1, S, K)), _normal(rng, (1, 1, S, KV))
    g = _normal(rng, (1, 1, T, KV))
    lengths = np.array([[q_len]], np.int32), np.array([[k_len]], np.int32)
    out, (dq, dk, dv) = _with_lengths(q, k, v, g, *lengths)
    allowed = _allowed_ref(T, S, q_lengths=[[max(q_len, 0)]], k_lengths=[[max(k_len, 0)]])
    out_ref, _ = dot_attention_ref(q, k, v, allowed)
    dq_ref, dk_ref, dv_ref, _ = attention_grads_ref(q, k, v, g, allowed)
    assert_close_f32(out, out_ref, reduction=K + 2 * S)
    assert_close_f32((dq, dk, dv), (dq_ref, dk_ref, dv_ref), reduction=K + 2 * S + KV + T)


def test_nan_in_padding_changes_nothing(rng):
    # Rows past the lengths are zeroed before the kernel reads them: NaN there reaches no output or gradient.
    q, k, v = _normal(rng, (B, H, T, K)), _normal(rng, (B, 1, S, K)), _normal(rng, (B, H, S, KV))
    g = _normal(rng, (B, H, T, KV))
    run = _vjp(causal=True, query_lengths=Q_LENGTHS, key_lengths=K_LENGTHS)
    clean = run(q, k, v, g)
    q_nan, k_nan, v_nan = q.copy(), k.copy(), v.copy()
    q_nan[0, :, 30:] = np.nan
    k_nan[0, :, 50:] = np.nan
    v_nan[1] = np.inf  # sentence 1 has no key at all
    dirty = run(q_nan, k_nan, v_nan, g)
    # The same compiled program on inputs that differ only where its weights are exact zeros.
    jax.tree.map(np.testing.assert_array_equal, dirty, clean)


def test_bfloat16_matches_reference_to_bfloat16_precision(rng):
    q, k, v = (_normal(rng, (B, H, n, K)).astype(jnp.bfloat16) for n in (T, S, S))
    out = dot_product_attention(q, k, v, causal=True, key_lengths=K_LENGTHS, implementation="pallas")
    assert out.dtype == jnp.bfloat16
    allowed = _allowed_ref(T, S, causal=True, k_lengths=K_LENGTHS)
    want, _ = dot_attention_ref(*(np.asarray(x, np.float32) for x in (q, k, v)), allowed)
    # P is rounded to bfloat16 (8 bits) before it multiplies V, and the context is returned in bfloat16.
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=3e-2 * np.abs(want).max())


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (dict(mask=np.ones((T, S), bool)), ["implementation='pallas' does not apply", "boolean mask"]),
        (dict(bias=np.zeros((T, S), np.float32)), ["implementation='pallas' does not apply", "a bias"]),
        (dict(return_weights=True), ["return_weights=True needs implementation='xla'"]),
        (dict(normalizer="entmax15"), ["needs implementation='xla'"]),
    ],
)
def test_what_the_kernel_does_not_read_is_refused(rng, options, words):
    q = _normal(rng, (T, K))
    k = _normal(rng, (S, K))
    with pytest.raises(ValueError) as info:
        dot_product_attention(q, k, k, implementation="pallas", **options)
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_traced_scale_and_odd_blocks_are_refused(rng, monkeypatch):
    q = _normal(rng, (T, K))
    with pytest.raises(ValueError, match="'pallas' does not apply: it needs a static scale"):
        jax.jit(lambda s: dot_product_attention(q, q, q, scale=s, implementation="pallas"))(1.0)
    monkeypatch.setattr(pallas_module, "BLOCK_K", 24)
    with pytest.raises(ValueError, match="Pallas blocks must be powers of two from 16, got 24"):
        dot_product_attention(q, q, q, implementation="pallas")


# --- implementation="auto" ----------------------------------------------------------------------------------


def test_auto_runs_chunked_on_the_cpu_and_says_so(rng, caplog):
    q, k, v = _normal(rng, (B, H, T, K)), _normal(rng, (B, H, S, K)), _normal(rng, (B, H, S, KV))
    choice, reason = dot_product_implementation(q, k, v, key_lengths=K_LENGTHS, implementation="auto")
    assert choice == "chunked" and reason.startswith("on the CPU 'auto' runs 'chunked'")
    dispatch_module._AUTO_REPORTED.clear()
    with caplog.at_level(logging.INFO, logger="attn_jax.attention"):
        auto = dot_product_attention(q, k, v, key_lengths=K_LENGTHS, implementation="auto")
        dot_product_attention(q, k, v, key_lengths=K_LENGTHS, implementation="auto")
    assert [r.getMessage() for r in caplog.records] == [f"dot_product_attention: {reason}"]  # once
    chunked = dot_product_attention(q, k, v, key_lengths=K_LENGTHS, implementation="chunked")
    np.testing.assert_array_equal(auto, chunked)  # the same program
    # implementation=None keeps its own rule: at these sizes, "xla".
    assert dot_product_implementation(q, k, v, key_lengths=K_LENGTHS)[0] == "xla"


def test_auto_picks_pallas_on_a_tpu_and_cudnn_on_a_gpu(monkeypatch):
    # The rule reads only the backend's name (and cuDNN's check its device), so both are faked here.
    f32, bf16 = jnp.ones((2, 3, 16, 8)), jnp.ones((2, 3, 16, 8), jnp.bfloat16)
    mask = np.ones((16, 16), bool)
    monkeypatch.setattr(dispatch_module, "_backend", lambda: "tpu")
    assert dot_product_implementation(f32, f32, f32, implementation="auto") == (
        "pallas",
        "on a TPU 'auto' runs the Pallas kernel",
    )
    choice, reason = dot_product_implementation(f32, f32, f32, mask, implementation="auto")
    assert choice == "chunked" and "the Pallas kernel does not apply, as a boolean mask" in reason
    monkeypatch.setattr(dispatch_module, "_backend", lambda: "gpu")
    monkeypatch.setattr(
        cudnn_module, "_cuda_device", lambda: type("Device", (), {"compute_capability": "9.0"})
    )
    assert dot_product_implementation(bf16, bf16, bf16, implementation="auto")[0] == "cudnn"
    choice, reason = dot_product_implementation(f32, f32, f32, implementation="auto")
    assert choice == "pallas" and "bfloat16 or all float16" in reason  # why not cuDNN
    grouped = dot_product_implementation(
        bf16, bf16[:, :1], bf16[:, :1], num_kv_heads=1, implementation="auto"
    )
    assert grouped[0] == "pallas"
    assert (
        dot_product_implementation(bf16, bf16, bf16, return_weights=True, implementation="auto")[0] == "xla"
    )


def test_dot_product_implementation_takes_only_auto_or_none():
    q = jnp.ones((4, 8))
    with pytest.raises(ValueError, match="implementation must be 'auto' or None, got 'pallas'"):
        dot_product_implementation(q, q, q, implementation="pallas")
