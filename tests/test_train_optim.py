"""Optimisers: the paper's Adadelta + clipping is optax's, Adadelta itself follows Zeiler (2012), schedules."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from attn_jax.train import OptimizerConfig, default_config, make_optimizer, make_schedule, optimizer_config
from tests.tolerance import assert_close_f32


def _grads(rng, n):
    """A sequence of gradient pytrees, some with global norm far above 1 (so clipping matters)."""
    out = []
    for k in range(n):
        scale = 10.0 if k % 2 else 0.05
        out.append(
            {
                "w": jnp.asarray(rng.normal(size=(3, 5)) * scale, jnp.float32),
                "b": jnp.asarray(rng.normal(size=(7,)) * scale, jnp.float32),
            }
        )
    return out


def _run(tx, params, grads):
    state = tx.init(params)
    history = []
    for g in grads:
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
        history.append(updates)
    return params, history


def test_default_is_the_papers_adadelta_with_clipping(rng):
    cfg = OptimizerConfig()
    assert (cfg.name, cfg.learning_rate, cfg.rho, cfg.eps, cfg.clip_norm, cfg.weight_decay) == (
        "adadelta",
        1.0,
        0.95,
        1e-6,
        1.0,
        0.0,
    )
    assert optimizer_config(default_config()) == cfg  # the config schema's defaults are the paper's too
    params = {"w": jnp.zeros((3, 5)), "b": jnp.zeros((7,))}
    grads = _grads(rng, 6)
    ours, h1 = _run(make_optimizer(cfg), params, grads)
    paper = optax.chain(optax.clip_by_global_norm(1.0), optax.adadelta(learning_rate=1.0, rho=0.95, eps=1e-6))
    theirs, h2 = _run(paper, params, grads)
    for a, b in zip(jax.tree.leaves((ours, h1)), jax.tree.leaves((theirs, h2)), strict=True):
        np.testing.assert_array_equal(
            np.asarray(a), np.asarray(b)
        )  # the same transformations: the same program


def test_adadelta_follows_zeiler_2012_in_float64(rng):
    """Zeiler (2012), Algorithm 1, with the gradient first rescaled to global L2 norm <= 1 (Bahdanau et al.)."""
    rho, eps = 0.95, 1e-6
    grads = _grads(rng, 5)
    _, history = _run(
        make_optimizer(OptimizerConfig()), {"w": jnp.zeros((3, 5)), "b": jnp.zeros((7,))}, grads
    )
    acc_g = {k: np.zeros(v.shape) for k, v in grads[0].items()}
    acc_dx = {k: np.zeros(v.shape) for k, v in grads[0].items()}
    for g, upd in zip(grads, history, strict=True):
        g = {k: np.asarray(v, np.float64) for k, v in g.items()}
        norm = np.sqrt(sum(np.sum(v**2) for v in g.values()))
        if norm > 1.0:
            g = {k: v / norm for k, v in g.items()}
        for k in g:
            acc_g[k] = rho * acc_g[k] + (1 - rho) * g[k] ** 2
            dx = -np.sqrt(acc_dx[k] + eps) / np.sqrt(acc_g[k] + eps) * g[k]
            acc_dx[k] = rho * acc_dx[k] + (1 - rho) * dx**2
            # float32 optax vs float64 loop: ratios of square roots of tiny accumulators, rel. error ~1e-6.
            np.testing.assert_allclose(np.asarray(upd[k]), dx, rtol=1e-5, atol=1e-9)


def test_adam_with_weight_decay_is_adamw(rng):
    cfg = OptimizerConfig(
        name="adam", learning_rate=3e-3, eps=1e-8, b1=0.8, b2=0.99, clip_norm=0.0, weight_decay=0.01
    )
    params = {"w": jnp.asarray(rng.normal(size=(3, 5)), jnp.float32), "b": jnp.ones((7,))}
    grads = _grads(rng, 4)
    ours, _ = _run(make_optimizer(cfg), params, grads)
    theirs, _ = _run(optax.adamw(3e-3, b1=0.8, b2=0.99, eps=1e-8, weight_decay=0.01), params, grads)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(
            np.asarray(a), np.asarray(b)
        )  # the same transformations: the same program


def test_adadelta_weight_decay_is_decoupled(rng):
    """p ← p - lr·(adadelta(g) + wd·p): the decay is added after Adadelta's scaling, before the learning rate."""
    cfg = OptimizerConfig(learning_rate=0.5, clip_norm=0.0, weight_decay=0.1)
    params = {"w": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}
    g = {"w": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}
    updates, _ = make_optimizer(cfg).update(g, make_optimizer(cfg).init(params), params)
    plain, _ = optax.scale_by_adadelta(rho=0.95, eps=1e-6).update(
        g, optax.scale_by_adadelta(rho=0.95, eps=1e-6).init(params)
    )
    expected = -0.5 * (np.asarray(plain["w"]) + 0.1 * np.asarray(params["w"]))
    # NumPy vs the optimizer's program (which may fuse the multiply-add): a two-term float32 sum, rounded apart
    assert_close_f32(updates["w"], expected, reduction=2)


