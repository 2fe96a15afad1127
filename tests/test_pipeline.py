"""GNMT's layer pipeline (attn_jax.parallel.pipelined_stack) against the plain stack and a float64 LSTM loop.

A tiny LSTM layer function is written here (not attn_jax.nn) so that the pipeline is tested on its own. Sizes:
T=5 time steps (not a multiple of any stage count, so the fill and drain of the wavefront are uneven), B=3 or 4,
D=3 units; L=4 or 8 layers on 2 or 4 stages, and a data × pipeline mesh (data=2, stage=4).
"""

import doctest
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_jax.parallel import _pipeline, make_mesh, pipelined_stack, stacked_scan
from tests.reference.pipeline import lstm_stack_ref
from tests.tolerance import assert_close_f32

T, D = 5, 3


def lstm_layer(params, carry, x):
    """One LSTM layer over one time step; see tests/reference/pipeline.py for the equations."""
    h, c = carry
    z = (
        jnp.einsum("bi,ikj->bkj", x, params["w"]) + jnp.einsum("bi,ikj->bkj", h, params["u"]) + params["b"]
    )  # [B, 4, D]
    c = jax.nn.sigmoid(z[:, 1]) * c + jax.nn.sigmoid(z[:, 0]) * jnp.tanh(z[:, 2])
    h = jax.nn.sigmoid(z[:, 3]) * jnp.tanh(c)
    return (h, c), h


def make_inputs(rng, num_layers, batch):
    params = {
        "w": rng.normal(0, 0.6, (num_layers, D, 4, D)),
        "u": rng.normal(0, 0.6, (num_layers, D, 4, D)),
        "b": rng.normal(0, 0.3, (num_layers, 4, D)),
    }
    carry = (rng.normal(0, 0.5, (num_layers, batch, D)), rng.normal(0, 0.5, (num_layers, batch, D)))
    xs = rng.normal(0, 1.0, (T, batch, D))
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), (params, carry, xs))


