"""Row 1: the default ``dot_product_attention`` against ``jax.nn`` and torch SDPA at 1 and 2 threads."""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable

from harness import (
    Ctx,
    Section,
    Timing,
    attention_flops,
    compiled_bytes,
    fmt_bytes,
    fmt_spread,
    fmt_time,
    jax_call,
    measure_runs,
    torch_sync,
    torch_thread_counts,
    verdict,
)

# Targets (README.md says where each comes from). A ratio is met only at its aim: machines differ by 20-40 %.
DPA_RATIO_MAX = 1.05
DPA_TORCH_RATIO_MAX = 1.0
# The forward pass reaches this share of the machine's measured matmul peak from this length on.
PEAK_SHARE_MIN = 0.5
PEAK_FROM_LENGTH = 1024


@dataclasses.dataclass
class Case:
    """One ``(dtype, L, pass)``: every side's median per run, its cell, and its resource use in the last run."""

    runs: list[dict[str, float]]
    cells: dict[str, str]
    timings: dict[str, Timing]

    @property
    def times(self) -> dict[str, float]:
        """Each side's median over the runs."""
        names = set.intersection(*(set(r) for r in self.runs)) if self.runs else set()
        return {n: statistics.median(r[n] for r in self.runs) for n in names}

    def ratios(self, other: str) -> list[float]:
        """``default / other`` in each run where both were measured."""
        return [r["default"] / r[other] for r in self.runs if {"default", other} <= r.keys()]


def row_dot_product(ctx: Ctx) -> Section:
    """Default ``dot_product_attention`` vs ``jax.nn.dot_product_attention`` vs torch SDPA (1 and 2 threads)."""
    np, s = ctx.np, ctx.sizes
    b, h, d = s.dpa_batch, s.dpa_heads, s.dpa_width
    dtypes = ["float32"] + (["bfloat16"] if ctx.device == "gpu" else [])
    threads = torch_thread_counts() if ctx.torch_device == "cpu" else [None]
    sec = Section(
        "1. Scaled dot-product attention: attn_jax default path vs jax.nn vs PyTorch",
        f"B={b}, H={h}, K={d}, self-attention (T = S = L), no mask. attn_jax takes `[B, H, L, K]`, "
        "`jax.nn.dot_product_attention` `[B, L, H, K]` (inputs transposed outside the timed call), torch "
        "`[B, H, L, K]`. fwd+bwd = the VJP of all three inputs against a fixed random cotangent. All variants, "
        "torch's `scaled_dot_product_attention` at each thread count included, are timed in alternation, round "
        "by round (`measure_interleaved`), so that the machine's noise hits every side of a ratio alike (attn_jax "
        f"uses every usable core). Each case is measured in {s.runs} runs; a time is the median of the runs, a "
        "ratio the median with the min–max of the runs in brackets, and its verdict judges the median. Targets: "
        f"attn_jax default / jax.nn ≤ {DPA_RATIO_MAX}; attn_jax default / torch SDPA ≤ {DPA_TORCH_RATIO_MAX} "
        "against each thread count.",
    )
    rows, peak_rows = [], []
    rng = np.random.default_rng(0)
    for dtype in dtypes:
        for length in s.dpa_lengths:
            arrays = tuple(rng.standard_normal((b, h, length, d)).astype(np.float32) for _ in range(4))
            variants = _attention_variants(ctx, arrays, dtype)
            path = chosen_path(ctx, *variants["default"][2][:3])
            for mode in ("fwd", "fwd+bwd"):
                case = _time_attention(ctx, variants, arrays, (dtype, length, mode), threads)
                first = [dtype, str(length), mode]
                rows.append(_attention_row(ctx, case, first, path, threads))
                peak_rows.append(_peak_row(ctx, case, first, attention_flops(b, h, length, d, mode), threads))
    sec.table(_attention_header(ctx, threads), rows)
    if ctx.peak is not None:
        sec.table(_peak_header(ctx, threads), peak_rows)
        sec.notes.append(
            "Second table: model GFLOP/s (the four `QKᵀ`/`PV` products forward, three times that with the "
            "backward; softmax not counted) and its share of the machine's measured float32 matmul peak "
            f"({ctx.peak.gflops:.0f} GFLOP/s, the machine table). Aim: the forward at ≥ {PEAK_SHARE_MIN:.0%} "
            f"of the peak from L {PEAK_FROM_LENGTH} on. CPU ms, faults and switches are `getrusage` of the "
            "whole process per timed call, every thread included (last run). Involuntary switches are "
            "preemptions: other load, or more threads than cores; a torch column with many is oversubscribed."
        )
    if ctx.torch_device is not None:
        sec.notes.append(f"PyTorch SDPA backend for these inputs: {_torch_backend(ctx, (b, h, 256, d))}.")
    sec.notes.append(
        "`path` is what `implementation=None` chose: `xla` (plain), `chunked` (one head's logits ≥ 512² on the "
        "CPU, ≥ 4096² elsewhere; see `attn_jax/attention/_dispatch.py`) or `cudnn`. On the CPU the chunked "
        "kernel loops over (batch, head) with `lax.map`, in blocks of 1024 queries × 512 keys (512 × 512 when "
        "causal or windowed)."
    )
    return sec


