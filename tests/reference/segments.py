"""Loop references for packed sequences: the segment mask and per-segment positions (NumPy, no vectorisation)."""

import numpy as np


def segment_mask_ref(q_seg, k_seg):
    """``m[..., i, j] = q[i] == k[j] != 0``, one entry at a time; leading axes must match."""
    q_seg, k_seg = np.asarray(q_seg), np.asarray(k_seg)
    lead = q_seg.shape[:-1]
    out = np.zeros((*lead, q_seg.shape[-1], k_seg.shape[-1]), bool)
    for idx in np.ndindex(*lead):
        for i in range(q_seg.shape[-1]):
            for j in range(k_seg.shape[-1]):
                out[idx + (i, j)] = q_seg[idx + (i,)] != 0 and q_seg[idx + (i,)] == k_seg[idx + (j,)]
    return out


def segment_positions_ref(seg):
    """Count up from 0 along each row, restarting whenever the id changes; 0 on padding (id 0)."""
    seg = np.asarray(seg)
    out = np.zeros(seg.shape, np.int64)
    for idx in np.ndindex(*seg.shape[:-1]):
        count, prev = 0, None
        for j in range(seg.shape[-1]):
            s = seg[idx + (j,)]
            count = count + 1 if s == prev else 0
            prev = s
            out[idx + (j,)] = count if s != 0 else 0
    return out
