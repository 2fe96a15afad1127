"""The Markdown report: formatting, one row's section, the machine table, and RESULTS.md's device sections."""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import re
import statistics
import subprocess
from collections.abc import Sequence

from harness.context import GIB, MIB, REPO, Ctx, usable_cores

NO_GPU = "not measured (no accelerator available on this machine)"


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


def fmt_spread(values: Sequence[float]) -> str:
    """The median of several runs' values and their min-max range: ``1.07 (1.02–1.12)``."""
    if len(values) == 1:
        return fmt_ratio(values[0])
    return f"{fmt_ratio(statistics.median(values))} ({fmt_ratio(min(values))}–{fmt_ratio(max(values))})"


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
    load: tuple[float, float] | None = None  # 1-minute load average at the row's start and end
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
        load = (
            ""
            if self.load is None
            else f"; load average {self.load[0]:.2f} at start, {self.load[1]:.2f} at end"
        )
        out.append(
            f"\n_Row wall time: {self.seconds:.0f} s (process CPU time {self.cpu_seconds:.0f} s{load})._\n"
        )
        return "\n".join(out)


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
    usable = usable_cores()
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


def section_marker(device: str, end: bool = False) -> str:
    return f"<!-- {'/' if end else ''}section:{device} -->"


def write_results(path: str, device: str, body: str) -> None:
    """Replace this device's section of ``path``, keeping the other sections (gpu_check.py's too) if there."""
    sections = {"cpu": None, "gpu": None, "gpu-check": None}  # "gpu-check": written by gpu_check.py
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = f.read()
        for d in sections:
            m = re.search(
                re.escape(section_marker(d)) + r"\n(.*?)\n" + re.escape(section_marker(d, end=True)),
                old,
                re.S,
            )
            if m:
                sections[d] = m.group(1)
    sections[device] = body
    if sections["cpu"] is None:
        sections["cpu"] = "## CPU\n\nnot measured yet (run `bench.py --device cpu`)."
    if sections["gpu"] is None:
        sections["gpu"] = f"## GPU\n\n{NO_GPU}."
    text = HEADER + "".join(
        f"\n{section_marker(d)}\n{s}\n{section_marker(d, end=True)}\n"
        for d, s in sections.items()
        if s is not None
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
