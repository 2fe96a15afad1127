"""float64 loop reference for a stack of LSTM layers (the layer function of the pipeline tests).

One LSTM layer (Hochreiter & Schmidhuber 1997, with a forget gate; gate order i, f, g, o)::

    z_k = x W_k + h U_k + b_k           k ∈ {i, f, g, o};  W, U: [D, 4, D], b: [4, D]
    c' = σ(z_f) c + σ(z_i) tanh(z_g),   h' = σ(z_o) tanh(c')

Layer ``l`` reads layer ``l-1``'s outputs ``h`` (layer 0 reads ``x``), one sentence, time step and unit at a time.
"""

import math

import numpy as np

__all__ = ["lstm_stack_ref"]


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def lstm_stack_ref(params, h0, c0, xs):
    """``(ys [T, B, D], h [L, B, D], c [L, B, D])`` of the stack; ``params`` = {w, u: [L, D, 4, D], b: [L, 4, D]}."""
    w, u, b = (np.asarray(params[k], np.float64) for k in ("w", "u", "b"))
    inputs = np.asarray(xs, np.float64)
    num_layers, dim = w.shape[0], w.shape[-1]
    steps, batch = inputs.shape[:2]
    h_final = np.zeros((num_layers, batch, dim))
    c_final = np.zeros((num_layers, batch, dim))
    for layer in range(num_layers):
        outputs = np.zeros((steps, batch, dim))
        for n in range(batch):
            h = np.asarray(h0[layer, n], np.float64).copy()
            c = np.asarray(c0[layer, n], np.float64).copy()
            for t in range(steps):
                x = inputs[t, n]
                new_h, new_c = np.zeros(dim), np.zeros(dim)
                for j in range(dim):
                    z = [
                        b[layer, k, j]
                        + sum(x[i] * w[layer, i, k, j] for i in range(x.shape[0]))
                        + sum(h[i] * u[layer, i, k, j] for i in range(dim))
                        for k in range(4)
                    ]
                    new_c[j] = _sigmoid(z[1]) * c[j] + _sigmoid(z[0]) * math.tanh(z[2])
                    new_h[j] = _sigmoid(z[3]) * math.tanh(new_c[j])
                h, c = new_h, new_c
                outputs[t, n] = h
            h_final[layer, n], c_final[layer, n] = h, c
        inputs = outputs
    return inputs, h_final, c_final
