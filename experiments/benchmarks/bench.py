"""The attn_jax benchmark harness: every row measured side by side in one process, written to RESULTS.md.

    .venv/bin/python experiments/benchmarks/bench.py                      # full CPU run -> RESULTS.md (7-9 min, 2 cores)
    .venv/bin/python experiments/benchmarks/bench.py --quick --out /tmp/R.md   # smoke sizes (2-5 min, mostly compiling)
    .venv/bin/python experiments/benchmarks/bench.py --device gpu         # the GPU section (+ cuDNN, bfloat16)
    .venv/bin/python experiments/benchmarks/bench.py --quick --rows 2,3   # a subset of the rows, while developing

Rows (see README.md for what each measures and why):

1. ``dot_product_attention`` (default path) vs ``jax.nn.dot_product_attention`` and PyTorch's
   ``scaled_dot_product_attention`` at 1 and 2 threads, forward and forward+backward;
2. plain vs chunked attention: compiled peak memory as ``L`` grows, the peak RSS growth of one executed call
   (fresh subprocesses), error and time of chunked vs plain;
3. additive attention in a decoder ``lax.scan`` at the paper's sizes: naive autodiff vs the fused scorer;
4. RNNsearch training throughput vs the same architecture in PyTorch (``torch_peers.py``), equal parameters;
5. beam-search decoding speed for beams 1, 4, 12 at batch 1 and 32 vs a PyTorch batched beam search at 1 and 2 threads;
6. compilations during a bucketed training run (must equal the number of batch shapes, not grow with steps).

Timings are medians of repeated calls after a warm-up call (JAX programs are compiled ahead of time, so
compilation is never timed), each call ended by ``jax.block_until_ready``; PyTorch runs with ``torch.set_num_threads(<usable cores>)`` unless a row names its thread counts (rows 1, 4
and 5: 1 and 2). Memory is XLA's compiled
memory analysis (argument + output + temp bytes) of the jitted function (row 2 also measures executed calls' RSS), so the large rows are compiled,
never executed. Running ``--device cpu`` rewrites only the CPU section of ``--out`` and keeps an earlier GPU
section (and vice versa). Exit status 1 if any row raised (its section then shows the error).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import functools
import logging
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_OUT = os.path.join(HERE, "RESULTS.md")
NO_GPU = "not measured (no accelerator available on this machine)"
GIB = 1 << 30
MIB = 1 << 20

# ------------------------------------------------------------------------------------------------ sizes


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Every size the rows use; ``FULL`` is the published run, ``QUICK`` the smoke test's."""

    # timing: each measurement repeats until ~budget seconds, at least min and at most max calls
    min_repeats: int
    max_repeats: int
    budget_s: float
    # row 1
    dpa_batch: int
    dpa_heads: int
    dpa_width: int
    dpa_lengths: tuple[int, ...]
    # row 2 (compiled memory only, B=1)
    mem_heads: int
    mem_lengths: tuple[int, ...]
    rss_lengths: tuple[int, ...]  # peak RSS of one executed call, per implementation and pass (subprocesses)
    mem_target_length: int  # the length the "≤ 1/10 of plain" target is checked at
    err_length: int  # chunked vs plain relative error
    time_length: int  # chunked / plain time
    # row 3
    add_batch: int
    add_steps: int  # T (decoder steps) == S (source length)
    add_query: int  # n
    add_align: int  # A; keys are 2n wide
    # row 4 / 5 model (RNNConfig sizes) and data
    vocab: int
    embed: int
    hidden: int
    maxout: int
    align: int
    train_batch: int
    train_length: int  # S == T
    train_steps: int
    # row 4's second size (vocabulary, m, n, l, A, batch, length, timed steps): a paper-like RNNsearch;
    # None skips it (--quick)
    paper_train: tuple[int, int, int, int, int, int, int, int] | None
    # row 5
    beam_batch: int
    beam_sizes: tuple[int, ...]
    # row 6
    bucket_boundaries: tuple[int, ...]
    compile_steps: int
    # row 8: generated plain-text corpora (pairs) trained from prepared data; in memory too up to the second
    corpus_sizes: tuple[int, ...] = (10**5, 10**6, 5 * 10**6)
    corpus_in_memory_up_to: int = 10**6


FULL = Sizes(
    min_repeats=3,
    max_repeats=20,
    budget_s=2.0,
    dpa_batch=4,
    dpa_heads=8,
    dpa_width=64,
    dpa_lengths=(256, 512, 1024, 4096),
    mem_heads=8,
    mem_lengths=(1024, 2048, 4096, 8192, 16384, 32768),
    rss_lengths=(1024, 4096, 8192),
    mem_target_length=16384,
    err_length=2048,
    time_length=4096,
    add_batch=80,
    add_steps=50,
    add_query=1000,
    add_align=1000,
    vocab=2000,
    embed=128,
    hidden=256,
    maxout=128,
    align=128,
    train_batch=32,
    train_length=30,
    train_steps=20,
    paper_train=(8000, 256, 512, 256, 512, 64, 30, 6),
    beam_batch=32,
    beam_sizes=(1, 4, 12),
    bucket_boundaries=(12, 24),  # each bucket is one train_step and one eval_step compilation (~15 s each)
    compile_steps=16,
)

QUICK = Sizes(
    min_repeats=3,
    max_repeats=10,
    budget_s=0.2,
    dpa_batch=1,
    dpa_heads=8,
    dpa_width=64,
    dpa_lengths=(256,),
    mem_heads=8,
    mem_lengths=(1024, 2048),
    rss_lengths=(1024,),
    mem_target_length=2048,
    err_length=512,
    time_length=512,
    add_batch=8,
    add_steps=10,
    add_query=64,
    add_align=64,
    vocab=64,
    embed=16,
    hidden=32,
    maxout=16,
    align=16,
    train_batch=8,
    train_length=8,
    train_steps=3,
    paper_train=None,
    beam_batch=4,
    beam_sizes=(1, 12),  # each beam size is one compilation of the search
    bucket_boundaries=(8, 16),
    compile_steps=6,
    corpus_sizes=(1000, 4000),
    corpus_in_memory_up_to=1000,
)

# Targets (README.md says where each comes from).
DPA_RATIO_MAX = 1.05
DPA_TORCH_RATIO_MAX = 1.2  # CPU attention within 1.2x of torch SDPA (aim 1.0)
CHUNKED_MEMORY_FRACTION = 0.1
CHUNKED_REL_ERR_MAX = 1e-5
CHUNKED_TIME_RATIO_MAX = 1.5
FUSED_MEMORY_FRACTION = 0.25
FUSED_TIME_RATIO_MAX = 1.2
TRAIN_SPEEDUP_MIN = 1.2  # >= 1.2x the fused-GRU PyTorch peer (aim 1.5x)
CORPUS_RSS_RATIO_MAX = 1.5  # peak RSS at 5·10^6 pairs under 1.5x that at 10^5 (prepared data)
BEAM_SPEEDUP_MIN = 1.5  # beam search at >= 1.5x a PyTorch batched beam search (aim 2x)

# Rows 4-6: Adam as in the paper's successors, with the paper's gradient-norm clipping at 1.
LEARNING_RATE = 1e-3
ADAM_EPS = 1e-8
CLIP_NORM = 1.0
# Row 6's batch sizes: different from row 4's (32 full, 8 quick), so no shape is already compiled.
COMPILE_TRAIN_BATCH = 6
COMPILE_EVAL_BATCH = 10

# ------------------------------------------------------------------------------------------------ formatting


