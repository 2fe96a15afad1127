"""Per-phase wall and CPU time for the experiment scripts, plus JAX compile counts.

The timer lives beside the experiments, not in ``attn_jax``, so the library stays free of timing code.
Compile time comes from ``jax.monitoring`` duration events, so it overlaps the phase that triggered it.
"""

from __future__ import annotations

import contextlib
import time

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class PhaseTimer:
    """Accumulates wall and process-CPU seconds per named phase, and backend compiles with their seconds."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.compiles = 0
        self.compile_s = 0.0
        self.by_name: dict[str, int] = {}
        self.seconds_by_name: dict[str, float] = {}
        self._t0 = time.perf_counter()
        self._c0 = time.process_time()
        self._listening = False
        self._open: dict[str, tuple[float, float]] = {}

    def listen(self) -> "PhaseTimer":
        """Registers a jax.monitoring listener that counts backend compiles; returns self."""
        import jax.monitoring

        def on_duration(event: str, duration: float, fun_name: str = "?", **_: object) -> None:
            if event == BACKEND_COMPILE_EVENT:
                self.compiles += 1
                self.compile_s += duration
                self.by_name[fun_name] = self.by_name.get(fun_name, 0) + 1
                self.seconds_by_name[fun_name] = self.seconds_by_name.get(fun_name, 0.0) + duration

        self._listener = on_duration
        jax.monitoring.register_event_duration_secs_listener(on_duration)
        self._listening = True
        return self

    def close(self) -> None:
        """Removes the listener so later runs in the same process are not counted here."""
        if self._listening:
            import jax.monitoring

            jax.monitoring.unregister_event_duration_listener(self._listener)
            self._listening = False

    def start(self, name: str) -> None:
        """Starts phase ``name``; ``stop(name)`` adds the time since to it."""
        self._open[name] = (time.perf_counter(), time.process_time())

    def stop(self, name: str) -> None:
        """Adds the wall and CPU time since ``start(name)`` to phase ``name``."""
        w, c = self._open.pop(name)
        self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
        self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c

    @contextlib.contextmanager
    def phase(self, name: str):
        """Adds the wall and CPU time spent inside the block to phase ``name``."""
        self.start(name)
        try:
            yield
        finally:
            self.stop(name)

    def total(self) -> tuple[float, float]:
        """Wall and CPU seconds since the timer was made."""
        return time.perf_counter() - self._t0, time.process_time() - self._c0

    def markdown(self) -> list[str]:
        """A phase table: one row per phase, then compile (overlapping the phases) and total."""
        wall_total, cpu_total = self.total()
        rows = ["| phase | wall s | CPU s |", "|---|---|---|"]
        rows += [f"| {k} | {self.wall[k]:.1f} | {self.cpu[k]:.1f} |" for k in self.wall]
        rows.append(
            f"| compile ({self.compiles} programs, inside the phases above) | {self.compile_s:.1f} | |"
        )
        rows.append(f"| total | {wall_total:.1f} | {cpu_total:.1f} |")
        again = sorted((n, k) for k, n in self.by_name.items() if n > 1)[::-1]
        if again:
            rows += ["", "Compiled more than once: " + ", ".join(f"`{k}` x{n}" for n, k in again) + "."]
        slow = sorted(((s, k) for k, s in self.seconds_by_name.items()), reverse=True)[:5]
        if slow:
            rows += ["", "Most compile seconds: " + ", ".join(f"`{k}` {s:.1f} s" for s, k in slow) + "."]
        return rows
