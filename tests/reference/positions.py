"""float64 references of ALiBi (Press et al. 2022) and Shaw et al. (2018) relative position representations.

``alibi_slopes_ref`` is the authors' own recursion (github.com/ofirpress/attention_with_linear_biases,
fairseq's ``get_slopes``), not the closed form the library uses; the rest are loops over heads and positions.
"""

import math

import numpy as np

from tests.reference.core import softmax_row_ref


def alibi_slopes_ref(n):
    """The ALiBi repo's ``get_slopes(n)``: a geometric sequence for powers of 2, interleaved otherwise."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_slopes_ref(2 * closest)[0::2][: n - closest]


def alibi_bias_ref(slopes, tq, tk, q_offset=0):
    """``[H, Tq, Tk]`` with entry ``-m_h·|j - (i + q_offset)|``."""
    out = np.zeros((len(slopes), tq, tk))
    for h, m in enumerate(slopes):
        for i in range(tq):
            for j in range(tk):
                out[h, i, j] = -m * abs(j - (i + q_offset))
    return out


def relative_index_ref(i, j, k):
    """Shaw et al.'s clipped distance ``clip(j - i, -k, k)`` shifted to a row ``0..2k``."""
    return max(-k, min(k, j - i)) + k


def relative_attention_ref(q, k, v, allowed, rel_k, rel_v, max_distance, q_positions=None):
    """One head: ``e_ij = q_i·(k_j + a^K_ij)/√K``, ``z_i = Σ_j α_ij (v_j + a^V_ij)``; ``(z [Tq, K], α)``."""
    q, k, v, rel_k, rel_v = (np.asarray(x, np.float64) for x in (q, k, v, rel_k, rel_v))
    tq, tk = len(q), len(k)
    q_positions = range(tq) if q_positions is None else q_positions
    z = np.zeros((tq, v.shape[-1]))
    alphas = np.zeros((tq, tk))
    for i, pos in zip(range(tq), q_positions, strict=True):
        rows = [relative_index_ref(pos, j, max_distance) for j in range(tk)]
        energies = [float(np.dot(q[i], k[j] + rel_k[rows[j]])) / math.sqrt(q.shape[-1]) for j in range(tk)]
        alpha = softmax_row_ref(energies, [bool(allowed[i][j]) for j in range(tk)])
        z[i] = sum((alpha[j] * (v[j] + rel_v[rows[j]]) for j in range(tk)), np.zeros(v.shape[-1]))
        alphas[i] = alpha
    return z, alphas
