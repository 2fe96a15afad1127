"""Attention diagnostics on validation batches: entropy, coverage and diagonality of the alignment weights.

They make a run whose attention collapses (uniform weights, or every target word looking at ``</s>``) visible
long before its BLEU is. With weights ``α[b, j, i]`` (target step ``j`` attends source position ``i``), the real
target rows ``R = {(b, j): tgt_mask[b, j]}``, real source positions ``{(b, i): src_mask[b, i]}``, sentence lengths
``S_b = Σ_i src_mask[b, i]`` (``</s>`` included) and ``T_b = Σ_j tgt_mask[b, j]``:

* ``attn_entropy`` — mean over ``R`` of ``H_bj = -Σ_i α log α`` (nats; ``0 log 0 = 0``). Uniform weights give
  ``log S_b``, a one-hot row 0.
* ``attn_entropy_norm`` — mean over ``R`` of ``H_bj / log S_b`` (0 for ``S_b = 1``): 1 = uniform, 0 = hard.
* ``attn_coverage_dev`` — coverage ``c_bi = Σ_j α[b, j, i]`` (the attention mass source word ``i`` received over
  the whole translation); the mean over real source positions of ``|c_bi - 1|``. 0 when every source word is
  read exactly once in total.
* ``attn_coverage_low`` — the fraction of real source positions with ``c_bi < 0.5``: words the decoder barely
  looked at (candidates for being dropped from the translation).
* ``attn_diag_band`` — mean over ``R`` of the mass within the band ``|u_i - v_j| ≤ 0.1`` around the
  length-scaled diagonal, with relative positions ``u_i = (i + ½)/S_b``, ``v_j = (j + ½)/T_b``. Uniform weights
  give about 0.2; a monotone alignment close to 1.
* ``attn_diag_corr`` — Pearson correlation, pooled over ``R``, of ``v_j`` with ``u_{argmax_i α[b, j, i]}``:
  1 for a monotone (diagonal) alignment, near 0 for one unrelated to word order; ``None`` when either
  position has zero variance (e.g. every row's argmax is the first word).
* ``attn_zero_share`` — the fraction of real cells ``(b, j, i)`` (real target row, real source position) whose
  weight is exactly 0: about 0 for a softmax (only underflow gives an exact zero), large for sparsemax or
  1.5-entmax (``model.normalizer``), whose point is to ignore source words outright.
* ``attn_gold_mass`` / ``attn_gold_hit`` (only when gold alignments come with the batch, e.g. the built-in
  corpus) — over target rows with at least one gold link: the mean attention mass on the gold source words,
  and the fraction of rows whose argmax is a gold source word.

:func:`attention_stats` returns sums and counts (jit-able, added across batches);
:func:`summarize_attention` turns them into the means above.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from attn_jax.typing import Array, Bool, Float

__all__ = ["DIAG_BAND", "AttentionStats", "attention_stats", "summarize_attention"]

DIAG_BAND = 0.1  # half-width of the diagonal band, as a fraction of the sentence length


class AttentionStats(NamedTuple):
    """Sums and counts behind the diagnostics (float32 scalars; add two to pool batches)."""

    rows: Float[Array, ""]
    entropy: Float[Array, ""]
    entropy_norm: Float[Array, ""]
    src_positions: Float[Array, ""]
    coverage_dev: Float[Array, ""]
    coverage_low: Float[Array, ""]
    band_mass: Float[Array, ""]
    cells: Float[Array, ""]
    zeros: Float[Array, ""]
    sum_x: Float[Array, ""]
    sum_y: Float[Array, ""]
    sum_xx: Float[Array, ""]
    sum_yy: Float[Array, ""]
    sum_xy: Float[Array, ""]
    gold_rows: Float[Array, ""]
    gold_mass: Float[Array, ""]
    gold_hit: Float[Array, ""]


def attention_stats(
    weights: Float[Array, "B T S"],
    src_mask: Bool[Array, "B S"],
    tgt_mask: Bool[Array, "B T"],
    gold: Bool[Array, "B T S"] | None = None,
) -> AttentionStats:
    r"""Sums behind the attention diagnostics of one batch (definitions in the module docstring).

    .. math:: H_{bj} = -\sum_i \alpha_{bji} \log \alpha_{bji}, \qquad c_{bi} = \sum_j m_{bj} \alpha_{bji}

    Args:
      weights: ``[B, T, S]`` attention weights (rows over the real source sum to 1; any float dtype).
      src_mask: ``[B, S]`` bool, True at real source positions.
      tgt_mask: ``[B, T]`` bool, True at real target positions.
      gold: optional ``[B, T, S]`` bool gold alignment (``gold[b, j, i]``: target word ``j`` aligned to ``i``).

    Returns:
      :class:`AttentionStats` of float32 scalars.

    >>> w = jnp.full((1, 2, 4), 0.25)
    >>> s = attention_stats(w, jnp.ones((1, 4), bool), jnp.ones((1, 2), bool))
    >>> round(float(s.entropy / s.rows), 4) == round(float(jnp.log(4.0)), 4), float(s.entropy_norm / s.rows)
    (True, 1.0)
    """
    w = jnp.asarray(weights, jnp.float32)
    if w.ndim != 3 or w.shape[::2] != jnp.shape(src_mask) or w.shape[:2] != jnp.shape(tgt_mask):
        raise ValueError(
            f"weights {list(w.shape)} must be [B, T, S] with src_mask [B, S] {list(jnp.shape(src_mask))} "
            f"and tgt_mask [B, T] {list(jnp.shape(tgt_mask))}"
        )
    src_mask, tgt_mask = jnp.asarray(src_mask, bool), jnp.asarray(tgt_mask, bool)
    w = jnp.where(src_mask[:, None, :] & tgt_mask[:, :, None], w, 0.0)  # [B, T, S], zero outside real cells
    rows = tgt_mask.astype(jnp.float32)  # [B, T]
    s_len = jnp.sum(src_mask, axis=-1).astype(jnp.float32)  # [B]
    t_len = jnp.sum(tgt_mask, axis=-1).astype(jnp.float32)  # [B]

    ent = -jnp.sum(jnp.where(w > 0, w * jnp.log(jnp.where(w > 0, w, 1.0)), 0.0), axis=-1)  # [B, T]
    log_s = jnp.log(jnp.maximum(s_len, 1.0))[:, None]  # [B, 1]
    ent_norm = jnp.where(log_s > 0, ent / jnp.where(log_s > 0, log_s, 1.0), 0.0)

    coverage = jnp.sum(w, axis=1)  # [B, S]
    src = src_mask.astype(jnp.float32)

    u = (jnp.arange(w.shape[2]) + 0.5)[None, :] / jnp.maximum(s_len, 1.0)[:, None]  # [B, S]
    v = (jnp.arange(w.shape[1]) + 0.5)[None, :] / jnp.maximum(t_len, 1.0)[:, None]  # [B, T]
    band = jnp.abs(u[:, None, :] - v[:, :, None]) <= DIAG_BAND + 1e-6  # [B, T, S]
    band_mass = jnp.sum(jnp.where(band, w, 0.0), axis=-1)  # [B, T]

    real = src_mask[:, None, :] & tgt_mask[:, :, None]  # [B, T, S]
    zeros = jnp.sum(real & (w == 0.0))

    top = jnp.argmax(w, axis=-1)  # [B, T]
    y = jnp.take_along_axis(u, top, axis=-1)  # [B, T]
    x = v

    if gold is None:
        gold_rows = gold_mass = gold_hit = jnp.float32(0.0)
    else:
        g = jnp.asarray(gold, bool) & src_mask[:, None, :] & tgt_mask[:, :, None]
        has = jnp.any(g, axis=-1).astype(jnp.float32)  # [B, T]
        gold_rows = jnp.sum(has)
        gold_mass = jnp.sum(jnp.where(g, w, 0.0))
        gold_hit = jnp.sum(has * jnp.take_along_axis(g, top[..., None], axis=-1)[..., 0])

    return AttentionStats(
        rows=jnp.sum(rows),
        entropy=jnp.sum(rows * ent),
        entropy_norm=jnp.sum(rows * ent_norm),
        src_positions=jnp.sum(src),
        coverage_dev=jnp.sum(src * jnp.abs(coverage - 1.0)),
        coverage_low=jnp.sum(src * (coverage < 0.5)),
        band_mass=jnp.sum(rows * band_mass),
        cells=jnp.sum(real).astype(jnp.float32),
        zeros=zeros.astype(jnp.float32),
        sum_x=jnp.sum(rows * x),
        sum_y=jnp.sum(rows * y),
        sum_xx=jnp.sum(rows * x * x),
        sum_yy=jnp.sum(rows * y * y),
        sum_xy=jnp.sum(rows * x * y),
        gold_rows=jnp.asarray(gold_rows, jnp.float32),
        gold_mass=jnp.asarray(gold_mass, jnp.float32),
        gold_hit=jnp.asarray(gold_hit, jnp.float32),
    )


def summarize_attention(stats: AttentionStats) -> dict[str, float | None]:
    """The diagnostics (means; see the module docstring) from pooled :class:`AttentionStats`.

    >>> s = attention_stats(jnp.eye(3)[None], jnp.ones((1, 3), bool), jnp.ones((1, 3), bool))
    >>> {k: round(v, 3) for k, v in summarize_attention(s).items()}
    {'attn_entropy': 0.0, 'attn_entropy_norm': 0.0, 'attn_coverage_dev': 0.0, 'attn_coverage_low': 0.0, \
'attn_diag_band': 1.0, 'attn_zero_share': 0.667, 'attn_diag_corr': 1.0}
    """
    s = {k: float(np.asarray(v, np.float64)) for k, v in stats._asdict().items()}
    n = max(s["rows"], 1.0)
    out: dict[str, float | None] = {
        "attn_entropy": s["entropy"] / n,
        "attn_entropy_norm": s["entropy_norm"] / n,
        "attn_coverage_dev": s["coverage_dev"] / max(s["src_positions"], 1.0),
        "attn_coverage_low": s["coverage_low"] / max(s["src_positions"], 1.0),
        "attn_diag_band": s["band_mass"] / n,
        "attn_zero_share": s["zeros"] / max(s["cells"], 1.0),
    }
    var_x = s["sum_xx"] / n - (s["sum_x"] / n) ** 2
    var_y = s["sum_yy"] / n - (s["sum_y"] / n) ** 2
    cov = s["sum_xy"] / n - (s["sum_x"] / n) * (s["sum_y"] / n)
    tiny = 1e-9
    out["attn_diag_corr"] = float(cov / np.sqrt(var_x * var_y)) if var_x > tiny and var_y > tiny else None
    if s["gold_rows"] > 0:
        out["attn_gold_mass"] = s["gold_mass"] / s["gold_rows"]
        out["attn_gold_hit"] = s["gold_hit"] / s["gold_rows"]
    return out
