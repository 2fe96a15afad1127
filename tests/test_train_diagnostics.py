"""Attention diagnostics against a float64 loop reference, and on weights whose answers are known by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_jax.train import DIAG_BAND, attention_stats, summarize_attention
from tests.tolerance import assert_close_f32

B, T, S = 3, 5, 7


def _reference(w, src_mask, tgt_mask, gold=None):
    """float64, loop by loop, straight from the definitions in attn_jax/train/_diagnostics.py."""
    w = np.asarray(w, np.float64)
    ent, ent_norm, band, xs, ys = [], [], [], [], []
    cov_dev, cov_low, gold_mass, gold_hit = [], [], [], []
    cells = zeros = 0
    for b in range(w.shape[0]):
        s_len, t_len = int(src_mask[b].sum()), int(tgt_mask[b].sum())
        cov = np.zeros(w.shape[2])
        for j in range(w.shape[1]):
            if not tgt_mask[b, j]:
                continue
            row = [w[b, j, i] if src_mask[b, i] else 0.0 for i in range(w.shape[2])]
            for i in range(w.shape[2]):
                if src_mask[b, i]:
                    cells += 1
                    zeros += int(w[b, j, i] == 0.0)
            h = -sum(a * np.log(a) for a in row if a > 0)
            ent.append(h)
            ent_norm.append(h / np.log(s_len) if s_len > 1 else 0.0)
            v = (j + 0.5) / t_len
            band.append(sum(a for i, a in enumerate(row) if abs((i + 0.5) / s_len - v) <= DIAG_BAND + 1e-6))
            top = int(np.argmax(row))
            xs.append(v)
            ys.append((top + 0.5) / s_len)
            for i, a in enumerate(row):
                cov[i] += a
            if gold is not None and any(gold[b, j, i] and src_mask[b, i] for i in range(w.shape[2])):
                gold_mass.append(sum(a for i, a in enumerate(row) if gold[b, j, i]))
                gold_hit.append(float(gold[b, j, top]))
        for i in range(w.shape[2]):
            if src_mask[b, i]:
                cov_dev.append(abs(cov[i] - 1.0))
                cov_low.append(float(cov[i] < 0.5))
    corr = np.corrcoef(xs, ys)[0, 1] if np.std(xs) > 1e-6 and np.std(ys) > 1e-6 else None
    out = {
        "attn_entropy": np.mean(ent),
        "attn_entropy_norm": np.mean(ent_norm),
        "attn_coverage_dev": np.mean(cov_dev),
        "attn_coverage_low": np.mean(cov_low),
        "attn_diag_band": np.mean(band),
        "attn_zero_share": zeros / max(cells, 1),
        "attn_diag_corr": corr,
    }
    if gold_mass:
        out["attn_gold_mass"] = np.mean(gold_mass)
        out["attn_gold_hit"] = np.mean(gold_hit)
    return out


def _masks():
    src_mask = np.arange(S)[None] < np.array([7, 4, 1])[:, None]
    tgt_mask = np.arange(T)[None] < np.array([5, 3, 2])[:, None]
    return src_mask, tgt_mask


def _softmax_weights(rng, src_mask, scale=2.0):
    logits = rng.normal(size=(B, T, S)) * scale
    logits = np.where(src_mask[:, None, :], logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)).astype(np.float32)


def _close(got, want):
    assert got.keys() == want.keys()
    for k in want:
        if want[k] is None:
            assert got[k] is None, k
        else:
            # float32 weights and sums of <= 35 terms vs float64.
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_random_weights_match_float64_reference(rng):
    src_mask, tgt_mask = _masks()
    w = _softmax_weights(rng, src_mask)
    gold = rng.random((B, T, S)) < 0.2
    _close(
        summarize_attention(attention_stats(w, src_mask, tgt_mask, gold)),
        _reference(w, src_mask, tgt_mask, gold),
    )
    _close(summarize_attention(attention_stats(w, src_mask, tgt_mask)), _reference(w, src_mask, tgt_mask))


def test_uniform_weights_by_hand():
    src_mask, tgt_mask = _masks()
    s_len = src_mask.sum(1)
    w = np.where(src_mask[:, None, :], 1.0 / s_len[:, None, None], 0.0).astype(np.float32)
    w = np.broadcast_to(w, (B, T, S))
    d = summarize_attention(attention_stats(w, src_mask, tgt_mask))
    rows = tgt_mask.sum(1)  # 5, 3, 2 rows; S_b = 7, 4, 1
    np.testing.assert_allclose(d["attn_entropy"], (5 * np.log(7) + 3 * np.log(4) + 2 * 0.0) / 10, rtol=1e-6)
    np.testing.assert_allclose(
        d["attn_entropy_norm"], (5 + 3 + 0) / 10, rtol=1e-6
    )  # log(1) = 0 -> counted as 0
    # coverage of each real source word = T_b / S_b
    cov = np.concatenate([np.full(s, t / s) for s, t in zip(s_len, rows, strict=True)])
    np.testing.assert_allclose(d["attn_coverage_dev"], np.mean(np.abs(cov - 1)), rtol=1e-6)
    assert d["attn_coverage_low"] == pytest.approx(np.mean(cov < 0.5))


def test_monotone_and_reversed_alignments():
    n = 6
    eye = np.eye(n, dtype=np.float32)[None]
    ones = np.ones((1, n), bool)
    d = summarize_attention(attention_stats(eye, ones, ones, gold=eye.astype(bool)))
    assert d["attn_entropy"] == 0.0 and d["attn_coverage_dev"] == 0.0 and d["attn_coverage_low"] == 0.0
    assert d["attn_diag_band"] == pytest.approx(1.0) and d["attn_diag_corr"] == pytest.approx(1.0)
    assert d["attn_gold_mass"] == pytest.approx(1.0) and d["attn_gold_hit"] == 1.0
    assert d["attn_zero_share"] == pytest.approx((n * n - n) / (n * n))  # all but the diagonal is exactly 0
    rev = eye[:, ::-1].copy()
    d = summarize_attention(attention_stats(rev, ones, ones, gold=eye.astype(bool)))
    assert d["attn_diag_corr"] == pytest.approx(-1.0)
    assert d["attn_gold_hit"] == 0.0 and d["attn_gold_mass"] == 0.0
    # collapse: every target word attends the last source position (</s>)
    last = np.zeros((1, n, n), np.float32)
    last[..., -1] = 1.0
    d = summarize_attention(attention_stats(last, ones, ones))
    assert d["attn_diag_corr"] is None  # argmax never moves: correlation undefined
    assert d["attn_coverage_low"] == pytest.approx((n - 1) / n)


def test_pooling_batches_equals_one_batch(rng):
    src_mask, tgt_mask = _masks()
    w = _softmax_weights(rng, src_mask)
    whole = attention_stats(w, src_mask, tgt_mask)
    parts = [attention_stats(w[i : i + 1], src_mask[i : i + 1], tgt_mask[i : i + 1]) for i in range(B)]
    pooled = jax.tree.map(lambda *xs: sum(np.float64(x) for x in xs), *parts)
    # one batch vs three batches pooled: two float32 programs, summing the B·T·S weights in their own orders
    assert_close_f32(summarize_attention(pooled), summarize_attention(whole), reduction=B * T * S)


def test_jit_and_bad_shapes(rng):
    src_mask, tgt_mask = _masks()
    w = _softmax_weights(rng, src_mask)
    eager = attention_stats(w, src_mask, tgt_mask)
    jitted = jax.jit(attention_stats)(jnp.asarray(w), src_mask, tgt_mask)
    assert_close_f32(tuple(eager), tuple(jitted), reduction=B * T * S)  # two programs: float32 rounding apart
    with pytest.raises(ValueError, match=r"weights \[3, 5, 7\]"):
        attention_stats(w, src_mask[:, :5], tgt_mask)
