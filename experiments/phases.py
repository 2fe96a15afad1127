"""Per-phase wall and CPU time for the experiment scripts, plus JAX compile counts.

The timer lives beside the experiments, not in ``attn_jax``, so the library stays free of timing code.
Compile time comes from ``jax.monitoring`` duration events, so it overlaps the phase that triggered it.
"""

from __future__ import annotations

import contextlib
import resource
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
        self.processes = 1
        self._t0 = time.perf_counter()
        self._c0 = self._cpu_now()
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

    @staticmethod
    def _cpu_now() -> float:
        """CPU seconds of this process and of its children that have ended."""
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + children.ru_utime + children.ru_stime

    def total(self) -> tuple[float, float]:
        """Wall and CPU seconds since the timer was made; CPU includes child processes that have ended."""
        return time.perf_counter() - self._t0, self._cpu_now() - self._c0

    def state(self) -> dict:
        """The phases and compile counts as plain data, for another process's timer to :meth:`add`."""
        return {
            "wall": dict(self.wall),
            "cpu": dict(self.cpu),
            "compiles": self.compiles,
            "compile_s": self.compile_s,
            "by_name": dict(self.by_name),
            "seconds_by_name": dict(self.seconds_by_name),
        }

    def add(self, state: dict) -> None:
        """Adds another process's :meth:`state`: its phases, CPU seconds and compiles count here too."""
        for mine, theirs in ((self.wall, state["wall"]), (self.cpu, state["cpu"])):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0.0) + v
        self.compiles += state["compiles"]
        self.compile_s += state["compile_s"]
        for mine, theirs in (
            (self.by_name, state["by_name"]),
            (self.seconds_by_name, state["seconds_by_name"]),
        ):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        self.processes += 1

    def markdown(self) -> list[str]:
        """A phase table: one row per phase, then compile (overlapping the phases) and total.

        With other processes' phases added, a phase's wall seconds are summed over the processes that ran at
        once, so they may exceed the total, which is the elapsed time."""
        wall_total, cpu_total = self.total()
        summed = f", summed over {self.processes} processes" if self.processes > 1 else ""
        rows = [f"| phase | wall s{summed} | CPU s |", "|---|---|---|"]
        rows += [f"| {k} | {self.wall[k]:.1f} | {self.cpu[k]:.1f} |" for k in self.wall]
        rows.append(
            f"| compile ({self.compiles} programs, inside the phases above) | {self.compile_s:.1f} | |"
        )
        rows.append(f"| total{' (elapsed)' if summed else ''} | {wall_total:.1f} | {cpu_total:.1f} |")
        again = sorted((n, k) for k, n in self.by_name.items() if n > 1)[::-1]
        if again:
            rows += ["", "Compiled more than once: " + ", ".join(f"`{k}` x{n}" for n, k in again) + "."]
        slow = sorted(((s, k) for k, s in self.seconds_by_name.items()), reverse=True)[:5]
        if slow:
            rows += ["", "Most compile seconds: " + ", ".join(f"`{k}` {s:.1f} s" for s, k in slow) + "."]
        return rows
