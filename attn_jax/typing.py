"""The axis alphabet used in every shape annotation of attn_jax.

One letter per axis, used in jaxtyping annotations (``Float[Array, "... T S"]``), in einsum strings and in
``# [B, T, H, S]`` comments after non-obvious reshapes:

====  ==========================================================
B     batch
S     source length (keys / encoder positions)
T     target length (queries / decoder positions)
D     model width (d_model); ``Dq``/``Dk``/``Dv`` when query, key and value widths differ
H     attention heads
K     width of one head (``D // H``)
A     alignment width of additive attention (the paper's ``n'``)
V     vocabulary size
W     window width of local attention (``2·D_window + 1``)
====  ==========================================================

A leading ``...`` means "any number of batch axes": every public attention function accepts ``[..., T, D]``.
"""

from __future__ import annotations

from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

__all__ = ["Array", "ArrayLike", "Bool", "Float", "Int", "PRNGKeyArray"]
