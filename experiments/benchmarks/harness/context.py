"""What every row is given: the sizes of a full or a quick run, and the run's context (device, frameworks)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.peak import Peak

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(os.path.dirname(BENCH_DIR))
DEFAULT_OUT = os.path.join(BENCH_DIR, "RESULTS.md")
GIB = 1 << 30
MIB = 1 << 20
CLI = (sys.executable, "-m", "attn_jax.cli")  # the command line, as the rows that run it start it


def subprocess_env(**extra: str) -> dict[str, str]:
    """This process's environment plus ``extra``, with the repository first on ``PYTHONPATH``: a row's
    subprocess imports this checkout's attn_jax."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH", "")]))
    return env


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), which is what XLA's CPU client uses."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def torch_thread_counts() -> list[int]:
    """PyTorch thread counts a CPU row compares against: 1 and every usable core."""
    return sorted({1, usable_cores()})


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Every size the rows use; ``FULL`` is the published run, ``QUICK`` the smoke test's."""

    # timing: each measurement repeats until ~budget seconds, at least min and at most max calls
    min_repeats: int
    max_repeats: int
    budget_s: float
    # rows 1, 4 and 5 measure each ratio this many times and report the median and the min-max spread
    runs: int
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
    # row 8: generated plain-text corpora (pairs) trained with no data flag; in memory too up to the second
    corpus_sizes: tuple[int, ...] = (10**5, 10**6, 5 * 10**6)
    corpus_in_memory_up_to: int = 10**6
    # row 8: data.prepare_above for its runs; None: no flag, the default decides
    corpus_prepare_above: int | None = None
    # row 9: sentences (one a request) sent at each number of concurrent clients, and the time bound of a level
    serve_requests: int = 1000
    serve_concurrency: tuple[int, ...] = (1, 8, 32)
    serve_time_s: float = 180.0


FULL = Sizes(
    min_repeats=3,
    max_repeats=20,
    budget_s=2.0,
    runs=3,
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
    bucket_boundaries=(12, 24),  # each bucket is one train_step and one eval_step compilation
    compile_steps=16,
)

QUICK = Sizes(
    min_repeats=3,
    max_repeats=10,
    budget_s=0.2,
    runs=2,
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
    corpus_in_memory_up_to=4000,
    corpus_prepare_above=2000,
    serve_requests=128,
    serve_time_s=60.0,
)


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
    peak: Peak | None = (
        None  # the machine's measured matmul and bandwidth limits (bench.py measures it first)
    )

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
