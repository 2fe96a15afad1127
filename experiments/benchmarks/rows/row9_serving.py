"""Row 9: `attn-jax serve` under load from 1, 8 and 32 concurrent HTTP clients vs `attn-jax translate`."""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import time

from harness import CLI, REPO, Ctx, Section, fmt_bytes, fmt_ratio, fmt_time, subprocess_env, verdict

# Targets (README.md says where each comes from).
LOST_MAX = 0  # requests without an answer (connection error, timeout): none
RSS_GROWTH_MAX = 1.10  # server RSS after all levels / after the warm-up
BEAM = 4  # beam size of every request and of the translate run
REQUEST_TIMEOUT_S = 60.0  # a request unanswered this long counts as lost


def _rss(pid: int) -> int:
    """Resident set size of a process, bytes (``VmRSS`` of ``/proc/PID/status``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (``/proc/PID/stat``), its threads included."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sentences(run: str, n: int, seed: int = 0) -> list[str]:
    """``n`` sentences of 3-12 words drawn from the run's source vocabulary (specials left out)."""
    import numpy as np

    from attn_jax.data import load_vocabularies

    words = [w for w in load_vocabularies(os.path.join(run, "vocab"))[0].tokens if not w.startswith("<")]
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, int(rng.integers(3, 13)))) for _ in range(n)]


async def _load(url: str, sentences: list[str], clients: int, time_s: float) -> dict:
    """``clients`` tasks each sending one sentence a request, in turn, until every sentence was sent or
    ``time_s`` passed. Returns the latencies of the 200s, the counts, the wall time and the translations."""
    import httpx

    todo = iter(enumerate(sentences))
    latencies, out = [], {}
    counts = {"200": 0, "refused": 0, "lost": 0}
    deadline = time.monotonic() + time_s
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client_task(client):
        for i, s in todo:
            if time.monotonic() > deadline:
                return
            t0 = time.perf_counter()
            try:
                r = await client.post("/translate", json={"sentences": [s], "beam": BEAM})
            except httpx.HTTPError:
                counts["lost"] += 1
                continue
            if r.status_code == 200:
                latencies.append(time.perf_counter() - t0)
                counts["200"] += 1
                out[i] = r.json()["translations"][0]
            else:
                counts["refused"] += 1

    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*[client_task(client) for _ in range(clients)])
        wall = time.perf_counter() - t0
    return {"latencies": latencies, "counts": counts, "wall": wall, "out": out}


