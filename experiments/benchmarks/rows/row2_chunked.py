"""Row 2: plain against chunked attention: compiled memory as L grows, peak RSS of a run, error and time."""

from __future__ import annotations

import functools
import subprocess
import sys

from harness import (
    Ctx,
    Section,
    compiled_bytes,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    jax_call,
    measure_interleaved,
    subprocess_env,
    verdict,
)

# Targets (README.md says where each comes from).
CHUNKED_MEMORY_FRACTION = 0.1
CHUNKED_REL_ERR_MAX = 1e-5
CHUNKED_TIME_RATIO_MAX = 1.5

_RSS_PROBE = """
import functools, json, sys
import jax, jax.numpy as jnp, numpy as np
from attn_jax.attention import dot_product_attention
impl, mode, h, length, d = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
f = functools.partial(dot_product_attention, implementation=impl)
prog = jax.jit(f if mode == "fwd" else (lambda q, k, v, g: jax.vjp(f, q, k, v)[1](g)))
args = [jnp.asarray(np.random.default_rng(i).standard_normal((1, h, length, d)), jnp.float32) for i in range(3)]
if mode != "fwd":
    args.append(args[0])
small = [x[:, :, :16] for x in args]  # warm the runtime (thread pools, first-run allocations) on a tiny call
jax.block_until_ready(prog(*small))
compiled = prog.lower(*args).compile()
ma = compiled.memory_analysis()
estimate = ma.temp_size_in_bytes + ma.output_size_in_bytes + ma.argument_size_in_bytes
def status(key):
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key + ":"))
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # Linux >= 4.0: reset the peak resident size (VmHWM) to the current one
before = status("VmRSS")
jax.block_until_ready(compiled(*args))
print(json.dumps({"before": before, "peak": status("VmHWM"), "estimate": estimate}))
"""


def _rss_table(ctx: Ctx, sec: Section, h: int, d: int) -> dict[tuple[int, str, str], int]:
    """Peak RSS growth of one executed call (fresh subprocess each), beside XLA's compile-time estimate.

    The compiled memory analysis does not see buffers that XLA's CPU runtime allocates inside a library fusion,
    so what a user's process needs is measured here. It is the peak resident size during the call (``VmHWM``,
    reset just before it through ``/proc/self/clear_refs``) minus the resident size just before it, after
    compilation and the inputs. A peak reached during compilation and not exceeded by the call reads as ≤ 0.
    """
    import json as _json

    rows, grown = [], {}
    env = subprocess_env()
    for length in ctx.sizes.rss_lengths:
        for mode in ("fwd", "fwd+bwd"):
            row = [str(length), mode]
            for impl in ("xla", "chunked"):
                ctx.log(f"row 2: peak RSS of one call, {impl} {mode} L={length} (subprocess)")
                out = subprocess.run(
                    [sys.executable, "-c", _RSS_PROBE, impl, mode, str(h), str(length), str(d)],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=900,
                )
                if out.returncode != 0:
                    row += [
                        f"failed ({out.stderr.strip().splitlines()[-1][:80] if out.stderr.strip() else out.returncode})",
                        "—",
                    ]
                    continue
                r = _json.loads(out.stdout.strip().splitlines()[-1])
                grew = grown[length, mode, impl] = r["peak"] - r["before"]
                row += [fmt_bytes(grew) if grew > 0 else "≤ 0", fmt_bytes(r["estimate"])]
            rows.append(row)
    sec.table(
        [
            "L",
            "pass",
            "plain: peak RSS growth (run)",
            "plain: compiled estimate",
            "chunked: peak RSS growth (run)",
            "chunked: compiled estimate",
        ],
        rows,
    )
    sec.notes.append(
        "Peak RSS growth: one call of the compiled program in a fresh process, its peak resident size (`VmHWM`, "
        "reset through `/proc/self/clear_refs` just before the call) minus the resident size just before it (inputs, compilation and a tiny warm-up call of the same function already in). The compiled estimate (argument + "
        "output + temp bytes of XLA's memory analysis) is what the first table reports; where the two differ, "
        "the run is what a user's process needs (the analysis misses buffers allocated inside library fusions)."
    )
    return grown


