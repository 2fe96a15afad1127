"""Activation rematerialisation (``model.remat``): the gradients of the loss equal the plain step's at the float32
tolerance, for the Transformer (with dropout), GNMT (its stacks and every time scan), RNNsearch (intra-attention
encoder, coverage, input feeding) and RNNenc, and the compiled backward pass with ``full`` needs less temporary
memory (XLA's own ``memory_analysis``); a bad policy name is one line.

Each policy's gradient is compiled once and serves both checks: compilation is most of this file's time.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_jax.models import GNMT, GNMTConfig, RNNConfig, RNNenc, RNNsearch, Transformer, TransformerConfig
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
            src_vocab=31,
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
            src_vocab=31, tgt_vocab=31, embed=16, hidden=16, encoder_layers=4, decoder_layers=3, align=16
        ),
        False,
    )
    # src_vocab = tgt_vocab: _batch draws both sides from the target vocabulary (nnx.Embed gives NaN beyond it).
    rnn = dict(src_vocab=31, tgt_vocab=31, embed=8, hidden=12, maxout=6, align=10)
    yield (
        "rnnsearch",
        RNNsearch,
        RNNConfig(**rnn, intra_attention=True, coverage=True, input_feeding=True),
        False,
    )
    yield "rnnenc", RNNenc, RNNConfig(**rnn, arch="rnnenc"), False


@pytest.mark.parametrize(
    "name,model_cls,cfg,dropout", list(_models()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_remat_gradients_equal_the_plain_step_in_less_memory(name, model_cls, cfg, dropout):
    temp, want = {}, None
    for policy in REMAT_POLICIES:
        grad, params = _loss_and_grad(model_cls, _with(cfg, policy), dropout)
        compiled = grad.lower(params).compile()
        temp[policy] = compiled.memory_analysis().temp_size_in_bytes
        got = compiled(params)
        if want is None:
            assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(got)), (
                name
            )  # NaN == NaN passes
            want = got  # "none", the plain step
            continue
        # A bias that shifts all of a softmax's scores (the intra-attention's b) has a zero gradient: its
        # entries are the rounding of cancelling terms, so it is compared at the scale of the whole gradient.
        whole = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(want))
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True):
            scale = whole if float(jnp.max(jnp.abs(b))) < 1e-6 * whole else None
            err = f"{name} remat={policy} {path}"
            assert_close_f32(a, b, reduction=4 * max(S, T) + 64, scale=scale, err_msg=err)
    assert temp["full"] < temp["none"], temp


def _with(cfg, policy):
    return dataclasses.replace(cfg, remat=policy)


@pytest.mark.parametrize("model_cls", [TransformerConfig, GNMTConfig, RNNConfig])
def test_an_unknown_policy_is_one_line(model_cls):
    with pytest.raises(ValueError, match=r"remat must be one of none, full, dots_saveable.*got 'some'"):
        model_cls(remat="some")
