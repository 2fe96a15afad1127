"""Token-level cross-entropy: float64 loop reference, label smoothing by hand, pads ignored, padded == unpadded."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_jax.models import small_config
from attn_jax.train import build_module, init_params, loss_sums, sentence_losses, token_cross_entropy
from tests.tolerance import assert_close_f32

B, T, V = 3, 5, 7


def _reference(logits, labels, mask, eps):
    """float64, loop by loop: per-sentence sums of the smoothed CE and of the NLL over real tokens."""
    logits = np.asarray(logits, np.float64)
    loss = np.zeros(logits.shape[0])
    nll = np.zeros(logits.shape[0])
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            if not mask[b, t]:
                continue
            z = logits[b, t]
            log_p = z - (np.max(z) + np.log(np.sum(np.exp(z - np.max(z)))))
            q = np.full(z.shape, eps / z.shape[0])
            q[labels[b, t]] += 1.0 - eps
            loss[b] += -np.sum(q * log_p)
            nll[b] += -log_p[labels[b, t]]
    return loss, nll


@pytest.fixture
def batch(rng):
    logits = rng.normal(size=(B, T, V)).astype(np.float32) * 3
    labels = rng.integers(0, V, size=(B, T)).astype(np.int32)
    lengths = np.array([5, 2, 3])
    mask = np.arange(T)[None, :] < lengths[:, None]
    return logits, labels, mask


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_sentence_losses_match_float64_reference(batch, eps):
    logits, labels, mask = batch
    loss, nll = sentence_losses(logits, labels, mask, label_smoothing=eps)
    ref_loss, ref_nll = _reference(logits, labels, mask, eps)
    # float32 log-softmax of logits ~N(0, 9): |error| ~1e-6 per token, sums of <= 5 tokens.
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nll, ref_nll, rtol=1e-5, atol=1e-5)
    s = loss_sums(logits, labels, mask, label_smoothing=eps)
    assert float(s.tokens) == 10.0 and float(s.sentences) == 3.0
    np.testing.assert_allclose(float(s.loss), ref_loss.sum(), rtol=1e-5)
    np.testing.assert_allclose(float(s.nll), ref_nll.sum(), rtol=1e-5)


def test_label_smoothing_by_hand():
    # V = 4, logits (0, log 3, 0, 0): p = (1/6, 1/2, 1/6, 1/6); label 1, eps = 0.2.
    logits = jnp.log(jnp.array([[1.0, 3.0, 1.0, 1.0]]))
    loss, nll = token_cross_entropy(logits, jnp.array([1]), label_smoothing=0.2)
    q = np.array([0.05, 0.85, 0.05, 0.05])  # 0.8 * onehot + 0.2 / 4
    p = np.array([1 / 6, 1 / 2, 1 / 6, 1 / 6])
    np.testing.assert_allclose(float(loss[0]), -np.sum(q * np.log(p)), rtol=1e-6)
    np.testing.assert_allclose(float(nll[0]), np.log(2.0), rtol=1e-6)


def test_pads_are_ignored_even_when_non_finite(batch):
    logits, labels, mask = batch
    poisoned = np.where(mask[..., None], logits, np.nan).astype(np.float32)
    poisoned[~mask, 0] = np.inf
    garbage_labels = np.where(mask, labels, 0)
    a = loss_sums(logits, labels, mask, label_smoothing=0.1)
    b = loss_sums(poisoned, garbage_labels, mask, label_smoothing=0.1)
    for x, y in zip(a, b, strict=True):
        assert np.isfinite(float(y))
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # the same program; pads are never read


def test_padding_rows_are_not_sentences(batch):
    logits, labels, mask = batch
    mask = mask.copy()
    mask[1] = False  # a padding row (example_id == -1 in a batch)
    s = loss_sums(logits, labels, mask)
    assert float(s.sentences) == 2.0 and float(s.tokens) == 8.0


def test_gradient_ignores_pads(batch):
    logits, labels, mask = batch
    grad = jax.grad(lambda z: loss_sums(z, labels, mask, label_smoothing=0.1).loss)(jnp.asarray(logits))
    assert np.all(np.asarray(grad)[~mask] == 0.0)
    assert np.all(np.abs(np.asarray(grad)[mask]).sum(-1) > 0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="label_smoothing"):
        token_cross_entropy(jnp.zeros((2, 3)), jnp.zeros((2,), int), label_smoothing=1.0)
    with pytest.raises(ValueError, match=r"logits \[2, 3\]"):
        token_cross_entropy(jnp.zeros((2, 3)), jnp.zeros((3,), int))


@pytest.mark.slow  # four forward compilations (~10 s on 2 loaded cores); the loss alone is tested above
def test_padded_batch_loss_equals_unpadded_sentences(rng):
    """The trainer's loss of a padded batch, per sentence, equals each sentence's loss computed alone (RNNsearch;
    tests/test_models_rnn.py checks both models' padding invariance itself)."""
    cfg = small_config("rnnsearch", src_vocab=23, tgt_vocab=19, embed=8, hidden=12, maxout=6, align=10)
    # The trainer's parameter tree (init_params traced, not compiled: its initialiser alone costs ~6 s to
    # compile), every leaf drawn from N(0, 0.5²) with NumPy: every parameter matters (at the paper's N(0, 0.01²)
    # every logit is ~1e-5 and the losses are all ~log V, which a padding bug would barely move).
    key_rng = np.random.default_rng(3)
    params = jax.tree.map(
        lambda s: key_rng.normal(0.0, 0.5, s.shape).astype(s.dtype),
        jax.eval_shape(lambda: init_params(cfg, jax.random.key(3))),
    )

    @jax.jit  # one compiled program per shape instead of op-by-op dispatch
    def model(src, src_mask, tgt_in):
        return build_module(cfg, params)(src, src_mask, tgt_in)

    src_lens, tgt_lens = [7, 3, 5], [4, 6, 2]
    S, T_ = 9, 8  # padded lengths, longer than every sentence
    src = np.zeros((3, S), np.int32)
    tgt_in = np.zeros((3, T_), np.int32)
    tgt_out = np.zeros((3, T_), np.int32)
    for b in range(3):
        src[b, : src_lens[b]] = rng.integers(4, 23, src_lens[b])
        words = rng.integers(4, 19, tgt_lens[b])
        tgt_in[b, 0], tgt_in[b, 1 : tgt_lens[b]] = 1, words[:-1]
        tgt_out[b, : tgt_lens[b]] = words
    src_mask = np.arange(S)[None] < np.array(src_lens)[:, None]
    tgt_mask = np.arange(T_)[None] < np.array(tgt_lens)[:, None]
    logits, _ = model(jnp.asarray(src), jnp.asarray(src_mask), jnp.asarray(tgt_in))
    padded, padded_nll = sentence_losses(logits, tgt_out, tgt_mask, label_smoothing=0.1)
    for b in range(3):
        s, t = src_lens[b], tgt_lens[b]
        one, _ = model(
            jnp.asarray(src[b : b + 1, :s]), jnp.ones((1, s), bool), jnp.asarray(tgt_in[b : b + 1, :t])
        )
        alone, alone_nll = sentence_losses(
            one, tgt_out[b : b + 1, :t], np.ones((1, t), bool), label_smoothing=0.1
        )
        # Same math on differently shaped arrays (two programs): float32 rounding over the model's longest chain
        # (S GRU steps over m + n; T decoder steps: m + 3n, 2n + n', softmax and context over S, m + 3n), the
        # V-way log-softmax and the sum over the sentence's tokens.
        n = S * (8 + 12) + T_ * ((8 + 36) + (24 + 10) + 2 * S + (8 + 36)) + 19 + T_
        assert_close_f32((padded[b], padded_nll[b]), (alone[0], alone_nll[0]), reduction=n)
    total = loss_sums(logits, tgt_out, tgt_mask)
    # loss_sums and a sum of sentence_losses: two programs summing the B·T per-token losses in their own orders
    assert_close_f32(total.nll, jnp.sum(padded_nll), reduction=3 * T_ + 19)
    assert float(total.tokens) == sum(tgt_lens)