def fmt_time(seconds: float) -> str:
    """A duration with three significant digits in a readable unit."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def fmt_bytes(n: float) -> str:
    if n >= GIB:
        return f"{n / GIB:.3g} GiB"
    return f"{n / MIB:.3g} MiB"


def fmt_ratio(x: float) -> str:
    return f"{x:.3g}"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


@dataclasses.dataclass
class Section:
    """One row of the benchmark as Markdown: a heading, a sentence on what was run, tables and notes."""

    title: str
    setup: str = ""
    tables: list[tuple[list[str], list[list[str]]]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    error: str | None = None

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.tables.append((header, rows))

    def markdown(self) -> str:
        out = [f"### {self.title}\n"]
        if self.setup:
            out.append(self.setup + "\n")
        for header, rows in self.tables:
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "---|" * len(header))
            out += ["| " + " | ".join(r) + " |" for r in rows]
            out.append("")
        if self.error:
            out.append(f"**ERROR** (the row did not finish): `{self.error}`\n")
        out += [f"- {n}" for n in self.notes]
        out.append(f"\n_Row wall time: {self.seconds:.0f} s (process CPU time {self.cpu_seconds:.0f} s)._\n")
        return "\n".join(out)


# ------------------------------------------------------------------------------------------------ context


@dataclasses.dataclass
class Ctx:
    """What every row needs: the sizes, the device, the frameworks (imported after the platform is chosen)."""

    sizes: Sizes
    quick: bool
    device: str  # "cpu" | "gpu"
    jax: object
    jnp: object
    np: object
    torch: object | None
    torch_device: str | None  # None: no PyTorch peer on this device
    mem_limit: int  # never execute a JAX program whose compiled footprint exceeds this
    allocator: str = ""  # attn_jax.tune_host_allocator()'s message: what the host allocator was set to

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclasses.dataclass(frozen=True)
class Timing:
    median: float  # seconds per call
    first: float  # the warm-up call (compilation included for JAX)
    calls: int  # timed calls


def measure(
    ctx: Ctx, call: Callable[[], object], sync: Callable[[], None] | None = None, *, compiles: bool = False
) -> Timing:
    """Median seconds of ``call()`` over ``min_repeats``..``max_repeats`` calls (as many as fit ``budget_s``).

    The first call is a warm-up. When ``call`` is already compiled (``compiles=False``) and that call took at
    least ``budget_s``, it also counts as a sample: warm-up effects are milliseconds, and it saves a
    multi-second call on the largest sizes. A call that compiles (``compiles=True``) is never a sample.
    """
    s = ctx.sizes

    def once() -> float:
        t0 = time.perf_counter()
        call()
        if sync is not None:
            sync()
        return time.perf_counter() - t0

    first = once()
    samples = [] if compiles or first < s.budget_s else [first]
    if not samples:
        samples.append(once())
    n = min(s.max_repeats, max(s.min_repeats, math.ceil(s.budget_s / max(samples[0], 1e-9))))
    samples += [once() for _ in range(n - len(samples))]
    return Timing(statistics.median(samples), first, len(samples))


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


# measure_interleaved settles a call shorter than SETTLE_BELOW_S s before each timed call, by calling it untimed
# for SETTLE_S s: past the ~10 ms that PyTorch's idle OpenMP threads spin after a call.
SETTLE_BELOW_S = 0.25
SETTLE_S = 0.03


def measure_interleaved(ctx: Ctx, calls: dict[str, Callable[[], object]]) -> dict[str, Timing]:
    """Median seconds of each of several already-compiled calls, timed in alternation.

    Each call is warmed up once; then every round times each call once, the order rotating from round to round,
    until the slowest call's share of ``budget_s`` is spent (``min_repeats``..``max_repeats`` rounds). On a shared,
    noisy machine a slow spell then hits every variant alike instead of whichever one was being timed, so the
    ratios of the medians are far steadier than those of variants timed one after the other.

    A call shorter than ``SETTLE_BELOW_S`` is first called untimed for ``SETTLE_S`` (at least once) in each round, so
    that every side is timed in the steady state it has in a loop of its own calls (a training loop, repeated
    attention calls), not in the wake of the side before it: after a PyTorch call its idle OpenMP threads spin for
    about 10 ms, and a JAX call timed then shares the 2 cores with them. Measured (L 256 attention forward, 2 cores,
    the median of each of 5 attn_jax calls right after a 2-thread PyTorch call): 4.71, 4.25, 4.04, 3.45, 3.50 ms,
    against 2.8-2.9 ms after an attn_jax call. Longer calls are timed directly: the spinning is then a few per
    cent at most, and settling would double the row's time.
    """
    s = ctx.sizes
    names = list(calls)

    def once(name: str) -> float:
        t0 = time.perf_counter()
        calls[name]()
        return time.perf_counter() - t0

    first = {n: once(n) for n in names}
    settle = {n: once(n) < SETTLE_BELOW_S for n in names}  # also a second warm-up call
    slowest = max(first.values())
    rounds = min(s.max_repeats, max(s.min_repeats, math.ceil(s.budget_s / max(slowest, 1e-9))))
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            if settle[n]:
                until = time.perf_counter() + SETTLE_S
                while True:
                    calls[n]()
                    if time.perf_counter() >= until:
                        break
            samples[n].append(once(n))
    return {n: Timing(statistics.median(samples[n]), first[n], rounds) for n in names}


def compiled_bytes(compiled) -> int | None:
    """Argument + output + temp bytes of a compiled JAX program (``None`` if the backend does not say)."""
    m = compiled.memory_analysis()
    if m is None:
        return None
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)


def jax_call(ctx: Ctx, compiled, *args) -> Callable[[], object]:
    return lambda: ctx.jax.block_until_ready(compiled(*args))


def torch_sync(ctx: Ctx) -> Callable[[], None] | None:
    if ctx.torch_device == "cuda":
        return ctx.torch.cuda.synchronize
    return None


# ------------------------------------------------------------------------------------------------ row 1


def row_dot_product(ctx: Ctx) -> Section:
    """Default ``dot_product_attention`` vs ``jax.nn.dot_product_attention`` vs torch SDPA (1 and 2 threads)."""
    from attn_jax.attention import dot_product_attention

    jax, jnp, np, s = ctx.jax, ctx.jnp, ctx.np, ctx.sizes
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
    tnames = [f"torch {n}" if n else "torch" for n in threads]
    header = ["dtype", "L", "pass", "attn_jax default (path)", "jax.nn"]
    header += [f"torch SDPA, {n} thread{'s' if n > 1 else ''}" if n else "torch SDPA" for n in threads]
    if ctx.device == "gpu":
        header += ["attn_jax cudnn", "jax.nn cudnn"]
    header += ["default / jax.nn", f"target ≤ {DPA_RATIO_MAX}"]
    for n in threads:
        header += [f"default / torch{f' {n}' if n else ''}", f"target ≤ {DPA_TORCH_RATIO_MAX}"]
    rows = []
    rng = np.random.default_rng(0)
    for dtype in dtypes:
        for length in s.dpa_lengths:
            shape = (b, h, length, d)
            q, k, v, g = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
            jq, jk, jv, jg = (jnp.asarray(x, dtype) for x in (q, k, v, g))
            tq, tk, tv, tg = (jnp.swapaxes(x, 1, 2) for x in (jq, jk, jv, jg))  # [B, L, H, K] for jax.nn

            def lib(q, k, v, implementation=None):
                return dot_product_attention(q, k, v, implementation=implementation)

            def ref(q, k, v, implementation=None):
                return jax.nn.dot_product_attention(q, k, v, implementation=implementation)

            variants = {"default": (lib, None, (jq, jk, jv, jg)), "jax.nn": (ref, None, (tq, tk, tv, tg))}
            if ctx.device == "gpu":
                variants["lib cudnn"] = (lib, "cudnn", (jq, jk, jv, jg))
                variants["jax.nn cudnn"] = (ref, "cudnn", (tq, tk, tv, tg))
            path = _chosen_path(ctx, jq, jk, jv)
            for mode in ("fwd", "fwd+bwd"):
                cells: dict[str, str] = {}
                times: dict[str, float] = {}
                ready: dict[str, Callable[[], object]] = {}
                for name, (fn, impl, (a1, a2, a3, cot)) in variants.items():
                    try:
                        compiled, args = compile_attention_pass(jax, fn, impl, (a1, a2, a3, cot), mode)
                    except Exception as e:  # cuDNN may refuse a dtype/shape: say so in the cell
                        cells[name] = f"n/a ({type(e).__name__})"
                        continue
                    need = compiled_bytes(compiled)
                    if need is not None and need > ctx.mem_limit:
                        cells[name] = f"skipped (needs {fmt_bytes(need)})"
                        continue
                    ready[name] = jax_call(ctx, compiled, *args)
                if ctx.torch_device is not None:
                    for n, tname in zip(threads, tnames, strict=True):
                        ready[tname] = _torch_sdpa(ctx, (q, k, v, g), dtype, mode, n)
                else:
                    cells.update({t: "n/a (no CUDA PyTorch)" for t in tnames})
                if ready:
                    ctx.log(f"row 1: {dtype} L={length} {mode} {', '.join(ready)} (interleaved)")
                    for name, t in measure_interleaved(ctx, ready).items():
                        times[name] = t.median
                        cells[name] = fmt_time(t.median)
                ratio = functools.partial(_ratio_to_default, times)
                row = [dtype, str(length), mode, f"{cells['default']} ({path})", cells["jax.nn"]]
                row += [cells[t] for t in tnames]
                if ctx.device == "gpu":
                    row += [cells["lib cudnn"], cells["jax.nn cudnn"]]
                r_ref = ratio("jax.nn")
                row += [
                    "—" if r_ref is None else fmt_ratio(r_ref),
                    "—" if r_ref is None else verdict(r_ref <= DPA_RATIO_MAX),
                ]
                for t in tnames:
                    r = ratio(t)
                    row += [
                        "—" if r is None else fmt_ratio(r),
                        "—" if r is None else verdict(r <= DPA_TORCH_RATIO_MAX),
                    ]
                rows.append(row)
    sec.table(header, rows)
    if ctx.torch_device is not None:
        sec.notes.append(f"PyTorch SDPA backend for these inputs: {_torch_backend(ctx, (b, h, 256, d))}.")
    sec.notes.append(
        "`path` is what `implementation=None` chose: `xla` (plain), `chunked` (one head's logits ≥ 512² on the "
        "CPU, ≥ 4096² elsewhere; see `attn_jax/attention/_dispatch.py`) or `cudnn`. On the CPU the chunked "
        "kernel loops over (batch, head) with `lax.map`, so each step's 512 × 512 block stays in cache."
    )
    return sec


def _ratio_to_default(times: dict[str, float], other: str) -> float | None:
    """``times["default"] / times[other]``, or None when either side was not measured."""
    return times["default"] / times[other] if {"default", other} <= times.keys() else None


def _torch_thread_counts(ctx: Ctx) -> list[int]:
    """PyTorch thread counts a CPU row compares against: 1 and every usable core."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return sorted({1, usable})