def test_stacked_scan_matches_float64_lstm_loop(rng):
    params, carry, xs = make_inputs(rng, num_layers=3, batch=3)
    ys, (h, c) = jax.jit(lambda p, c, x: stacked_scan(lstm_layer, p, c, x))(params, carry, xs)
    ys_ref, h_ref, c_ref = lstm_stack_ref(params, *carry, xs)
    # float32 vs float64 over 3 layers × 5 steps of O(1) activations: roundoff ~1e-7 per op; atol for values ~0.
    for got, want in ((ys, ys_ref), (h, h_ref), (c, c_ref)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # The top layer's last output is its final carry: the stack really ran the layers in sequence.
    np.testing.assert_array_equal(ys[-1], h[-1])


def _outputs_and_grads(fn, weights):
    """``fn``'s outputs and the gradients (params, init carry, xs) of a scalar depending on every output
    (random weights, so no gradient cancels by symmetry), in one compiled program."""

    def loss(params, carry, xs):
        out = fn(params, carry, xs)
        total = sum(
            jnp.sum(w * o) for w, o in zip(jax.tree.leaves(weights), jax.tree.leaves(out), strict=True)
        )
        return total, out

    def run(params, carry, xs):
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(params, carry, xs)
        return out, grads

    return jax.jit(run)


CASES = [
    pytest.param(dict(stage=2), 4, 3, None, id="stages2-L4"),
    pytest.param(dict(stage=4), 8, 3, None, id="stages4-L8"),
    pytest.param(dict(data=2, stage=4), 4, 4, "data", id="data2xstages4-L4"),
]


@pytest.mark.parametrize(("mesh_shape", "num_layers", "batch", "batch_axis"), CASES)
def test_pipelined_stack_equals_stacked_scan_forward_and_grad(rng, mesh_shape, num_layers, batch, batch_axis):
    devices = int(np.prod(list(mesh_shape.values())))
    mesh = make_mesh(**mesh_shape, devices=jax.devices()[:devices])
    params, carry, xs = make_inputs(rng, num_layers, batch)
    weights = jax.tree.map(
        lambda a: jnp.asarray(rng.normal(size=a.shape), jnp.float32),
        jax.eval_shape(lambda: stacked_scan(lstm_layer, params, carry, xs)),
    )

    def plain(p, c, x):
        return stacked_scan(lstm_layer, p, c, x)

    def piped(p, c, x):
        return pipelined_stack(lstm_layer, p, c, x, batch_axis=batch_axis)

    with jax.set_mesh(mesh):  # the ambient mesh path (the mesh= path is tested below)
        got, got_grads = _outputs_and_grads(piped, weights)(params, carry, xs)
    want, want_grads = _outputs_and_grads(plain, weights)(params, carry, xs)

    # Forward: the same float32 ops per layer and step (only the schedule and the fusions differ); gradients: the
    # data-split case sums per-shard parameter gradients in another order (psum). Two float32 programs, so
    # float32 rounding over the longest chain: L layers × T steps summing over x and h (2D), forward and back, and
    # the parameter gradients' sums over B·T.
    n = 2 * num_layers * T * 2 * D + batch * T
    assert_close_f32(got, want, reduction=n)
    assert_close_f32(got_grads, want_grads, reduction=n)
    # Every layer's params got a gradient (a stage whose work was dropped would leave zeros).
    assert np.all(np.max(np.abs(np.asarray(got_grads[0]["u"])), axis=(1, 2, 3)) > 1e-3)
    # The carries come back split over the stages (and the batch, data × pipeline).
    assert got[1][0].sharding.spec[:2] in (("stage", batch_axis), ("stage",))


def test_pipelined_stack_runs_a_wavefront_of_collective_permutes(rng):
    mesh = make_mesh(stage=4, devices=jax.devices()[:4])
    params, carry, xs = make_inputs(rng, num_layers=4, batch=3)
    fn = jax.jit(lambda p, c, x: pipelined_stack(lstm_layer, p, c, x, mesh=mesh))
    hlo = fn.lower(params, carry, xs).compile().as_text()
    assert re.search(r"\bcollective-permute(-start)?\(", hlo)
    # The layers stay on their stage: no device gathers the whole [L, ...] stack of recurrent weights.
    assert not re.search(r"f32\[4,3,4,3\][^=]*\ball-gather", hlo)
    ys, _ = fn(params, carry, xs)
    assert_close_f32(
        ys, stacked_scan(lstm_layer, params, carry, xs)[0], reduction=4 * T * 2 * D
    )  # two programs


def test_one_stage_is_the_plain_stack(rng):
    mesh = make_mesh(stage=1, devices=jax.devices()[:1])
    params, carry, xs = make_inputs(rng, num_layers=2, batch=3)
    got = pipelined_stack(lstm_layer, params, carry, xs, mesh=mesh)
    want = stacked_scan(lstm_layer, params, carry, xs)
    jax.tree.map(np.testing.assert_array_equal, got, want)  # one stage *is* stacked_scan: the same program


def test_pipelined_stack_errors(rng):
    params, carry, xs = make_inputs(rng, num_layers=4, batch=3)
    with pytest.raises(ValueError, match="needs a mesh"):
        pipelined_stack(lstm_layer, params, carry, xs)
    mesh = make_mesh(data=2, stage=4)
    with pytest.raises(ValueError, match="4 layers cannot be split into 8"):
        pipelined_stack(lstm_layer, params, carry, xs, mesh=make_mesh(stage=8))
    with pytest.raises(ValueError, match="'pipe' not in the mesh"):
        pipelined_stack(lstm_layer, params, carry, xs, mesh=mesh, stage_axis="pipe")
    with pytest.raises(ValueError, match="batch 3 is not a multiple of mesh axis 'data'"):
        pipelined_stack(lstm_layer, params, carry, xs, mesh=mesh, batch_axis="data")
    with pytest.raises(ValueError, match="init_carry has 3 layers but stacked_params has 4"):
        pipelined_stack(lstm_layer, params, jax.tree.map(lambda c: c[:3], carry), xs, mesh=mesh)
    with pytest.raises(ValueError, match="same leading axis"):
        stacked_scan(lstm_layer, params, carry, (xs, xs[:2]))


def test_docstring_examples():
    result = doctest.testmod(_pipeline, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
