"""Packed rows in the Transformer: a row of several pairs gives each pair the logits, loss and gradients it gets
alone (padded, one pair a row), up to float32 rounding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_jax.data import assemble_batch, assemble_packed_batch
from attn_jax.models.transformer import Transformer, TransformerConfig
from attn_jax.train._loss import loss_sums
from tests.test_data_packing import _fake
from tests.tolerance import assert_close_f32

WIDTH = 13  # odd, and neither S nor T of any pair
# (source, target) lengths without specials; rows: pairs 0+1+2, 3+4, 5 alone
LENGTHS = [(3, 2), (4, 5), (2, 3), (6, 4), (5, 6), (7, 7)]
ROWS = [np.array([0, 1, 2]), np.array([3, 4]), np.array([5])]


def _model(positions, norm):
    cfg = TransformerConfig(
        src_vocab=50,
        tgt_vocab=50,
        d_model=12,
        heads=3,
        d_ff=20,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        norm=norm,
        positions=positions,
        max_length=16,
        share_embeddings="none",
    )
    return nnx.split(Transformer(cfg, rngs=nnx.Rngs(7)))


def _loss(graphdef, params, batch, packed):
    src_mask = jnp.asarray(batch.src_mask)
    kwargs = {}
    if packed:
        kwargs = dict(
            src_segments=batch.src_segments,
            tgt_segments=batch.tgt_segments,
            src_positions=batch.src_positions,
            tgt_positions=batch.tgt_positions,
        )
    logits, _ = nnx.merge(graphdef, params)(batch.src, src_mask, batch.tgt_in, **kwargs)
    sums = loss_sums(logits, batch.tgt_out, jnp.asarray(batch.tgt_mask), label_smoothing=0.1)
    return sums.loss, logits


@pytest.mark.numerics
# One variant in `make test`; the other position kinds (their own embedding path) in `make test-all` (heavy): each
# case compiles a packed and an unpacked Transformer with gradients, ~20-30 s of CPU.
@pytest.mark.parametrize(
    ("positions", "norm"),
    [
        ("sinusoidal", "pre"),
        pytest.param("learned", "post", marks=pytest.mark.heavy),
        pytest.param("rope", "pre", marks=pytest.mark.heavy),
    ],
)
def test_packed_row_equals_each_pair_alone(positions, norm):
    graphdef, params = _model(positions, norm)
    corpus = _fake(LENGTHS, seed=5)
    packed = assemble_packed_batch(corpus, ROWS, WIDTH)
    alone = assemble_batch(corpus, np.arange(len(LENGTHS)), WIDTH)

    grad = jax.jit(jax.value_and_grad(_loss, argnums=1, has_aux=True), static_argnums=(0, 3))
    (loss_p, logits_p), g_p = grad(graphdef, params, packed, True)
    (loss_a, logits_a), g_a = grad(graphdef, params, alone, False)

    for b, members in enumerate(ROWS):
        c = 0
        for i in members:
            lt = alone.tgt_len[i]
            assert_close_f32(
                logits_p[b, c : c + lt], logits_a[i, :lt], reduction=WIDTH * 20, err_msg=f"pair {i} logits"
            )
            c += lt
    # the loss sums over all real tokens and its gradient: the same tokens, another grouping of the sums
    assert_close_f32(loss_p, loss_a, reduction=WIDTH * len(LENGTHS))
    # one scale for every leaf: some gradients are zero up to rounding (a key bias cannot move a softmax)
    scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(g_a))
    assert_close_f32(g_p, g_a, reduction=WIDTH * len(LENGTHS) * 20, scale=scale)
    # the comparison has teeth: without segments the packed row mixes pairs and the logits move
    (_, logits_mixed), _ = grad(graphdef, params, packed, False)
    assert float(jnp.max(jnp.abs(logits_mixed[0, 3:] - logits_p[0, 3:]))) > 1e-2


def test_packed_arguments_are_checked():
    graphdef, params = _model("sinusoidal", "pre")
    model = nnx.merge(graphdef, params)
    src, tgt = jnp.ones((2, 5), jnp.int32), jnp.ones((2, 4), jnp.int32)
    mask = jnp.ones((2, 5), bool)
    with pytest.raises(ValueError, match="both src_segments and tgt_segments"):
        model(src, mask, tgt, src_segments=jnp.ones((2, 5), jnp.int32))
    with pytest.raises(ValueError, match="tokens' shape"):
        model(
            src, mask, tgt, src_segments=jnp.ones((2, 5), jnp.int32), tgt_segments=jnp.ones((2, 5), jnp.int32)
        )
    with pytest.raises(ValueError, match="integers"):
        model(src, mask, tgt, src_segments=jnp.ones((2, 5)), tgt_segments=jnp.ones((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="for packed rows"):
        model(src, mask, tgt, tgt_positions=jnp.zeros((2, 4), jnp.int32))
    # positions default to segment_positions of the ids
    seg_s, seg_t = jnp.array([[1, 1, 2, 2, 2]] * 2), jnp.array([[1, 2, 2, 2]] * 2)
    a, _ = model(src, mask, tgt, src_segments=seg_s, tgt_segments=seg_t)
    b, _ = model(
        src,
        mask,
        tgt,
        src_segments=seg_s,
        tgt_segments=seg_t,
        src_positions=jnp.array([[0, 1, 0, 1, 2]] * 2),
        tgt_positions=jnp.array([[0, 0, 1, 2]] * 2),
    )
    np.testing.assert_array_equal(a, b)
