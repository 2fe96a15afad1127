"""Row 1: the default ``dot_product_attention`` against ``jax.nn`` and torch SDPA at 1 and 2 threads."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from harness import (
    Ctx,
    Section,
    compiled_bytes,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    jax_call,
    measure_interleaved,
    torch_sync,
    verdict,
)

# Targets (README.md says where each comes from).
DPA_RATIO_MAX = 1.05
DPA_TORCH_RATIO_MAX = 1.2  # CPU attention within 1.2x of torch SDPA (aim 1.0)


def row_dot_product(ctx: Ctx) -> Section:
    """Default ``dot_product_attention`` vs ``jax.nn.dot_product_attention`` vs torch SDPA (1 and 2 threads)."""
    np, s = ctx.np, ctx.sizes
    b, h, d = s.dpa_batch, s.dpa_heads, s.dpa_width
    dtypes = ["float32"] + (["bfloat16"] if ctx.device == "gpu" else [])
    threads = _torch_thread_counts(ctx) if ctx.torch_device == "cpu" else [None]
    sec = Section(
        "1. Scaled dot-product attention: attn_jax default path vs jax.nn vs PyTorch",
        f"B={b}, H={h}, K={d}, self-attention (T = S = L), no mask. attn_jax takes `[B, H, L, K]`, "
        "`jax.nn.dot_product_attention` `[B, L, H, K]` (inputs transposed outside the timed call), torch "
        "`[B, H, L, K]`. fwd+bwd = the VJP of all three inputs against a fixed random cotangent. All variants, "
        "torch's `scaled_dot_product_attention` at each thread count included, are timed in alternation, round "
        "by round (`measure_interleaved`), so that the machine's noise hits every side of a ratio alike (attn_jax "
        "uses every usable core). Targets: attn_jax default / jax.nn ≤ "
        f"{DPA_RATIO_MAX}; attn_jax default / torch SDPA ≤ {DPA_TORCH_RATIO_MAX} against each thread count "
        "(aim ≤ 1.0).",
    )
    rows = []
    rng = np.random.default_rng(0)
    for dtype in dtypes:
        for length in s.dpa_lengths:
            arrays = tuple(rng.standard_normal((b, h, length, d)).astype(np.float32) for _ in range(4))
            variants = _attention_variants(ctx, arrays, dtype)
            path = chosen_path(ctx, *variants["default"][2][:3])
            for mode in ("fwd", "fwd+bwd"):
                times, cells = _time_attention(ctx, variants, arrays, (dtype, length, mode), threads)
                rows.append(_attention_row(ctx, times, cells, [dtype, str(length), mode], path, threads))
    sec.table(_attention_header(ctx, threads), rows)
    if ctx.torch_device is not None:
        sec.notes.append(f"PyTorch SDPA backend for these inputs: {_torch_backend(ctx, (b, h, 256, d))}.")
    sec.notes.append(
        "`path` is what `implementation=None` chose: `xla` (plain), `chunked` (one head's logits ≥ 512² on the "
        "CPU, ≥ 4096² elsewhere; see `attn_jax/attention/_dispatch.py`) or `cudnn`. On the CPU the chunked "
        "kernel loops over (batch, head) with `lax.map`, so each step's 512 × 512 block stays in cache."
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
) -> tuple[dict[str, float], dict[str, str]]:
    """Median seconds and table cells of every variant and torch SDPA for one ``(dtype, L, pass)``, interleaved.

    A variant that does not compile or would not fit in ``ctx.mem_limit`` gets a cell that says so and no time.
    """
    dtype, length, mode = case
    cells: dict[str, str] = {}
    times: dict[str, float] = {}
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
        ctx.log(f"row 1: {dtype} L={length} {mode} {', '.join(ready)} (interleaved)")
        for name, t in measure_interleaved(ctx, ready).items():
            times[name] = t.median
            cells[name] = fmt_time(t.median)
    return times, cells


def _attention_row(
    ctx: Ctx, times: dict[str, float], cells: dict[str, str], first: list[str], path: str, threads
) -> list[str]:
    """One table row: ``first`` (dtype, L, pass), the cells, then each ratio to the default and its verdict."""
    ratio = functools.partial(_ratio_to_default, times)
    tnames = _torch_names(threads)
    row = [*first, f"{cells['default']} ({path})", cells["jax.nn"]]
    row += [cells[t] for t in tnames]
    if ctx.device == "gpu":
        row += [cells["lib cudnn"], cells["jax.nn cudnn"]]
    for name, limit in [("jax.nn", DPA_RATIO_MAX)] + [(t, DPA_TORCH_RATIO_MAX) for t in tnames]:
        r = ratio(name)
        row += ["—" if r is None else fmt_ratio(r), "—" if r is None else verdict(r <= limit)]
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


def _ratio_to_default(times: dict[str, float], other: str) -> float | None:
    """``times["default"] / times[other]``, or None when either side was not measured."""
    return times["default"] / times[other] if {"default", other} <= times.keys() else None


def _torch_thread_counts(ctx: Ctx) -> list[int]:
    """PyTorch thread counts a CPU row compares against: 1 and every usable core."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return sorted({1, usable})


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