def _chosen_path(ctx: Ctx, q, k, v) -> str:
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


# ------------------------------------------------------------------------------------------------ row 2


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

    The compiled memory analysis does not see buffers that XLA's CPU runtime allocates inside a library fusion
    (a plain forward at L=4096 can grow the process by 576 MiB while the analysis says 32 MiB),
    so what a user's process needs is measured here: the peak resident size during the call (``VmHWM``, reset
    just before it through ``/proc/self/clear_refs``) minus the resident size just before it (after compilation and the inputs). A peak reached during compilation and not exceeded by the call
    would read as ≤ 0 and is shown as "< compile peak".
    """
    import json as _json

    rows, grown = [], {}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH", "")]))
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
    from attn_jax.attention import dot_product_attention

    jax, jnp, np, s = ctx.jax, ctx.jnp, ctx.np, ctx.sizes
    h, d = s.mem_heads, s.dpa_width
    sec = Section(
        "2. Chunked (flash-style) vs plain attention: memory, error, time",
        f"B=1, H={h}, K={d}, self-attention, float32, fwd+bwd (VJP of q, k, v). Memory = XLA's compiled "
        "memory analysis (argument + output + temp bytes) of the jitted fwd+bwd program: compiled, never run. "
        f"Targets: chunked ≤ {CHUNKED_MEMORY_FRACTION:g} × plain at L={s.mem_target_length}; relative error "
        f"≤ {CHUNKED_REL_ERR_MAX:g}; chunked / plain time ≤ {CHUNKED_TIME_RATIO_MAX} (L={s.time_length}); "
        "chunked memory grows linearly (×2 per doubling of L).",
    )

    def program(impl):
        f = functools.partial(dot_product_attention, implementation=impl)
        return jax.jit(lambda q, k, v, g: jax.vjp(f, q, k, v)[1](g))

    rows, chunked_mem, plain_mem = [], {}, {}
    for length in s.mem_lengths:
        spec = jax.ShapeDtypeStruct((1, h, length, d), jnp.float32)
        ctx.log(f"row 2: compiling L={length}")
        plain = compiled_bytes(program("xla").lower(spec, spec, spec, spec).compile())
        chunk = compiled_bytes(program("chunked").lower(spec, spec, spec, spec).compile())
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
    grown = _rss_table(ctx, sec, h, d)
    top, below = s.mem_lengths[-1], s.mem_lengths[-1] // 2

    rng = np.random.default_rng(1)

    def inputs(length):
        return [jnp.asarray(rng.standard_normal((1, h, length, d)), jnp.float32) for _ in range(4)]

    # Error of chunked against plain at a size where plain fits.
    q, k, v, g = inputs(s.err_length)
    fwd = {i: jax.jit(functools.partial(dot_product_attention, implementation=i)) for i in ("xla", "chunked")}
    out = {i: np.asarray(fwd[i](q, k, v), np.float64) for i in fwd}
    grads = {i: [np.asarray(x, np.float64) for x in program(i)(q, k, v, g)] for i in fwd}
    rel = float(np.abs(out["chunked"] - out["xla"]).max() / np.abs(out["xla"]).max())
    rel_grad = max(
        float(np.abs(a - b).max() / np.abs(b).max())
        for a, b in zip(grads["chunked"], grads["xla"], strict=True)
    )

    # Time of chunked against plain.
    q, k, v, g = inputs(s.time_length)
    times = {}
    for mode in ("fwd", "fwd+bwd"):
        ready = {}
        for impl in ("xla", "chunked"):
            prog, args = (fwd[impl], (q, k, v)) if mode == "fwd" else (program(impl), (q, k, v, g))
            ready[impl] = jax_call(ctx, prog.lower(*args).compile(), *args)
        ctx.log(f"row 2: timing L={s.time_length} {mode} xla, chunked (interleaved)")
        for impl, t in measure_interleaved(ctx, ready).items():
            times[mode, impl] = t.median

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
    sec.table(["quantity", "value", "target", "status"], summary)
    sec.notes.append(
        "Relative error = max |chunked − plain| / max |plain| (float32 both; plain is the reference path)."
    )
    sec.notes.append(
        "At small L chunked's fixed per-block buffers (query_chunk × key_chunk logits per head) dominate, so "
        "the growth ratio approaches 2 from below as L grows; the growth target is read at the largest doubling."
    )
    return sec


# ------------------------------------------------------------------------------------------------ row 3


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


# ------------------------------------------------------------------------------------------------ row 4


def _step_config(ctx: Ctx):
    """The RNNsearch + Adam configuration rows 4, 5 and 6 share (so they share compiled programs:
    ``init_train_state`` compiles once per run)."""
    from attn_jax.models import RNNConfig
    from attn_jax.train import OptimizerConfig, StepConfig

    s = ctx.sizes
    model = RNNConfig(
        src_vocab=s.vocab,
        tgt_vocab=s.vocab,
        embed=s.embed,
        hidden=s.hidden,
        maxout=s.maxout,
        align=s.align,
    )
    optimizer = OptimizerConfig(name="adam", learning_rate=LEARNING_RATE, eps=ADAM_EPS, clip_norm=CLIP_NORM)
    return StepConfig(model=model, optimizer=optimizer)


def _random_batches(ctx: Ctx, count: int, batch: int, length: int, vocab: int, seed: int):
    """Fixed-shape token batches ``[batch, length]`` with random true lengths in ``[length/2, length]``."""
    from attn_jax.data import BOS_ID, EOS_ID, PAD_ID, Batch

    np = ctx.np
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        pos = np.arange(length)[None, :]
        src_len = rng.integers(length // 2, length + 1, batch).astype(np.int32)
        tgt_len = rng.integers(length // 2, length + 1, batch).astype(np.int32)  # labels incl. </s>
        src = np.where(pos < src_len[:, None], rng.integers(4, vocab, (batch, length)), PAD_ID).astype(
            np.int32
        )
        words = rng.integers(4, vocab, (batch, length))
        tgt_out = np.where(pos < tgt_len[:, None] - 1, words, PAD_ID)
        tgt_out[np.arange(batch), tgt_len - 1] = EOS_ID
        tgt_in = np.concatenate([np.full((batch, 1), BOS_ID), words[:, :-1]], axis=1)
        tgt_in = np.where(pos < tgt_len[:, None], tgt_in, PAD_ID)
        out.append(
            Batch(
                src=src,
                src_len=src_len,
                tgt_in=tgt_in.astype(np.int32),
                tgt_out=tgt_out.astype(np.int32),
                tgt_len=tgt_len,
                example_id=np.arange(batch, dtype=np.int32),
            )
        )
    return out


def row_training(ctx: Ctx) -> Section:
    """RNNsearch train tokens/s in attn_jax (train_step) vs two PyTorch RNNsearch peers (torch_peers)."""
    from attn_jax.models import RNNConfig

    s = ctx.sizes
    cfg = _step_config(ctx).model
    usable = ctx.torch.get_num_threads() if ctx.torch else 1
    sec = Section(
        "4. RNNsearch training throughput: attn_jax vs PyTorch",
        "RNNsearch (additive scorer), batches of random tokens with random true lengths in [L/2, L]; "
        f"Adam (lr {LEARNING_RATE:g}, ε {ADAM_EPS:g}) with global-norm clipping at {CLIP_NORM:g}; the same "
        "batches on every side, 2 warm-up steps, then the timed steps interleaved side by side (one step of each "
        "in turn), median step time. attn_jax: `attn_jax.train.train_step` (jitted, state donated; each step's "
        f"metrics fetched, as the training loop does; XLA uses all {usable} usable cores). PyTorch, eager: "
        "`torch_peers.TorchRNNsearchFused`, RNNsearch as a PyTorch user writes it (one bidirectional `nn.GRU` over "
        "a packed batch, an `nn.GRUCell` decoder, `nn.Linear` scorer and deep output), at 1 and 2 threads -- the "
        "speed peer the target is checked against, at its faster thread count; and `torch_peers.TorchRNNsearch`, "
        "the paper's GRU written out with attn_jax's exact parameters, which must reproduce attn_jax's losses "
        f"(a check that both sides train the same function). Target: attn_jax / fused peer ≥ {TRAIN_SPEEDUP_MIN} "
        "(aim 1.5), at the bench size and at the paper-like size.",
    )
    sizes = [("bench size", cfg, s.train_batch, s.train_length, s.train_steps)]
    if s.paper_train is not None:
        vocab, m, n, lo, a, batch, length, steps = s.paper_train
        sizes.append(
            (
                "paper-like size",
                RNNConfig(src_vocab=vocab, tgt_vocab=vocab, embed=m, hidden=n, maxout=lo, align=a),
                batch,
                length,
                steps,
            )
        )
    for label, model_cfg, batch, length, steps in sizes:
        _training_at(ctx, sec, label, model_cfg, batch, length, steps)
    sec.notes.append(
        "The written-out peer's parameter count is asserted equal to attn_jax's; the fused peer has 9n more "
        "(`nn.GRU`/`nn.GRUCell` carry a second bias per gate) and applies the reset gate after U, so only its "
        "speed is compared. Its thread count is set with `torch.set_num_threads` around each of its steps."
    )
    return sec


def _training_at(ctx: Ctx, sec: Section, label: str, cfg, batch: int, length: int, steps: int) -> None:
    """One size of row 4: a table of every side's tokens/s and a table of ratios, appended to ``sec``."""
    import torch_peers

    from attn_jax.train import init_train_state, param_count, train_step

    jax, np, torch = ctx.jax, ctx.np, ctx.torch
    step_cfg = dataclasses.replace(_step_config(ctx), model=cfg)
    usable = torch.get_num_threads()
    threads = sorted({1, min(2, usable)})
    dims = (cfg.src_vocab, cfg.tgt_vocab, cfg.embed, cfg.hidden, cfg.maxout, cfg.align)
    ctx.log(f"row 4 ({label}): V={cfg.tgt_vocab} m={cfg.embed} n={cfg.hidden} B={batch} L={length}")

    batches = _random_batches(ctx, 4, batch, length, cfg.tgt_vocab, seed=3)
    warmup = 2
    schedule = [batches[i % len(batches)] for i in range(warmup + steps)]
    tokens = sum(int(bt.tgt_len.sum()) for bt in schedule[warmup:])

    device = jax.local_devices()[0]
    state = jax.device_put(init_train_state(step_cfg, 0), device)
    written = torch_peers.TorchRNNsearch(*dims)
    torch_peers.load_jax_params(written, jax.device_get(state.params))
    n_jax, n_written = param_count(cfg), torch_peers.param_count(written)
    if n_jax != n_written:  # the loss check is meaningless unless the two networks are the same
        raise AssertionError(f"parameter counts differ: attn_jax {n_jax:,} vs PyTorch {n_written:,}")
    fused = {}
    for t in threads:
        torch.manual_seed(0)
        fused[t] = torch_peers.TorchRNNsearchFused(*dims)
    n_fused = torch_peers.param_count(fused[threads[0]])
    tdev = ctx.torch_device or "cpu"
    for mdl in (written, *fused.values()):
        mdl.to(tdev)

    def torch_batch(bt):
        return tuple(
            torch.from_numpy(x).to(tdev)
            for x in (
                bt.src.astype(np.int64),
                bt.src_mask,
                bt.tgt_in.astype(np.int64),
                bt.tgt_out.astype(np.int64),
                bt.tgt_mask,
            )
        )

    opt = dict(learning_rate=LEARNING_RATE, clip_norm=CLIP_NORM, eps=ADAM_EPS)
    sides = {("PyTorch, paper GRU written out", usable): torch_peers.make_train_step(written, **opt)}
    for t in threads:
        sides[("PyTorch, fused nn.GRU", t)] = torch_peers.make_train_step(fused[t], **opt)
    times = {k: [] for k in [("attn_jax", usable), *sides]}
    losses = {k: [] for k in times}
    sync = torch_sync(ctx)
    for i, bt in enumerate(schedule):
        t0 = time.perf_counter()
        state, metrics = train_step(state, jax.device_put(bt, device), step_cfg)
        m = jax.device_get(metrics)
        times[("attn_jax", usable)].append(time.perf_counter() - t0)
        losses[("attn_jax", usable)].append(float(m.loss.loss / m.loss.tokens))
        tb = torch_batch(bt)
        for (name, t), step in sides.items():
            torch.set_num_threads(t)
            try:
                t0 = time.perf_counter()
                losses[(name, t)].append(step(*tb))
                if sync:
                    sync()
                times[(name, t)].append(time.perf_counter() - t0)
            finally:
                torch.set_num_threads(usable)
        ctx.log(f"row 4 ({label}): step {i + 1}/{len(schedule)}")

    def tps(key) -> float:
        return tokens / (statistics.median(times[key][warmup:]) * steps)

    params = {
        "attn_jax": n_jax,
        "PyTorch, paper GRU written out": n_written,
        "PyTorch, fused nn.GRU": n_fused,
    }
    sec.table(
        [
            f"{label}: V={cfg.tgt_vocab}, m={cfg.embed}, n={cfg.hidden}, l={cfg.maxout}, A={cfg.align}, "
            f"B={batch}, L={length}, {steps} timed steps",
            "threads",
            "parameters",
            "target tokens/s",
            "median step",
            "first step",
            "loss step 1",
            f"loss step {len(schedule)}",
        ],
        [
            [
                name,
                str(t),
                f"{params[name]:,}",
                f"{tps((name, t)):,.0f}",
                fmt_time(statistics.median(times[(name, t)][warmup:])),
                fmt_time(times[(name, t)][0]),
                f"{losses[(name, t)][0]:.5f}",
                f"{losses[(name, t)][-1]:.5f}",
            ]
            for name, t in times
        ],
    )
    jax_tps = tps(("attn_jax", usable))
    fused_tps = {t: tps(("PyTorch, fused nn.GRU", t)) for t in threads}
    best = max(fused_tps, key=fused_tps.get)
    written_key = ("PyTorch, paper GRU written out", usable)
    loss_diff = max(
        abs(a - b) / abs(b) for a, b in zip(losses[("attn_jax", usable)], losses[written_key], strict=True)
    )
    rows = [
        [
            f"attn_jax / fused peer at {t} thread{'s' if t > 1 else ''}",
            fmt_ratio(jax_tps / fused_tps[t]),
            "(info)",
            "—",
        ]
        for t in threads
    ]
    rows[threads.index(best)][2:] = [
        f"≥ {TRAIN_SPEEDUP_MIN} (aim 1.5) against the faster",
        verdict(jax_tps / fused_tps[best] >= TRAIN_SPEEDUP_MIN),
    ]
    rows.append(["attn_jax / written-out peer", fmt_ratio(jax_tps / tps(written_key)), "(info)", "—"])
    rows.append(
        [
            "max relative loss difference, attn_jax vs written-out peer",
            f"{loss_diff:.1e}",
            "(same function)",
            "—",
        ]
    )
    sec.table(["quantity", "value", "target", "status"], rows)


