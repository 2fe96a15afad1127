"""Activation rematerialisation (``model.remat``): the gradients of the loss equal the plain step's at the float32
tolerance, for the Transformer (with dropout) and GNMT's stacks, and the compiled backward pass needs less
temporary memory (XLA's own ``memory_analysis``); a bad policy name is one line.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_jax.models import GNMT, GNMTConfig, Transformer, TransformerConfig
from attn_jax.models.interface import REMAT_POLICIES
from tests.tolerance import assert_close_f32

B, S, T = 4, 12, 10


def _batch(vocab):
    rng = np.random.default_rng(0)
    src = jnp.asarray(rng.integers(3, vocab, (B, S)), jnp.int32)
    tgt = jnp.asarray(rng.integers(3, vocab, (B, T)), jnp.int32)
    mask = jnp.asarray(np.arange(S)[None, :] < np.array([S, S - 3, 7, 5])[:, None])
    weights = jnp.asarray(rng.normal(size=(B, T, vocab)), jnp.float32)
    return src, mask, tgt, weights


def _loss_and_grad(model_cls, cfg, dropout: bool):
    """``(jitted grad fn, its arguments)``; the same parameters (seed 0) whatever ``cfg.remat``."""
    model = model_cls(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    src, mask, tgt, weights = _batch(cfg.tgt_vocab)
    kwargs = {"dropout_rng": jax.random.key(1)} if dropout else {}

    def loss(params):
        logits, _ = nnx.merge(graphdef, params)(src, mask, tgt, **kwargs)
        return jnp.sum(jax.nn.log_softmax(logits) * weights)

    return jax.jit(jax.grad(loss)), params


def _models():
    yield (
        "transformer",
        Transformer,
        TransformerConfig(
            src_vocab=29,
            tgt_vocab=31,
            d_model=32,
            heads=4,
            d_ff=64,
            encoder_layers=3,
            decoder_layers=3,
            max_length=16,
            dropout=0.1,
        ),
        True,
    )
    yield (
        "gnmt",
        GNMT,
        GNMTConfig(
            src_vocab=29, tgt_vocab=31, embed=16, hidden=16, encoder_layers=4, decoder_layers=3, align=16
        ),
        False,
    )


@pytest.mark.parametrize(
    "name,model_cls,cfg,dropout", list(_models()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_remat_gradients_equal_the_plain_step(name, model_cls, cfg, dropout):
    grad, params = _loss_and_grad(model_cls, cfg, dropout)
    want = grad(params)
    for policy in REMAT_POLICIES:
        if policy == "none":
            continue
        grad_r, params_r = _loss_and_grad(model_cls, _with(cfg, policy), dropout)
        got = grad_r(params_r)
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True):
            assert_close_f32(a, b, reduction=4 * max(S, T) + 64, err_msg=f"{name} remat={policy} {path}")


def _with(cfg, policy):
    return dataclasses.replace(cfg, remat=policy)


@pytest.mark.parametrize(
    "name,model_cls,cfg,dropout", list(_models()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_full_remat_needs_less_temporary_memory(name, model_cls, cfg, dropout):
    temp = {}
    for policy in ("none", "full"):
        grad, params = _loss_and_grad(model_cls, _with(cfg, policy), dropout)
        temp[policy] = grad.lower(params).compile().memory_analysis().temp_size_in_bytes
    assert temp["full"] < temp["none"], temp


@pytest.mark.parametrize("model_cls", [TransformerConfig, GNMTConfig])
def test_an_unknown_policy_is_one_line(model_cls):
    with pytest.raises(ValueError, match=r"remat must be one of none, full, dots_saveable.*got 'some'"):
        model_cls(remat="some")