def test_schedules_by_hand():
    cos = make_schedule(
        OptimizerConfig(
            name="adam",
            learning_rate=1.0,
            warmup_steps=10,
            decay="cosine",
            decay_steps=110,
            final_lr_fraction=0.1,
        )
    )
    assert float(cos(0)) == 0.0
    np.testing.assert_allclose(float(cos(5)), 0.5, rtol=1e-6)
    np.testing.assert_allclose(float(cos(10)), 1.0, rtol=1e-6)
    # halfway through the 100 decay steps: 0.1 + 0.9 * (1 + cos(pi/2)) / 2 = 0.55
    np.testing.assert_allclose(float(cos(60)), 0.55, rtol=1e-5)
    np.testing.assert_allclose(float(cos(110)), 0.1, rtol=1e-5)
    lin = make_schedule(OptimizerConfig(name="adam", learning_rate=2.0, decay="linear", decay_steps=4))
    np.testing.assert_allclose([float(lin(t)) for t in range(5)], [2.0, 1.5, 1.0, 0.5, 0.0], rtol=1e-6)
    rsqrt = make_schedule(OptimizerConfig(name="adam", learning_rate=1.0, warmup_steps=4, decay="rsqrt"))
    np.testing.assert_allclose([float(rsqrt(t)) for t in (2, 4, 16)], [0.5, 1.0, 0.5], rtol=1e-6)
    const = make_schedule(OptimizerConfig())
    assert float(const(12345)) == 1.0
    # warm-up 2, stable until step 6, then linear to 0.25 at step 10: 0.25 of the way per step over 4 steps
    wsd = make_schedule(
        OptimizerConfig(
            name="adam",
            learning_rate=1.0,
            warmup_steps=2,
            decay="linear",
            decay_start=6,
            decay_steps=10,
            final_lr_fraction=0.25,
        )
    )
    expected = [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.8125, 0.625, 0.4375, 0.25, 0.25]
    np.testing.assert_allclose([float(wsd(t)) for t in range(12)], expected, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(name="sgd"), "optimizer.name"),
        (dict(learning_rate=0.0), "learning_rate"),
        (dict(rho=1.0), "rho"),
        (dict(clip_norm=-1.0), "clip_norm"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(decay="cosine", decay_steps=5, warmup_steps=10), "decay_steps > warmup_steps"),
        (dict(decay="step"), "optimizer.decay"),
        (dict(decay="linear", decay_steps=10, decay_start=10), "decay_start=10"),
        (dict(decay="constant", decay_start=10), "only applies to a cosine or linear decay"),
    ],
)
def test_invalid_optimizer_configs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OptimizerConfig(**kwargs)
