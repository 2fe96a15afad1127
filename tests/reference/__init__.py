"""Naive float64 NumPy references, written loop by loop so that no axis can be silently swapped.

One module per mechanism; import from it directly (``from tests.reference.scorers import additive_ref``):
``core`` (masked softmax, context), ``masks_dot`` (masks, dot-product, multi-head, positions), ``scorers``
(additive, normed, Luong, local), ``rnn`` (GRU, RNNsearch, RNNenc).
"""
