"""Naive float64 NumPy references, written loop by loop so that no axis can be silently swapped.

Each mechanism has its own module here; everything is re-exported flat:
``from tests.reference import softmax_ref, additive_ref, ...``.
"""

from tests.reference.core import *  # noqa: F401,F403