def row_chunked(ctx: Ctx) -> Section:
    """Plain vs chunked: compiled memory as L grows, chunked's error and time against plain."""
    jnp, np, s = ctx.jnp, ctx.np, ctx.sizes
    h, d = s.mem_heads, s.dpa_width
    sec = Section(
        "2. Chunked (flash-style) vs plain attention: memory, error, time",
        f"B=1, H={h}, K={d}, self-attention, float32, fwd+bwd (VJP of q, k, v). Memory = XLA's compiled "
        "memory analysis (argument + output + temp bytes) of the jitted fwd+bwd program: compiled, never run. "
        f"Targets: chunked ≤ {CHUNKED_MEMORY_FRACTION:g} × plain at L={s.mem_target_length}; relative error "
        f"≤ {CHUNKED_REL_ERR_MAX:g}; chunked / plain time ≤ {CHUNKED_TIME_RATIO_MAX} (L={s.time_length}); "
        "chunked memory grows linearly (×2 per doubling of L).",
    )
    memory = _memory_table(ctx, sec, h, d)
    grown = _rss_table(ctx, sec, h, d)

    rng = np.random.default_rng(1)

    def inputs(length):
        return [jnp.asarray(rng.standard_normal((1, h, length, d)), jnp.float32) for _ in range(4)]

    # Error of chunked against plain at a size where plain fits.
    errors = _chunked_error(ctx, *inputs(s.err_length))
    times = _chunked_times(ctx, *inputs(s.time_length))
    summary = _summary(ctx, memory, errors, times, grown)
    sec.table(["quantity", "value", "target", "status"], summary)
    sec.notes.append(
        "Relative error = max |chunked − plain| / max |plain| (float32 both; plain is the reference path)."
    )
    sec.notes.append(
        "At small L chunked's fixed per-block buffers (query_chunk × key_chunk logits per head) dominate, so "
        "the growth ratio approaches 2 from below as L grows; the growth target is read at the largest doubling."
    )
    return sec


def _fwd_bwd(ctx: Ctx, impl: str):
    """The jitted VJP of ``dot_product_attention(q, k, v, implementation=impl)``: ``(q, k, v, g) -> grads``."""
    from attn_jax.attention import dot_product_attention

    jax = ctx.jax
    f = functools.partial(dot_product_attention, implementation=impl)
    return jax.jit(lambda q, k, v, g: jax.vjp(f, q, k, v)[1](g))


def _fwd(ctx: Ctx, impl: str):
    """The jitted ``dot_product_attention(q, k, v, implementation=impl)``."""
    from attn_jax.attention import dot_product_attention

    return ctx.jax.jit(functools.partial(dot_product_attention, implementation=impl))


