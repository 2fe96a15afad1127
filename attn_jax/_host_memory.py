"""Keep freed host memory in the C allocator, so that XLA's per-call temp buffer is not faulted in afresh each step.

``import attn_jax`` applies this once, before JAX starts; :func:`host_allocator` says what it did.

On the CPU, XLA allocates one temp buffer per call of a compiled program and frees it at the end. glibc's
``malloc`` serves any block over 32 MiB with a fresh ``mmap`` and returns it with ``munmap``. XLA's worker threads
allocate from arenas that ``mmap`` large blocks whatever ``M_MMAP_MAX`` says. So every step the kernel zero-fills
the whole buffer again, one 4 KiB page fault at a time. Three ``mallopt`` settings, made before JAX starts its CPU
threads, keep the block in the heap instead:

* ``M_ARENA_MAX = 1``: every thread allocates from the main arena (which grows with ``brk``, never bounded);
* ``M_MMAP_MAX = 0``: no block is served by ``mmap``;
* ``M_TRIM_THRESHOLD = 2 GiB - 1``: up to that much free memory at the top of the heap is kept, not returned.

The costs: the process keeps up to its largest step's temp memory after a call ends, for the next call to reuse.
One arena for all threads slows XLA's multi-threaded compilation, while every later step is faster. A short run of
a small model can therefore end a few seconds later; a long or large one gains. ``experiments/benchmarks/README.md``
has the measurements. PyTorch users get the same effect from preloading jemalloc or tcmalloc; this needs no
preload. Opt out with ``ATTN_JAX_HOST_ALLOCATOR=default`` (set before ``import attn_jax``).

The outcome is logged once to the ``logging`` logger ``"attn_jax"``: at INFO when applied or deliberately
left, at WARNING when it came too late (JAX had started first) or the setting was refused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import logging
import os
import pkgutil
import platform
import sys
from typing import NamedTuple

__all__ = ["HostAllocator", "host_allocator", "tune_host_allocator"]

ENV = "ATTN_JAX_HOST_ALLOCATOR"
# (name, glibc <malloc.h> parameter code, value) in the order they are set; mallopt takes an int
SETTINGS = (("M_ARENA_MAX", -8, 1), ("M_MMAP_MAX", -4, 0), ("M_TRIM_THRESHOLD", -1, (1 << 31) - 1))
_DONE: list[HostAllocator] = []  # the first call's answer; mallopt is process-wide and set once


class HostAllocator(NamedTuple):
    """What :func:`tune_host_allocator` did: ``applied`` and a one-line ``message`` saying what or why not."""

    applied: bool
    message: str


def _jax_started() -> bool:
    """True if JAX has already created a backend (and with it the CPU threads, each bound to its own arena)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(bridge, "_backends", None))


def _accelerator_plugin() -> str | None:
    """The name of an installed JAX accelerator plugin that JAX would use, or ``None``."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and all(p.strip() == "cpu" for p in platforms.split(",")):
        return None
    names = [ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")]
    try:
        import jax_plugins  # namespace package of plugins such as jax_cuda12_plugin

        names += [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
    except ImportError:
        pass
    return names[0] if names else None


def host_allocator() -> HostAllocator:
    """What ``import attn_jax`` did to glibc's ``malloc`` (see the module docstring).

    Applied only on Linux with glibc, when JAX computes on the CPU (no accelerator plugin installed, or
    ``JAX_PLATFORMS=cpu``), when JAX had not started before ``import attn_jax``, and unless
    ``ATTN_JAX_HOST_ALLOCATOR=default``. The answer's ``message`` says what was set or why nothing was: the
    trainer and the benchmarks print it with the run's set-up.

    Returns:
      :class:`HostAllocator` ``(applied, message)``.

    Example::

        >>> import attn_jax
        >>> attn_jax.host_allocator().message.startswith("host allocator:")
        True
    """
    return tune_host_allocator()


def tune_host_allocator() -> HostAllocator:
    """Apply the setting if it was not yet tried, and return :func:`host_allocator`'s answer.

    ``import attn_jax`` already calls it, so a later call only returns that first answer.
    """
    if _DONE:
        return _DONE[0]
    prefix = "host allocator:"
    choice = os.environ.get(ENV, "keep").strip().lower()
    reason = None
    missed = True  # a WARNING when the setting was wanted but not made; INFO when left on purpose
    if choice not in ("keep", "default"):
        reason = f"left as it is: {ENV}={choice!r} is neither 'keep' nor 'default'"
    elif choice == "default":
        reason, missed = f"glibc's default ({ENV}=default)", False
    elif sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        libc = platform.libc_ver()[0] or "unknown libc"
        reason, missed = f"left as it is (not Linux with glibc: {sys.platform}, {libc})", False
    elif _jax_started():
        reason = "left as it is: JAX had already started (import attn_jax before the first JAX computation)"
    elif (plugin := _accelerator_plugin()) is not None:
        reason = f"left as it is: JAX has an accelerator plugin ({plugin}), so XLA's buffers are not in host memory"
        missed = False
    if reason is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        failed = [name for name, code, value in SETTINGS if libc.mallopt(code, value) != 1]
        if failed:
            reason = f"mallopt refused {', '.join(failed)}; the allocator may be partly changed"
    if reason is None:
        settings = ", ".join(f"{name}={value}" for name, _, value in SETTINGS)
        answer = HostAllocator(
            True,
            f"{prefix} glibc malloc keeps freed memory ({settings}), so XLA's per-step temp buffer is reused "
            f"instead of page-faulted in again; {ENV}=default turns this off",
        )
    else:
        answer = HostAllocator(False, f"{prefix} {reason}")
    _DONE.append(answer)
    level = logging.WARNING if missed and not answer.applied else logging.INFO
    logging.getLogger("attn_jax").log(level, "%s", answer.message)
    return answer