def _start_server(cli: list[str], env: dict[str, str], run: str) -> tuple[subprocess.Popen, str]:
    """``attn-jax serve`` on a free port; the process and its URL once it answers."""
    proc = subprocess.Popen(
        [*cli, "serve", "--workdir", run, "--port", "0", "--batch-size", "32", "--max-queue", "256"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    for line in proc.stderr:
        m = re.search(r" on (http://\S+)$", line.strip())
        if m:
            return proc, m.group(1)
    raise RuntimeError(f"attn-jax serve exited {proc.wait()} before listening")


def row_serving(ctx: Ctx) -> Section:
    """`attn-jax serve` throughput and latency at 1, 8 and 32 clients vs `attn-jax translate` on the same sentences."""
    import tempfile

    sizes = ctx.sizes
    env = subprocess_env(JAX_PLATFORMS="cpu")
    cli = list(CLI)
    n = sizes.serve_requests
    sec = Section(
        "9. Serving: `attn-jax serve` under concurrent HTTP clients vs `attn-jax translate`",
        f"A 30-update run of `configs/rnnsearch_cpu.py:smoke` (RNNsearch, hidden 24). {n:,} sentences of 3-12 "
        f"words from its source vocabulary, beam {BEAM}. The server (`--batch-size 32`, `--max-wait-ms 5`, "
        "`--max-queue 256`) runs in its own process on 127.0.0.1; the load generator is an httpx "
        "`AsyncClient` in this process with 1, 8 or 32 tasks, each sending one sentence a request and the next "
        f"when answered, at most {sizes.serve_time_s:.0f} s a level. Before the levels a warm-up sends requests of "
        "1, 2, 4, ... 32 sentences (each batch shape compiles once). `attn-jax translate --input FILE` gets "
        "the same sentences in one file: its process wall includes start-up, the model load and compilation. "
        "Its batch path warm is `attn_jax.pipeline.translate_sentences` (what translate calls, batches of 32 "
        "sorted by length) on the same sentences in this process after a compiling call, the median of "
        f"{sizes.runs} calls, timed before the server starts.",
    )
    with tempfile.TemporaryDirectory(prefix="attn_jax_bench_serve_") as tmp:
        run = os.path.join(tmp, "run")
        ctx.log("row 9: training the 30-update smoke run")
        subprocess.run(
            [
                *cli,
                "train",
                "--config",
                os.path.join(REPO, "configs", "rnnsearch_cpu.py:smoke"),
                "--workdir",
                run,
                "--progress",
                "lines",
                "--config.tensorboard=false",
            ],
            env=env,
            check=True,
            capture_output=True,
        )
        sentences = _sentences(run, n)
        src = os.path.join(tmp, "in.txt")
        with open(src, "w", encoding="utf-8") as f:
            f.write("\n".join(sentences) + "\n")
        ctx.log("row 9: attn-jax translate on the file")
        t0 = time.perf_counter()
        subprocess.run(
            [*cli, "translate", "--workdir", run, "--input", src, "--beam", str(BEAM)]
            + ["--output", os.path.join(tmp, "in.txt.out")],
            env=env,
            check=True,
            capture_output=True,
        )
        translate_wall = time.perf_counter() - t0
        ctx.log("row 9: translate's batch path in this process, warm")
        batch_s = _batch_path_seconds(run, sentences, sizes.runs)
        with open(os.path.join(tmp, "in.txt.out"), encoding="utf-8") as f:
            expected = f.read().splitlines()
        rows, same, lost_total = [], True, 0
        proc, url = _start_server(cli, env, run)
        try:
            ctx.log(f"row 9: server at {url}; warming up")
            warm = [sentences[: 1 << k] for k in range(6)]
            asyncio.run(_warm(url, warm))
            rss_before = _rss(proc.pid)
            for clients in sizes.serve_concurrency:
                ctx.log(f"row 9: {clients} clients, {n} requests")
                cpu0, server0 = time.process_time(), _cpu_seconds(proc.pid)
                got = asyncio.run(_load(url, sentences, clients, sizes.serve_time_s))
                client_cpu, server_cpu = time.process_time() - cpu0, _cpu_seconds(proc.pid) - server0
                lat = sorted(got["latencies"])
                c = got["counts"]
                same &= all(got["out"][i] == expected[i] for i in got["out"])
                rows.append(
                    [
                        f"serve, {clients} client{'s' if clients > 1 else ''}",
                        f"{c['200'] / got['wall']:.1f}",
                        fmt_time(statistics.median(lat)) if lat else "—",
                        fmt_time(lat[max(0, -(-len(lat) * 99 // 100) - 1)]) if lat else "—",
                        f"{c['200']} / {c['refused']} / {c['lost']}",
                        fmt_time(server_cpu / max(1, sum(c.values()))),
                        fmt_time(client_cpu / max(1, sum(c.values()))),
                    ]
                )
                unsent = n - sum(c.values())
                if unsent:
                    sec.notes.append(f"{clients} clients: {unsent} sentences not sent within the time bound")
                lost_total += c["lost"]
            rss_after = _rss(proc.pid)
            metrics = asyncio.run(_metrics(url))
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    rows.append(
        [
            "attn-jax translate (process: start-up, load, compile, decode)",
            f"{n / translate_wall:.1f}",
            "—",
            "—",
            f"{n} / 0 / 0",
            "—",
            "—",
        ]
    )
    rows.append(
        [
            "translate's batch path, warm (`translate_sentences`)",
            f"{n / batch_s:.1f}",
            "—",
            "—",
            "—",
            "—",
            "—",
        ]
    )
    sec.table(
        [
            "path",
            "sentences/s",
            "p50 latency",
            "p99 latency",
            "200 / refused / lost",
            "server CPU / request",
            "load generator CPU / request",
        ],
        rows,
    )
    sec.notes.append(
        f"requests lost (no answer within {REQUEST_TIMEOUT_S:.0f} s or a broken connection), all levels: "
        f"{lost_total} (target {LOST_MAX}: {verdict(lost_total <= LOST_MAX)})"
    )
    growth = rss_after / rss_before
    sec.notes.append(
        f"server RSS after the warm-up {fmt_bytes(rss_before)}, after all levels {fmt_bytes(rss_after)}: "
        f"{fmt_ratio(growth)}x (target ≤ {RSS_GROWTH_MAX}: {verdict(growth <= RSS_GROWTH_MAX)})"
    )
    sec.notes.append(
        f"served translations equal `attn-jax translate`'s: {'yes' if same else 'NO'}; the server exited "
        f"{proc.returncode} on SIGTERM"
    )
    sizes_seen = metrics["batch_sizes"]
    sec.notes.append(
        f"server /metrics: {metrics['requests']:,} requests, {metrics['refused']} refused, {metrics['batches']:,} "
        f"model calls; sentences per call: {', '.join(f'{k}: {v}' for k, v in sizes_seen.items())}"
    )
    return sec


def _batch_path_seconds(run: str, sentences: list[str], runs: int) -> float:
    """Median seconds of ``translate_sentences`` on ``sentences`` (beam ``BEAM``, batches of 32), after a
    first call that compiles every batch shape."""
    from attn_jax.pipeline import DecodeOptions, load_model, quiet_checkpoint_logs, translate_sentences

    quiet_checkpoint_logs()
    loaded = load_model(run)
    options = DecodeOptions(beam_size=BEAM)
    translate_sentences(loaded, sentences, options, batch_size=32)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        translate_sentences(loaded, sentences, options, batch_size=32)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def _warm(url: str, groups: list[list[str]]) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for g in groups:
            r = await client.post("/translate", json={"sentences": g, "beam": BEAM})
            r.raise_for_status()


async def _metrics(url: str) -> dict:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        r = await client.get("/metrics")
        r.raise_for_status()
        return r.json()
