"""The additive scorer's two initialisations: fan-in-scaled normals (default) and the paper's appendix B.1
(``W_a, U_a ~ N(0, 0.001²)``, ``v_a = 0``), through the core, the NNX module and RNNsearch's config."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_jax.attention import additive_attention, init_additive_params
from attn_jax.models import RNNConfig, RNNsearch


def test_paper_init_has_zero_v_and_tiny_kernels():
    p = init_additive_params(jax.random.key(1), 40, 60, 50, init="paper")
    assert np.all(np.asarray(p["v"]) == 0.0) and np.all(np.asarray(p["b"]) == 0.0)
    for name, shape in (("w_q", (40, 50)), ("w_k", (60, 50))):
        w = np.asarray(p[name], np.float64)
        assert w.shape == shape
        # 2,000-3,000 draws of N(0, 0.001²): the sample sd is within 5% of 0.001, the mean near 0.
        assert abs(w.std() / 1e-3 - 1) < 0.05 and abs(w.mean()) < 1e-4
    f = init_additive_params(jax.random.key(1), 40, 60, 50)
    assert abs(np.asarray(f["w_q"]).std() * np.sqrt(40) - 1) < 0.05 and np.asarray(f["v"]).std() > 0.05


def test_paper_init_starts_with_uniform_weights_over_real_keys():
    key = jax.random.key(2)
    p = init_additive_params(key, 5, 7, 3, init="paper")
    q = jax.random.normal(jax.random.key(3), (2, 4, 5))
    k = jax.random.normal(jax.random.key(4), (2, 6, 7))
    mask = jnp.array([[True] * 6, [True] * 4 + [False] * 2])[:, None, :]
    _, w = additive_attention(p, q, k, k, mask, return_weights=True)
    expected = np.where(np.asarray(mask), 1.0 / np.asarray(mask).sum(-1, keepdims=True), 0.0)
    assert w.shape == (2, 4, 6)
    # Exact 1/6 and 1/4 up to the rounding of one division (softmax of equal logits).
    np.testing.assert_allclose(np.asarray(w), np.broadcast_to(expected, w.shape), rtol=3e-7, atol=0)


def test_bad_init_names_are_refused():
    with pytest.raises(ValueError, match=r"init must be 'fan_in' or 'paper', got 'xavier'"):
        init_additive_params(jax.random.key(0), 2, 2, 2, init="xavier")
    with pytest.raises(ValueError, match=r"normalize=True"):
        init_additive_params(jax.random.key(0), 2, 2, 2, init="paper", normalize=True)
    with pytest.raises(ValueError, match=r"attention_init must be 'fan_in' or 'paper'"):
        RNNConfig(attention_init="zeros")


def test_rnnsearch_config_reaches_the_scorer():
    cfg = RNNConfig(src_vocab=11, tgt_vocab=13, embed=4, hidden=6, maxout=3, align=5, attention_init="paper")
    model = RNNsearch(cfg, rngs=nnx.Rngs(0))
    v = np.asarray(model.attention.params["v"][...])
    w_k = np.asarray(model.attention.params["w_k"][...])
    assert v.shape == (5,) and np.all(v == 0.0) and 0 < np.abs(w_k).max() < 0.01