def _torch_names(threads: list[int | None]) -> list[str]:
    """The keys of the torch SDPA variants, one per thread count (None: as set)."""
    return [f"torch {n}" if n else "torch" for n in threads]


def _attention_header(ctx: Ctx, threads: list[int | None]) -> list[str]:
    """Row 1's table header: times of every variant, then each ratio with its target column."""
    header = ["dtype", "L", "pass", "attn_jax default (path)", "jax.nn"]
    header += [f"torch SDPA, {n} thread{'s' if n > 1 else ''}" if n else "torch SDPA" for n in threads]
    if ctx.device == "gpu":
        header += ["attn_jax cudnn", "jax.nn cudnn"]
    header += ["default / jax.nn", f"target ≤ {DPA_RATIO_MAX}"]
    for n in threads:
        header += [f"default / torch{f' {n}' if n else ''}", f"target ≤ {DPA_TORCH_RATIO_MAX}"]
    return header


def _attention_variants(ctx: Ctx, arrays, dtype: str) -> dict[str, tuple]:
    """The JAX variants of one size: ``name -> (function, implementation, (q, k, v, cotangent))``."""
    from attn_jax.attention import dot_product_attention

    jax, jnp = ctx.jax, ctx.jnp
    jq, jk, jv, jg = (jnp.asarray(x, dtype) for x in arrays)
    tq, tk, tv, tg = (jnp.swapaxes(x, 1, 2) for x in (jq, jk, jv, jg))  # [B, L, H, K] for jax.nn

    def lib(q, k, v, implementation=None):
        return dot_product_attention(q, k, v, implementation=implementation)

    def ref(q, k, v, implementation=None):
        return jax.nn.dot_product_attention(q, k, v, implementation=implementation)

    variants = {"default": (lib, None, (jq, jk, jv, jg)), "jax.nn": (ref, None, (tq, tk, tv, tg))}
    if ctx.device == "gpu":
        variants["lib cudnn"] = (lib, "cudnn", (jq, jk, jv, jg))
        variants["jax.nn cudnn"] = (ref, "cudnn", (tq, tk, tv, tg))
    return variants


def _time_attention(
    ctx: Ctx, variants: dict[str, tuple], arrays, case: tuple[str, int, str], threads: list[int | None]
) -> Case:
    """Every variant and torch SDPA for one ``(dtype, L, pass)``, interleaved, in ``ctx.sizes.runs`` runs.

    A variant that does not compile or would not fit in ``ctx.mem_limit`` gets a cell that says so and no time.
    """
    dtype, length, mode = case
    cells: dict[str, str] = {}
    result = Case([], cells, {})
    ready: dict[str, Callable[[], object]] = {}
    for name, (fn, impl, (a1, a2, a3, cot)) in variants.items():
        try:
            compiled, args = compile_attention_pass(ctx.jax, fn, impl, (a1, a2, a3, cot), mode)
        except Exception as e:  # cuDNN may refuse a dtype/shape: say so in the cell
            cells[name] = f"n/a ({type(e).__name__})"
            continue
        need = compiled_bytes(compiled)
        if need is not None and need > ctx.mem_limit:
            cells[name] = f"skipped (needs {fmt_bytes(need)})"
            continue
        ready[name] = jax_call(ctx, compiled, *args)
    tnames = _torch_names(threads)
    if ctx.torch_device is not None:
        for n, tname in zip(threads, tnames, strict=True):
            ready[tname] = _torch_sdpa(ctx, arrays, dtype, mode, n)
    else:
        cells.update({t: "n/a (no CUDA PyTorch)" for t in tnames})
    if ready:
        ctx.log(f"row 1: {dtype} L={length} {mode} {', '.join(ready)} (interleaved, {ctx.sizes.runs} runs)")
        runs = measure_runs(ctx, ready)
        result.runs = [{name: t.median for name, t in run.items()} for run in runs]
        result.timings = runs[-1]
        cells.update({name: fmt_time(t) for name, t in result.times.items()})
    return result


def _attention_row(ctx: Ctx, case: Case, first: list[str], path: str, threads) -> list[str]:
    """One table row: ``first`` (dtype, L, pass), the cells, then each ratio to the default and its verdict."""
    cells = case.cells
    tnames = _torch_names(threads)
    row = [*first, f"{cells['default']} ({path})", cells["jax.nn"]]
    row += [cells[t] for t in tnames]
    if ctx.device == "gpu":
        row += [cells["lib cudnn"], cells["jax.nn cudnn"]]
    for name, limit in [("jax.nn", DPA_RATIO_MAX)] + [(t, DPA_TORCH_RATIO_MAX) for t in tnames]:
        r = case.ratios(name)
        row += ["—", "—"] if not r else [fmt_spread(r), verdict(statistics.median(r) <= limit)]
    return row


