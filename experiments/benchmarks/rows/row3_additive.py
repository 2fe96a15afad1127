"""Row 3: additive attention in a decoder scan, naive autodiff against the fused scorer."""

from __future__ import annotations

import functools
import math

from harness import Ctx, Section, compiled_bytes, fmt_bytes, fmt_ratio, fmt_time, measure, verdict

# Targets (README.md says where each comes from).
FUSED_MEMORY_FRACTION = 0.25
FUSED_TIME_RATIO_MAX = 1.2


def row_additive(ctx: Ctx) -> Section:
    """Naive vs fused additive attention inside a decoder scan: time and compiled memory of fwd+bwd."""
    from attn_jax.attention import additive_attention_step, init_additive_params, project_keys

    jax, jnp, np, s = ctx.jax, ctx.jnp, ctx.np, ctx.sizes
    b, t, n, a = s.add_batch, s.add_steps, s.add_query, s.add_align
    sec = Section(
        "3. Additive attention in a decoder scan: naive autodiff vs fused scorer",
        f"B={b}, T=S={t}, keys 2n={2 * n}, query n={n}, A={a} (Bahdanau et al. 2015 sizes in the full run), "
        f"float32. `lax.scan` over T decoder steps as in RNNsearch: `U_a h` once, then per step "
        "`additive_attention_step(s_{i-1})` and `s_i = tanh(x_i + c_i C)`; gradient of a random projection "
        "of every `c_i` w.r.t. the scorer's params, the annotations, `C` and the inputs. Targets: fused "
        f"memory ≤ {FUSED_MEMORY_FRACTION:g} × naive, fused time ≤ {FUSED_TIME_RATIO_MAX} × naive.",
    )
    rng = np.random.default_rng(2)
    params = init_additive_params(jax.random.key(0), n, 2 * n, a)
    h = jnp.asarray(rng.standard_normal((b, t, 2 * n)), jnp.float32)
    lengths = rng.integers(t // 2, t + 1, b)
    mask = jnp.asarray(np.arange(t)[None, :] < lengths[:, None])
    c_w = jnp.asarray(rng.standard_normal((2 * n, n)) / math.sqrt(2 * n), jnp.float32)
    xs = jnp.asarray(rng.standard_normal((t, b, n)), jnp.float32)
    cot = jnp.asarray(rng.standard_normal((t, b, 2 * n)), jnp.float32)

    def loss(params, h, c_w, xs, fused):
        keys = project_keys(params, h)  # [B, S, A], once per batch

        def step(state, inp):
            x, g = inp
            ctx_i, _ = additive_attention_step(params, state, keys, h, mask, fused=fused)
            return jnp.tanh(x + ctx_i @ c_w), jnp.sum(ctx_i * g)

        _, per_step = jax.lax.scan(step, jnp.zeros((b, n), jnp.float32), (xs, cot))
        return per_step.sum()

    results = {}
    for fused in (False, True):
        prog = jax.jit(jax.grad(functools.partial(loss, fused=fused), argnums=(0, 1, 2, 3)))
        compiled = prog.lower(params, h, c_w, xs).compile()
        mem = compiled_bytes(compiled)
        ctx.log(f"row 3: timing {'fused' if fused else 'naive'}")
        last = {}  # the last call's gradients, to compare the two variants without another call

        def call(c=compiled, last=last):
            last["grads"] = jax.block_until_ready(c(params, h, c_w, xs))

        timing = measure(ctx, call)
        results[fused] = (mem, timing.median, last["grads"])
    (mem_n, t_n, g_n), (mem_f, t_f, g_f) = results[False], results[True]
    leaves_n, leaves_f = jax.tree.leaves(g_n), jax.tree.leaves(g_f)
    rel = max(
        float(jnp.abs(x - y).max() / jnp.maximum(jnp.abs(y).max(), 1e-30))
        for x, y in zip(leaves_f, leaves_n, strict=True)
    )
    sec.table(
        ["variant", "fwd+bwd time", "compiled memory"],
        [
            ["naive autodiff (`fused=False`)", fmt_time(t_n), fmt_bytes(mem_n)],
            ["fused (`fused=True`)", fmt_time(t_f), fmt_bytes(mem_f)],
        ],
    )
    sec.table(
        ["quantity", "value", "target", "status"],
        [
            [
                "fused / naive memory",
                fmt_ratio(mem_f / mem_n),
                f"≤ {FUSED_MEMORY_FRACTION:g}",
                verdict(mem_f <= FUSED_MEMORY_FRACTION * mem_n),
            ],
            [
                "fused / naive time",
                fmt_ratio(t_f / t_n),
                f"≤ {FUSED_TIME_RATIO_MAX}",
                verdict(t_f <= FUSED_TIME_RATIO_MAX * t_n),
            ],
            ["max rel. difference of the gradients", f"{rel:.2e}", "(info)", "—"],
        ],
    )
    return sec