# ------------------------------------------------------------------------------------------------ row 5


def row_beam(ctx: Ctx) -> Section:
    """Beam-search sentences/s on the row-4 model with random parameters, against a PyTorch batched beam search."""
    from attn_jax.decoding import beam_search
    from attn_jax.train import build_module, init_train_state

    jax, jnp, np, s = ctx.jax, ctx.jnp, ctx.np, ctx.sizes
    step_cfg = _step_config(ctx)
    cfg = step_cfg.model
    length = s.train_length
    torch = ctx.torch
    usable = torch.get_num_threads() if torch is not None else 0
    thread_counts = sorted({1, min(2, usable)}) if torch is not None else []
    sec = Section(
        "5. Beam-search decoding speed: attn_jax vs PyTorch",
        f"`attn_jax.decoding.beam_search` on the row-4 RNNsearch (random parameters), fixed batches of 1 and "
        f"{s.beam_batch} source sentences of width {length} (true lengths in [L/2, L]), output width "
        f"`max_length={length}`, α = 0.6, one best hypothesis returned; compilation (once per shape and beam "
        "size) is the first-call column and is not in the rate. Peer: `torch_peers.beam_search`, an eager "
        "batched beam search with the same rules (fairseq-style: top-2K of the K·V extensions, a `</s>` among "
        "the K best finishes, states and attention history reordered by back-pointers, the same early stop) "
        "on `TorchRNNsearch` with the same parameters, at 1 and 2 PyTorch threads (attn_jax uses every usable "
        "core); all sides timed in alternation. On random parameters the scores are near-ties, so the two may "
        "pick different words; that they implement the same search is checked below on a small model with "
        f"sharpened parameters. Target: attn_jax / PyTorch time ≥ {BEAM_SPEEDUP_MIN} against each thread "
        "count (aim 2).",
    )
    # Row 4's initial parameters: init_train_state is already compiled for this config.
    params = init_train_state(step_cfg, 0).params
    model = build_module(cfg, params)
    tmodel = None
    if torch is not None:
        import torch_peers

        tmodel = torch_peers.TorchRNNsearch(
            cfg.src_vocab, cfg.tgt_vocab, cfg.embed, cfg.hidden, cfg.maxout, cfg.align
        )
        torch_peers.load_jax_params(tmodel, jax.device_get(params))
    rows = []
    for batch in sorted({1, s.beam_batch}):
        rng = np.random.default_rng(4)
        lens = rng.integers(length // 2, length + 1, batch)
        mask = np.arange(length)[None, :] < lens[:, None]
        tokens = np.where(mask, rng.integers(4, cfg.src_vocab, (batch, length)), 0)
        src, jmask = jnp.asarray(tokens, jnp.int32), jnp.asarray(mask)
        for k in s.beam_sizes:
            ctx.log(f"row 5: batch {batch}, beam {k}")
            calls = {
                "attn_jax": lambda k=k, src=src, jmask=jmask: jax.block_until_ready(
                    beam_search(model, src, jmask, beam_size=k, max_length=length, max_length_ratio=None)
                )
            }
            t0 = time.perf_counter()
            calls["attn_jax"]()
            first = time.perf_counter() - t0
            if tmodel is not None:
                tsrc, tmask = torch.as_tensor(tokens), torch.as_tensor(mask)
                for n in thread_counts:

                    def run(n=n, k=k, tsrc=tsrc, tmask=tmask):
                        torch.set_num_threads(n)
                        try:
                            torch_peers.beam_search(tmodel, tsrc, tmask, beam_size=k, max_length=length)
                        finally:
                            torch.set_num_threads(usable)

                    calls[f"torch {n}"] = run
            t = measure_interleaved(ctx, calls)
            row = [str(batch), str(k), f"{batch / t['attn_jax'].median:,.1f}", fmt_time(t["attn_jax"].median)]
            row.append(fmt_time(first))
            for n in thread_counts:
                ratio = t[f"torch {n}"].median / t["attn_jax"].median
                row += [
                    fmt_time(t[f"torch {n}"].median),
                    f"{ratio:.2f}",
                    verdict(ratio >= BEAM_SPEEDUP_MIN),
                ]
            rows.append(row)
    head = ["batch", "beam", "attn_jax sentences/s", "attn_jax time", "first call (compile)"]
    for n in thread_counts:
        head += [f"PyTorch {n} thread{'s' if n > 1 else ''}", f"speed-up vs {n}", "target"]
    sec.table(head, rows)
    if tmodel is not None:
        sec.notes.append(_beam_peer_agreement(ctx, torch_peers))
    return sec


def _beam_peer_agreement(ctx: Ctx, torch_peers) -> str:
    """How often ``torch_peers.beam_search`` returns attn_jax's best hypothesis on a small RNNsearch whose
    parameters are scaled ×8 (decisive scores instead of the near-ties of random initial parameters)."""
    from flax import nnx

    from attn_jax.decoding import beam_search
    from attn_jax.models import RNNConfig, RNNsearch

    jax, jnp, np, torch = ctx.jax, ctx.jnp, ctx.np, ctx.torch
    model = RNNsearch(
        RNNConfig(src_vocab=200, tgt_vocab=50, embed=16, hidden=32, maxout=16, align=16), rngs=nnx.Rngs(0)
    )
    params = jax.tree.map(
        lambda x: np.asarray(x) * 8.0, jax.device_get(nnx.state(model, nnx.Param).to_pure_dict())
    )
    nnx.update(model, params)
    tmodel = torch_peers.TorchRNNsearch(200, 50, 16, 32, 16, 16)
    torch_peers.load_jax_params(tmodel, params)
    batch, length = 16, 12
    rng = np.random.default_rng(1)
    mask = np.arange(length)[None, :] < rng.integers(length // 2, length + 1, batch)[:, None]
    src = np.where(mask, rng.integers(4, 200, (batch, length)), 0)
    parts = []
    for k in (1, 4):
        ours = beam_search(
            model,
            jnp.asarray(src, jnp.int32),
            jnp.asarray(mask),
            beam_size=k,
            max_length=length,
            max_length_ratio=None,
        )
        theirs, _ = torch_peers.beam_search(
            tmodel, torch.as_tensor(src), torch.as_tensor(mask), beam_size=k, max_length=length
        )
        same = sum(np.array_equal(np.asarray(ours.tokens[b, 0]), theirs[b].numpy()) for b in range(batch))
        parts.append(f"beam {k}: {same} of {batch}")
    return (
        "Same search on both sides (a 16-sentence batch, small RNNsearch, parameters ×8, same best hypothesis): "
        + "; ".join(parts)
        + "."
    )


# ------------------------------------------------------------------------------------------------ row 6


class _CompileLog(logging.Handler):
    """Collects JAX's "Compiling <name> ..." records (emitted at DEBUG unless jax_log_compiles is on)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.names: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("Compiling "):
            self.names.append(msg.split()[1])

    def count(self, fragment: str) -> int:
        return sum(fragment in n for n in self.names)


def row_compiles(ctx: Ctx) -> Section:
    """Count compilations of train_step / eval_step over a bucketed run; they must not grow with steps."""
    from attn_jax.data import (
        BatchConfig,
        WordVocabulary,
        corpus_from_pairs,
        encode_corpus,
        make_batch_iterator,
    )
    from attn_jax.train import eval_step, init_train_state, train_step

    jax, np, s = ctx.jax, ctx.np, ctx.sizes
    rng = np.random.default_rng(5)
    words = [f"w{i}" for i in range(40)]
    top = s.bucket_boundaries[-1] - 1  # source + </s> and target + <s> fit the last bucket

    def sentence(lo, hi):
        return " ".join(rng.choice(words, int(rng.integers(lo, hi + 1))))

    pairs = [(sentence(2, top - 1), sentence(2, top - 1)) for _ in range(400)]
    corpus = corpus_from_pairs(pairs, name="bench")
    src_vocab = WordVocabulary.build([p[0] for p in pairs])
    tgt_vocab = WordVocabulary.build([p[1] for p in pairs])
    encoded = encode_corpus(corpus, src_vocab, tgt_vocab)
    train_cfg = BatchConfig(batch_size=COMPILE_TRAIN_BATCH, bucket_boundaries=s.bucket_boundaries, seed=0)
    eval_cfg = BatchConfig(
        batch_size=COMPILE_EVAL_BATCH,
        bucket_boundaries=s.bucket_boundaries,
        shuffle=False,
        num_epochs=1,
        drop_remainder=False,
    )
    # Row 4's configuration (its vocabulary covers this corpus' ids), so init_train_state is not compiled
    # again; the batch sizes here differ from row 4's, so every train_step shape is new to this row.
    step_cfg = _step_config(ctx)
    if max(src_vocab.size, tgt_vocab.size) > step_cfg.model.src_vocab:
        raise ValueError(f"row 6's corpus needs a vocabulary of {max(src_vocab.size, tgt_vocab.size)}")
    sec = Section(
        "6. Compilations during a bucketed training run",
        f"A random 400-pair corpus through `attn_jax.data.make_batch_iterator` with buckets "
        f"{list(s.bucket_boundaries)} (batch {COMPILE_TRAIN_BATCH}), {s.compile_steps} `train_step`s (row 4's "
        f"model and optimiser), then one `eval_step` pass (batch {COMPILE_EVAL_BATCH}, remainder padded). "
        "Compilations are counted from JAX's own `Compiling <fn>` log records. "
        "Target: train_step compilations = distinct training batch shapes seen; none after the first pass "
        "over the shapes; eval_step compilations = distinct evaluation shapes.",
    )
    handler = _CompileLog()
    logger = logging.getLogger("jax._src.interpreters.pxla")
    old_level, old_propagate = logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    try:
        device = jax.local_devices()[0]
        state = jax.device_put(init_train_state(step_cfg, 0), device)
        train_iter = make_batch_iterator(encoded, train_cfg, prefetch=0)
        seen, seen_half, compiles_half = set(), set(), 0
        half = s.compile_steps // 2
        for i in range(s.compile_steps):
            batch = next(train_iter)
            seen.add(batch.src.shape)
            state, metrics = train_step(state, batch, step_cfg)
            jax.device_get(metrics)
            if i + 1 == half:
                seen_half, compiles_half = set(seen), handler.count("train_step")
        train_compiles = handler.count("train_step")
        eval_shapes = set()
        for batch in make_batch_iterator(encoded, eval_cfg, prefetch=0):
            eval_shapes.add(batch.src.shape)
            jax.device_get(eval_step(state.params, batch, step_cfg))
        eval_compiles = handler.count("eval_step")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
    new_late = len(seen) - len(seen_half)
    late = train_compiles - compiles_half
    rows = [
        [
            f"train_step, steps 1–{half}",
            str(len(seen_half)),
            str(compiles_half),
            verdict(compiles_half == len(seen_half)),
        ],
        [
            f"train_step, steps {half + 1}–{s.compile_steps}",
            f"{new_late} new",
            str(late),
            verdict(late == new_late),
        ],
        ["train_step, whole run", str(len(seen)), str(train_compiles), verdict(train_compiles == len(seen))],
        [
            "eval_step, one pass",
            str(len(eval_shapes)),
            str(eval_compiles),
            verdict(eval_compiles == len(eval_shapes)),
        ],
    ]
    sec.table(["program", "distinct batch shapes", "compilations", "status"], rows)
    others = collections.Counter(n for n in handler.names if "train_step" not in n and "eval_step" not in n)
    listed = ", ".join(f"{name} ×{n}" for name, n in sorted(others.items())) or "none"
    sec.notes.append(
        f"Training shapes seen: {sorted(seen)}; evaluation shapes: {sorted(eval_shapes)}. Other programs "
        f"compiled during the run: {listed}."
    )
    return sec


def row_packing(ctx: Ctx) -> Section:
    """Transformer train tokens/s with and without packing (data.pack), measured in the same run."""
    from attn_jax.data import (
        BatchConfig,
        SyntheticSpec,
        WordVocabulary,
        corpus_from_pairs,
        encode_corpus,
        generate_synthetic,
        make_batch_iterator,
    )
    from attn_jax.models import transformer_cpu_config
    from attn_jax.train import OptimizerConfig, StepConfig, init_train_state, train_step

    jax = ctx.jax
    # configs/transformer_cpu.py's model, data and batch size (quick: a tiny corpus, 3 timed rounds)
    spec = SyntheticSpec(
        train_size=400 if ctx.quick else 4000,
        validation_size=1,
        test_per_bucket=1,
        seed=0,
        min_length=3,
        max_length=8 if ctx.quick else 30,
    )
    bounds, batch, rounds = ((16,), 8, 3) if ctx.quick else ((16, 24, 32), 32, 24)
    pairs = generate_synthetic(spec)["train"]
    corpus = corpus_from_pairs(pairs, name="bench")
    src_vocab = WordVocabulary.build(corpus.sources)
    tgt_vocab = WordVocabulary.build(corpus.targets)
    encoded = encode_corpus(corpus, src_vocab, tgt_vocab)
    config = BatchConfig(batch_size=batch, bucket_boundaries=bounds, seed=0)
    model = transformer_cpu_config(src_vocab.size, tgt_vocab.size, max_length=128)
    step_cfg = StepConfig(
        model=model,
        optimizer=OptimizerConfig(name="adam", learning_rate=1e-3, eps=1e-9, b2=0.98, clip_norm=1.0),
        label_smoothing=0.1,
    )
    iters = {
        "unpacked": make_batch_iterator(encoded, config, prefetch=0),
        "packed": make_batch_iterator(encoded, config, prefetch=0, pack=True),
    }
    packing = iters["packed"].plan.packing
    sec = Section(
        "7. Packed sequences: Transformer training tokens/s with and without data.pack",
        f"configs/transformer_cpu.py's model (d 64, 2+2 layers, dropout 0.1) and batches of {batch} rows on "
        f"{len(pairs):,} pairs of the built-in corpus ({spec.min_length}-{spec.max_length} words, buckets "
        f"{list(bounds)}). Unpacked: one pair a row, bucketed; packed: `make_batch_iterator(pack=True)`, "
        f"{packing.summary()}. Every batch shape is compiled before timing; then {rounds} rounds of one "
        "`train_step` of each (order alternating, metrics fetched as the training loop does). Tokens are real "
        "target tokens (labels), the loss's denominator. No target: the ratio is the measurement.",
    )
    state = {k: jax.device_put(init_train_state(step_cfg, 0)) for k in iters}
    for k, it in iters.items():  # compile every shape this run meets
        for _ in range(len(it.plan.shapes) * 4):
            state[k], m = train_step(state[k], next(it), step_cfg)
            jax.device_get(m)
    seconds = {k: 0.0 for k in iters}
    tokens = {k: 0 for k in iters}
    positions = {k: 0 for k in iters}
    names = list(iters)
    for r in range(rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            b = next(iters[k])
            tic = time.perf_counter()
            state[k], m = train_step(state[k], b, step_cfg)
            jax.device_get(m)
            seconds[k] += time.perf_counter() - tic
            tokens[k] += int(b.tgt_len.sum())
            positions[k] += b.tgt_out.size
    tps = {k: tokens[k] / seconds[k] for k in names}
    rows = [
        [
            k,
            f"{tokens[k] / rounds:,.0f}",
            f"{tokens[k] / positions[k]:.1%}",
            fmt_time(seconds[k] / rounds),
            f"{tps[k]:,.0f}",
        ]
        for k in names
    ]
    sec.table(
        ["batches", "target tokens / batch", "real / padded positions", "time / step", "tokens/s"], rows
    )
    sec.notes.append(f"packed / unpacked tokens/s: {fmt_ratio(tps['packed'] / tps['unpacked'])}")
    return sec


def _write_corpus(directory: str, n: int, seed: int = 0) -> None:
    """``n`` generated pairs as ``train.src`` / ``train.tgt``: 3-13 words of 2,000 (1 % of pairs 20 words, over
    the smoke config's limit of 14), the target the source reversed with other spellings. Written in blocks."""
    import numpy as np

    rng = np.random.default_rng(seed)
    src_words = np.array([f"s{k}" for k in range(2000)])
    tgt_words = np.array([f"t{k}" for k in range(2000)])
    block = 50_000
    with (
        open(os.path.join(directory, "train.src"), "w", encoding="utf-8") as fs,
        open(os.path.join(directory, "train.tgt"), "w", encoding="utf-8") as ft,
    ):
        for start in range(0, n, block):
            m = min(block, n - start)
            lengths = np.where(rng.random(m) < 0.01, 20, rng.integers(3, 14, m))
            ids = rng.zipf(1.3, int(lengths.sum())) % 2000
            ends = np.cumsum(lengths)
            src, tgt = src_words[ids], tgt_words[ids]
            fs.write("".join(" ".join(src[e - k : e]) + "\n" for e, k in zip(ends, lengths, strict=True)))
            ft.write(
                "".join(" ".join(tgt[e - k : e][::-1]) + "\n" for e, k in zip(ends, lengths, strict=True))
            )


def _run_measured(argv: list[str], env: dict[str, str], mark: str) -> tuple[float, float | None, int, str]:
    """Run a command; ``(wall s, s until the first output line starting with mark or None, peak RSS bytes of
    the process, output)``. The peak is the child's own ``ru_maxrss`` (``os.wait4``)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen, lines = None, []
    for line in p.stdout:
        lines.append(line)
        if seen is None and line.startswith(mark):
            seen = time.perf_counter() - t0
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[2:5])} exited {p.returncode}: {''.join(lines[-5:]).strip()}")
    return wall, seen, usage.ru_maxrss * 1024, "".join(lines)


def row_large_corpus(ctx: Ctx) -> Section:
    """Peak RSS and start-up of a 30-update `attn-jax train` as the plain-text corpus grows (data.prepared_dir)."""
    import tempfile

    sizes = ctx.sizes
    smoke = os.path.join(REPO, "configs", "rnnsearch_cpu.py:smoke")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH", "")]))
    cli = [sys.executable, "-m", "attn_jax.cli"]
    sec = Section(
        "8. Corpora larger than memory: peak RSS and start-up of `attn-jax train` against corpus size",
        "Generated plain-text corpora (3-13 words of 2,000 a side, 1 % of pairs over the length limit). "
        "`attn-jax data --prepare` writes the training split as memory-mapped arrays; then a 30-update "
        "`attn-jax train` of `configs/rnnsearch_cpu.py:smoke` (RNNsearch, hidden 24, batches of 16, no "
        "validation) reads it with `data.prepared_dir`, and, up to "
        f"{sizes.corpus_in_memory_up_to:,} pairs, the same run reads the text into memory as before. Each command "
        "is a fresh process; peak RSS is its `ru_maxrss`; start-up is launch to the `model:` line, printed once "
        "the data are read, the vocabularies built and the batch schedule made (JAX's import included, "
        "compilation not).",
    )
    rows, peaks = [], {}
    with tempfile.TemporaryDirectory(prefix="attn_jax_bench_corpus_") as tmp:
        for n in sizes.corpus_sizes:
            d = os.path.join(tmp, f"c{n}")
            os.makedirs(d)
            ctx.log(f"row 8: generating {n:,} pairs")
            t0 = time.perf_counter()
            _write_corpus(d, n)
            generated = time.perf_counter() - t0
            common = [
                "--config",
                smoke,
                "--config.data.corpus=plain",
                f"--config.data.source_path={d}/{{split}}.src",
                f"--config.data.target_path={d}/{{split}}.tgt",
                "--config.data.eval_split=none",
            ]
            prepared = os.path.join(tmp, f"p{n}")
            ctx.log(f"row 8: preparing {n:,} pairs")
            prep_s, _, prep_rss, out = _run_measured(
                [*cli, "data", "--prepare", "--out", prepared, *common], env, ""
            )
            rate = re.search(r"data: prepared [\d,]+ pairs in [\d.]+ s \(([\d,]+) pairs/s\)", out)
            train = [
                "train",
                "--progress",
                "lines",
                *common,
                "--config.checkpoint_every=30",
                "--config.tensorboard=false",
                "--config.async_checkpoints=false",
            ]
            ctx.log(f"row 8: training 30 updates from the prepared {n:,} pairs")
            wall, start, rss, out = _run_measured(
                [
                    *cli,
                    *train,
                    "--workdir",
                    os.path.join(tmp, f"r{n}"),
                    f"--config.data.prepared_dir={prepared}",
                ],
                env,
                "model: ",
            )
            if "data: reusing prepared train split" not in out:
                raise RuntimeError(f"the run did not reuse {prepared}: {out[-500:]}")
            peaks[n] = rss
            row = [
                f"{n:,}",
                fmt_time(generated),
                f"{fmt_time(prep_s)} ({rate.group(1) if rate else '?'} pairs/s)",
                fmt_bytes(prep_rss),
                fmt_time(start),
                fmt_time(wall),
                fmt_bytes(rss),
            ]
            if n <= sizes.corpus_in_memory_up_to:
                ctx.log(f"row 8: training 30 updates from {n:,} pairs in memory")
                _, mem_start, mem_rss, _ = _run_measured(
                    [*cli, *train, "--workdir", os.path.join(tmp, f"m{n}")], env, "model: "
                )
                row += [fmt_time(mem_start), fmt_bytes(mem_rss)]
            else:
                row += ["—", "—"]
            rows.append(row)
            shutil.rmtree(d)
            shutil.rmtree(prepared)
    sec.table(
        [
            "pairs",
            "generate",
            "prepare: process wall (pairs/s preparing)",
            "prepare: peak RSS",
            "train (prepared): start-up",
            "train (prepared): wall",
            "train (prepared): peak RSS",
            "train (in memory): start-up",
            "train (in memory): peak RSS",
        ],
        rows,
    )
    small, large = min(peaks), max(peaks)
    ratio = peaks[large] / peaks[small]
    sec.notes.append(
        f"peak RSS at {large:,} / at {small:,} pairs (prepared): {fmt_ratio(ratio)} "
        f"(target < {CORPUS_RSS_RATIO_MAX}: {verdict(ratio < CORPUS_RSS_RATIO_MAX)})"
    )
    return sec


# ------------------------------------------------------------------------------------------------ driver

ROWS: dict[int, Callable[[Ctx], Section]] = {
    1: row_dot_product,
    2: row_chunked,
    3: row_additive,
    4: row_training,
    5: row_beam,
    6: row_compiles,
    7: row_packing,
    8: row_large_corpus,
}


def machine_info(ctx: Ctx) -> list[tuple[str, str]]:
    """CPU model and cores, memory, accelerator, versions, date, git commit."""
    import importlib.metadata

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            kb = int(next(ln for ln in f if ln.startswith("MemTotal")).split()[1])
        mem = f"{kb / (1 << 20):.1f} GiB"
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = [
        ("date", datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")),
        ("git commit", _git_commit()),
        ("CPU", f"{cpu}, {os.cpu_count()} logical cores ({usable} usable)"),
        ("memory", mem),
        ("platform", platform.platform()),
        ("JAX devices", ", ".join(str(d.device_kind) for d in ctx.jax.local_devices())),
        ("load average at start (1 min)", f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "?"),
        ("host allocator (both sides)", ctx.allocator.removeprefix("host allocator: ")),
    ]
    versions = [("python", platform.python_version())]
    for name in ("jax", "jaxlib", "flax", "optax", "numpy", "torch"):
        try:
            versions.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            versions.append((name, "not installed"))
    if ctx.torch is not None:
        versions.append(("torch threads", str(ctx.torch.get_num_threads())))
    return info + versions


def _git_commit() -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return (commit or "?") + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def device_section(ctx: Ctx, sections: Sequence[Section], info, argv: Sequence[str], total_s: float) -> str:
    name = "CPU" if ctx.device == "cpu" else "GPU"
    lines = [f"## {name}{' (quick sizes: a smoke run, not the published numbers)' if ctx.quick else ''}\n"]
    lines.append(
        f"Command: `python experiments/benchmarks/bench.py {' '.join(argv)}`. Total wall time {total_s:.0f} s.\n"
    )
    lines += ["| machine | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in info]
    lines.append(f"| load average at end (1 min) | {os.getloadavg()[0]:.2f} |\n")
    status = []
    for sec in sections:
        for header, rows in sec.tables:
            # every target column: rows 1 and 5 have one per peer (torch at 1 and at 2 threads), not only the last
            cols = [i for i, h in enumerate(header) if h == "status" or h.startswith("target")]
            status += [r[i] for r in rows for i in cols if r[i] in ("met", "MISSED")]
    lines.append(
        f"Targets: {status.count('met')} met, {status.count('MISSED')} MISSED"
        + (
            f", {sum(s.error is not None for s in sections)} row(s) failed"
            if any(s.error for s in sections)
            else ""
        )
        + ".\n"
    )
    lines += [sec.markdown() for sec in sections]
    return "\n".join(lines)


HEADER = """# attn_jax benchmarks

Written by `experiments/benchmarks/bench.py` (see README.md there for what each row measures and how to run
it). Times are medians after a warm-up call; ratios are attn_jax / peer (lower is better for times and memory,
higher for throughput). A target column says **met** or **MISSED**; nothing here is edited by hand.
"""


def _marker(device: str, end: bool = False) -> str:
    return f"<!-- {'/' if end else ''}section:{device} -->"


def write_results(path: str, device: str, body: str) -> None:
    """Replace this device's section of ``path``, keeping the other sections (gpu_check.py's too) if there."""
    sections = {"cpu": None, "gpu": None, "gpu-check": None}  # "gpu-check": written by gpu_check.py
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = f.read()
        for d in sections:
            m = re.search(re.escape(_marker(d)) + r"\n(.*?)\n" + re.escape(_marker(d, end=True)), old, re.S)
            if m:
                sections[d] = m.group(1)
    sections[device] = body
    if sections["cpu"] is None:
        sections["cpu"] = "## CPU\n\nnot measured yet (run `bench.py --device cpu`)."
    if sections["gpu"] is None:
        sections["gpu"] = f"## GPU\n\n{NO_GPU}."
    text = HEADER + "".join(
        f"\n{_marker(d)}\n{s}\n{_marker(d, end=True)}\n" for d, s in sections.items() if s is not None
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke sizes: every row in about a minute")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where JAX (and PyTorch) run")
    p.add_argument("--out", default=DEFAULT_OUT, help="the Markdown file to write (default: %(default)s)")
    p.add_argument("--rows", default="1,2,3,4,5,6", help="comma-separated row numbers (default: all)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    rows = [int(r) for r in args.rows.split(",") if r.strip()]
    if unknown := [r for r in rows if r not in ROWS]:
        raise SystemExit(f"unknown rows {unknown}; choose from {sorted(ROWS)}")
    # The platform must be fixed before JAX is imported.
    if args.device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
    else:
        os.environ.pop("JAX_PLATFORMS", None)
    sys.path.insert(0, HERE)  # torch_peers
    # What `attn-jax train` does before JAX starts (attn_jax/_host_memory.py): one process-wide malloc
    # setting, so both sides of every row, PyTorch included, run under it.
    from attn_jax import tune_host_allocator

    allocator = tune_host_allocator().message
    import jax
    import jax.numpy as jnp
    import numpy as np

    if args.device == "gpu" and jax.default_backend() != "gpu":
        print(
            f"--device gpu: JAX's backend is {jax.default_backend()!r}; GPU section: {NO_GPU}",
            file=sys.stderr,
        )
        write_results(args.out, "gpu", f"## GPU\n\n{NO_GPU}.")
        return 1
    try:
        import torch
    except ImportError:
        torch = None
    torch_device = None
    if torch is not None:
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        torch.set_num_threads(usable)
        if args.device == "cpu":
            torch_device = "cpu"
        elif torch.cuda.is_available():
            torch_device = "cuda"
    ctx = Ctx(
        sizes=QUICK if args.quick else FULL,
        quick=args.quick,
        device=args.device,
        jax=jax,
        jnp=jnp,
        np=np,
        torch=torch,
        torch_device=torch_device,
        mem_limit=12 * GIB if args.device == "cpu" else 60 * GIB,
        allocator=allocator,
    )
    ctx.log(allocator)
    if torch is None:
        ctx.log("PyTorch is not installed: the PyTorch columns say n/a (install the `bench` extra)")
    info = machine_info(ctx)
    start = time.perf_counter()
    sections = []
    for r in rows:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            if r == 4 and torch is None:
                raise RuntimeError("row 4 needs PyTorch (pip install -e '.[bench]')")
            sec = ROWS[r](ctx)
        except Exception as e:  # one failing row must not hide the others' numbers
            traceback.print_exc()
            sec = Section(f"{r}. {ROWS[r].__doc__.splitlines()[0]}", error=f"{type(e).__name__}: {e}")
        sec.seconds, sec.cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        ctx.log(f"row {r} done in {sec.seconds:.0f} s (CPU {sec.cpu_seconds:.0f} s)")
        sections.append(sec)
    total = time.perf_counter() - start
    write_results(args.out, args.device, device_section(ctx, sections, info, argv, total))
    ctx.log(f"wrote {args.out} ({total:.0f} s)")
    return 1 if any(sec.error for sec in sections) else 0


if __name__ == "__main__":
    sys.exit(main())