def _peak_header(ctx: Ctx, threads: list[int | None]) -> list[str]:
    """The % of peak table's header: GFLOP/s and % peak per side, the aim, then resource use per side."""
    sides = ["attn_jax"] + [f"torch{f' {n}' if n else ''}" for n in threads]
    header = ["dtype", "L", "pass"]
    for side in sides:
        header += [f"{side} GFLOP/s", f"{side} % peak"]
    header += [f"target: fwd ≥ {PEAK_SHARE_MIN:.0%} peak"]
    for side in (sides[0], sides[-1]):
        header += [f"{side} CPU ms (user/sys)", f"{side} faults", f"{side} switches (vol/invol)"]
    return header


def _peak_row(ctx: Ctx, case: Case, first: list[str], flops: float, threads) -> list[str]:
    """GFLOP/s and % of the measured peak of attn_jax and each torch side; resource use of two of them."""
    times = case.times
    names = ["default", *_torch_names(threads)]
    row = list(first)
    for name in names:
        if name in times:
            gflops = flops / times[name] / 1e9
            row += [f"{gflops:.1f}", ctx.peak.percent(gflops)]
        else:
            row += ["—", "—"]
    aimed = first[2] == "fwd" and int(first[1]) >= PEAK_FROM_LENGTH and "default" in times
    share = flops / times["default"] / 1e9 / ctx.peak.gflops if "default" in times else 0.0
    row.append(verdict(share >= PEAK_SHARE_MIN) if aimed else "—")
    for name in (names[0], names[-1]):
        usage = case.timings[name].usage if name in case.timings else None
        if usage is None:
            row += ["—", "—", "—"]
        else:
            row += [
                f"{1e3 * usage.user_s:.0f} / {1e3 * usage.system_s:.0f}",
                f"{usage.minor_faults:.0f}",
                f"{usage.voluntary_switches:.0f} / {usage.involuntary_switches:.0f}",
            ]
    return row


def compile_attention_pass(jax, fn, impl, arrays, mode: str):
    """``(compiled, args)``: ``fn(q, k, v, implementation=impl)`` compiled forward (``mode="fwd"``, args
    ``(q, k, v)``) or as its VJP of ``q, k, v`` against the cotangent (``"fwd+bwd"``, args ``(q, k, v, cot)``);
    ``arrays`` is ``(q, k, v, cot)``. Shared by row 1 and ``gpu_check.py``."""
    q, k, v, cot = arrays
    f = functools.partial(fn, implementation=impl)
    if mode == "fwd":
        prog, args = jax.jit(f), (q, k, v)
    else:
        prog = jax.jit(lambda q, k, v, cot: jax.vjp(f, q, k, v)[1](cot))
        args = (q, k, v, cot)
    return prog.lower(*args).compile(), args


def chosen_path(ctx: Ctx, q, k, v) -> str:
    """Which implementation ``implementation=None`` picks for these operands (read off the program)."""
    from attn_jax.attention import dot_product_attention

    jax = ctx.jax
    lowered = jax.jit(dot_product_attention).lower(q, k, v)
    if "cudnn" in lowered.as_text():
        return "cudnn"
    if "custom_vjp_call" in str(jax.make_jaxpr(dot_product_attention)(q, k, v)):
        return "chunked"
    return "xla"


def _torch_backend(ctx: Ctx, shape: tuple[int, ...]) -> str:
    """The fused kernel PyTorch's dispatcher picks for differentiable float32 inputs of ``shape``."""
    torch = ctx.torch
    try:
        from torch.nn.attention import SDPBackend

        x = torch.zeros(shape, device=ctx.torch_device, requires_grad=True)
        return SDPBackend(torch._fused_sdp_choice(x, x, x)).name  # private, but the only way to ask
    except Exception as e:  # informational only: never fail the row over it
        return f"unknown ({type(e).__name__})"


def _torch_sdpa(ctx: Ctx, arrays, dtype: str, mode: str, threads: int | None) -> Callable[[], None]:
    """One timed call of torch SDPA (synchronised on CUDA), run at ``threads`` PyTorch threads (None: as set)."""
    torch = ctx.torch
    import torch.nn.functional as F

    tdtype = getattr(torch, dtype)
    q, k, v, g = (torch.from_numpy(x).to(ctx.torch_device, tdtype) for x in arrays)
    sync = torch_sync(ctx)
    if mode == "fwd+bwd":
        for t in (q, k, v):
            t.requires_grad_(True)

    def once():
        if mode == "fwd":
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v)
        else:
            for t in (q, k, v):
                t.grad = None
            F.scaled_dot_product_attention(q, k, v).backward(g)
        if sync is not None:
            sync()

    if threads is None:
        return once

    def call():
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            once()
        finally:
            torch.set_num_threads(before)

    return call
