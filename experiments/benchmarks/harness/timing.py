"""Timing of compiled calls: medians after a warm-up, alone or interleaved with the other side of a ratio."""

from __future__ import annotations

import dataclasses
import math
import resource
import statistics
import time
from collections.abc import Callable

from harness.context import Ctx


@dataclasses.dataclass(frozen=True)
class Timing:
    median: float  # seconds per call
    first: float  # the warm-up call (compilation included for JAX)
    calls: int  # timed calls
    usage: Usage | None = None  # the process's resource use per timed call (measure_interleaved only)


@dataclasses.dataclass(frozen=True)
class Usage:
    """Process-wide resource use per call, every thread included (``getrusage(RUSAGE_SELF)`` differences)."""

    user_s: float  # user CPU seconds
    system_s: float  # kernel CPU seconds: page faults, madvise, futex waits and wake-ups
    minor_faults: float
    voluntary_switches: float  # a thread waited: pool hand-offs, sleeps
    involuntary_switches: (
        float  # a thread was preempted: other load on the machine, or more threads than cores
    )


_USAGE_FIELDS = ("ru_utime", "ru_stime", "ru_minflt", "ru_nvcsw", "ru_nivcsw")


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


# A call shorter than SETTLE_BELOW_S is first called untimed for SETTLE_S: longer than PyTorch's idle OpenMP
# threads spin after a call.
SETTLE_BELOW_S = 0.25
SETTLE_S = 0.03


def measure_interleaved(ctx: Ctx, calls: dict[str, Callable[[], object]]) -> dict[str, Timing]:
    """Median seconds of each of several already-compiled calls, timed in alternation.

    Each call is warmed up once; then every round times each call once, the order rotating from round to round,
    until the slowest call's share of ``budget_s`` is spent (``min_repeats``..``max_repeats`` rounds). On a shared,
    noisy machine a slow spell then hits every variant alike instead of whichever one was being timed, so the
    ratios of the medians are far steadier than those of variants timed one after the other.

    A call shorter than ``SETTLE_BELOW_S`` is first called untimed for ``SETTLE_S`` (at least once) in each
    round. Every side is then timed in the steady state of a loop of its own calls, not in the wake of the side
    before it. After a PyTorch call its idle OpenMP threads keep spinning, and a JAX call timed then shares the
    cores with them. Longer calls are timed directly: the spinning is a small share of them, and settling would
    double the row's time.
    """
    s = ctx.sizes
    names = list(calls)

    used = {n: dict.fromkeys(_USAGE_FIELDS, 0.0) for n in names}

    def once(name: str) -> float:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        calls[name]()
        elapsed = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        for f in _USAGE_FIELDS:
            used[name][f] += getattr(r1, f) - getattr(r0, f)
        return elapsed

    first = {n: once(n) for n in names}
    settle = {n: once(n) < SETTLE_BELOW_S for n in names}  # also a second warm-up call
    used = {n: dict.fromkeys(_USAGE_FIELDS, 0.0) for n in names}  # the timed calls' only
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
    return {
        n: Timing(statistics.median(samples[n]), first[n], rounds, _usage(used[n], rounds)) for n in names
    }


def _usage(used: dict[str, float], calls: int) -> Usage:
    per = 1.0 / max(calls, 1)
    return Usage(
        used["ru_utime"] * per,
        used["ru_stime"] * per,
        used["ru_minflt"] * per,
        used["ru_nvcsw"] * per,
        used["ru_nivcsw"] * per,
    )


def measure_runs(ctx: Ctx, calls: dict[str, Callable[[], object]]) -> list[dict[str, Timing]]:
    """``measure_interleaved`` repeated ``ctx.sizes.runs`` times: a ratio's spread from run to run."""
    return [measure_interleaved(ctx, calls) for _ in range(ctx.sizes.runs)]


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