def _memory_table(ctx: Ctx, sec: Section, h: int, d: int) -> tuple[dict[int, int], dict[int, int]]:
    """Compiled fwd+bwd memory of plain and chunked at every ``mem_lengths``, as a table; ``(plain, chunked)``."""
    jax, jnp = ctx.jax, ctx.jnp
    rows, chunked_mem, plain_mem = [], {}, {}
    for length in ctx.sizes.mem_lengths:
        spec = jax.ShapeDtypeStruct((1, h, length, d), jnp.float32)
        ctx.log(f"row 2: compiling L={length}")
        plain = compiled_bytes(_fwd_bwd(ctx, "xla").lower(spec, spec, spec, spec).compile())
        chunk = compiled_bytes(_fwd_bwd(ctx, "chunked").lower(spec, spec, spec, spec).compile())
        chunked_mem[length], plain_mem[length] = chunk, plain
        prev = chunked_mem.get(length // 2)
        rows.append(
            [
                str(length),
                fmt_bytes(plain),
                fmt_bytes(chunk),
                fmt_ratio(chunk / plain),
                "—" if prev is None else fmt_ratio(chunk / prev),
                "—" if prev is None else fmt_ratio(plain / plain_mem[length // 2]),
            ]
        )
    sec.table(
        [
            "L",
            "plain fwd+bwd",
            "chunked fwd+bwd",
            "chunked / plain",
            "chunked(L) / chunked(L/2)",
            "plain(L) / plain(L/2)",
        ],
        rows,
    )
    return plain_mem, chunked_mem


def _chunked_error(ctx: Ctx, q, k, v, g) -> tuple[float, float]:
    """Max relative error of chunked against plain: of the output, and the largest of dq, dk, dv."""
    np = ctx.np
    impls = ("xla", "chunked")
    out = {i: np.asarray(_fwd(ctx, i)(q, k, v), np.float64) for i in impls}
    grads = {i: [np.asarray(x, np.float64) for x in _fwd_bwd(ctx, i)(q, k, v, g)] for i in impls}
    rel = float(np.abs(out["chunked"] - out["xla"]).max() / np.abs(out["xla"]).max())
    rel_grad = max(
        float(np.abs(a - b).max() / np.abs(b).max())
        for a, b in zip(grads["chunked"], grads["xla"], strict=True)
    )
    return rel, rel_grad


def _chunked_times(ctx: Ctx, q, k, v, g) -> dict[tuple[str, str], float]:
    """Median seconds of plain and chunked, fwd and fwd+bwd, each pair timed interleaved."""
    times = {}
    for mode in ("fwd", "fwd+bwd"):
        ready = {}
        for impl in ("xla", "chunked"):
            prog, args = (
                (_fwd(ctx, impl), (q, k, v)) if mode == "fwd" else (_fwd_bwd(ctx, impl), (q, k, v, g))
            )
            ready[impl] = jax_call(ctx, prog.lower(*args).compile(), *args)
        ctx.log(f"row 2: timing L={ctx.sizes.time_length} {mode} xla, chunked (interleaved)")
        for impl, t in measure_interleaved(ctx, ready).items():
            times[mode, impl] = t.median
    return times


def _summary(ctx: Ctx, memory, errors, times, grown) -> list[list[str]]:
    """The quantity / value / target / status rows: memory, error, time, RSS and growth against the targets."""
    s = ctx.sizes
    (plain_mem, chunked_mem), (rel, rel_grad) = memory, errors
    top, below = s.mem_lengths[-1], s.mem_lengths[-1] // 2
    at = s.mem_target_length
    summary = [
        [
            f"chunked / plain memory at L={at}",
            fmt_ratio(chunked_mem[at] / plain_mem[at]),
            f"≤ {CHUNKED_MEMORY_FRACTION:g}",
            verdict(chunked_mem[at] <= CHUNKED_MEMORY_FRACTION * plain_mem[at]),
        ],
        [
            f"max rel. error of the output, L={s.err_length}",
            f"{rel:.2e}",
            f"≤ {CHUNKED_REL_ERR_MAX:g}",
            verdict(rel <= CHUNKED_REL_ERR_MAX),
        ],
        [f"max rel. error of dq, dk, dv, L={s.err_length}", f"{rel_grad:.2e}", "(info)", "—"],
    ]
    for mode in ("fwd", "fwd+bwd"):
        ratio = times[mode, "chunked"] / times[mode, "xla"]
        summary.append(
            [
                f"chunked / plain time, {mode}, L={s.time_length} "
                f"({fmt_time(times[mode, 'chunked'])} / {fmt_time(times[mode, 'xla'])})",
                fmt_ratio(ratio),
                f"≤ {CHUNKED_TIME_RATIO_MAX}" if mode == "fwd+bwd" else "(info)",
                verdict(ratio <= CHUNKED_TIME_RATIO_MAX) if mode == "fwd+bwd" else "—",
            ]
        )
    rss_at = max(s.rss_lengths)
    if grown.get((rss_at, "fwd+bwd", "xla"), 0) > 0 and (rss_at, "fwd+bwd", "chunked") in grown:
        measured = grown[rss_at, "fwd+bwd", "chunked"] / grown[rss_at, "fwd+bwd", "xla"]
        summary.append(
            [
                f"chunked / plain peak RSS growth of one fwd+bwd call, L={rss_at} (run, not compiled)",
                fmt_ratio(measured),
                f"≤ {CHUNKED_MEMORY_FRACTION:g}",
                verdict(measured <= CHUNKED_MEMORY_FRACTION),
            ]
        )
    growth = chunked_mem[top] / chunked_mem[below]
    summary.append(
        [
            f"chunked memory growth L={below} → {top} (plain: {plain_mem[top] / plain_mem[below]:.3g})",
            fmt_ratio(growth),
            "≈ 2 (linear; quadratic is 4)",
            verdict(1.6 <= growth <= 2.4),
        ]
    )
    return summary
