"""One command for whoever has a GPU for ten minutes: the `gpu` tests and the GPU numbers, into RESULTS.md.

    make gpu-check                                                   # = the line below, after the install
    .venv/bin/python experiments/benchmarks/gpu_check.py             # ≤ 8 min on one GPU -> RESULTS.md + JSON
    .venv/bin/python experiments/benchmarks/gpu_check.py --tiny      # each section once, tiny; no writes

With a GPU (JAX's first device is a ``gpu``) it runs, each section in its own process under its own time cap
(``CAPS``, 450 s together, so the whole check stays within 8 minutes):

1. ``tests``: ``pytest -m gpu tests/`` (the tests that need an accelerator);
2. ``matmul``: the measured peak of a large square bfloat16 matmul (TFLOP/s), the yardstick of 3;
3. ``attention``: bfloat16 self-attention TFLOP/s of ``dot_product_attention`` with each ``implementation``
   (``None``, ``"xla"``, ``"chunked"``, ``"cudnn"``, ``"pallas"``) and of ``jax.nn.dot_product_attention(implementation=
   "cudnn")``, forward and forward+backward, at several lengths, as a fraction of that peak;
4. ``rnnsearch``: RNNsearch training tokens/s at the paper's size (``configs/rnnsearch50.py``:
   620/1000/500/1000, 30,000-word vocabularies, batches of 80, S = T = 50), float32 (the config) and bfloat16
   compute;
5. ``gnmt``: GNMT training steps on one device at the paper's size (``configs/gnmt_wmt14.py``: 8 + 8 LSTM
   layers of 1024, 32k vocabularies, batches of 128, S = T = 50);
6. ``remat``: the device's temporary memory of the Transformer base's compiled gradient (batch 64, S = T = 64)
   under each ``model.remat`` policy, from ``memory_analysis()`` (the CPU's table: experiments/remat).

It then replaces the ``gpu-check`` section of ``--out`` (experiments/benchmarks/RESULTS.md), between its
markers, writes the same numbers as ``gpu_check.json`` beside it and prints a short summary. Timings: every
program is compiled ahead of time (compilation is reported, never timed), then warmed up, then the median of
several calls each ended by ``jax.block_until_ready`` (``harness.measure``/``harness.measure_interleaved``). A
section near its cap starts nothing new and names what it did not run; one killed at its cap keeps the rows it
finished. A killed or failed section, or a failing test, makes the exit status 1.

Without a GPU it says so on its first line, measures nothing and writes nothing: it runs every section once at
tiny sizes on the CPU (the `gpu` tests are then collected and skip themselves), renders the report into a
temporary copy of RESULTS.md, and exits 0 if all of that worked (1 if a section broke), so the script cannot
rot on machines without an accelerator: about one CPU-minute (2-3 minutes on two busy cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402  (the benchmark's timing, formatting and RESULTS.md writer: one of each)
from harness import section_marker  # noqa: E402
from rows.rnnsearch import random_batches  # noqa: E402
from rows.row1_attention import chosen_path, compile_attention_pass  # noqa: E402

SECTION = "gpu-check"  # RESULTS.md's markers: <!-- section:gpu-check --> ... <!-- /section:gpu-check -->
# Seconds per section, each a hard limit on its process (start-up and compilation included). 450 s together
# plus the parent's few seconds keeps `make gpu-check` within 8 minutes.
CAPS = {"tests": 70, "matmul": 30, "attention": 130, "rnnsearch": 90, "gnmt": 85, "remat": 45}
# A section stops starting new work this long before its cap, so it can still save what it measured.
MARGIN_S = 12
NO_GPU_LINE = (
    "No GPU: JAX's default backend is {backend!r}, so nothing was measured and RESULTS.md is left unchanged."
)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The sizes of a run: ``GPU`` the published check, ``TINY`` the CPU check that keeps the script alive."""

    timing: harness.Sizes  # only its min_repeats / max_repeats / budget_s are read (harness.measure*)
    matmul: tuple[int, ...]  # square bfloat16 matmuls n x n x n; the peak is the fastest
    matmul_f32: int  # one float32 matmul (info: the RNNsearch rows compute in float32)
    attn_tokens: (
        int  # B = max(1, tokens // L): the same work per row up to L², as FlashAttention's benchmarks
    )
    attn_heads: int
    attn_width: int
    attn_lengths: tuple[int, ...]
    tiny_model: bool  # True: the configs' `smoke` models, vocabularies of tiny_vocab
    tiny_vocab: int
    rnn_batch: int | None  # None: the config's batch and length
    rnn_length: int | None
    rnn_steps: int  # timed steps after the warm-up steps
    rnn_dtypes: tuple[str, ...]  # compute dtypes: float32 is the config, bfloat16 its mixed precision
    gnmt_batch: int | None
    gnmt_length: int | None
    gnmt_steps: int


_TIMING = dataclasses.replace(harness.QUICK, min_repeats=3, max_repeats=20, budget_s=0.5)
GPU = Sizes(
    timing=_TIMING,
    matmul=(4096, 8192, 16384),
    matmul_f32=8192,
    attn_tokens=16384,
    attn_heads=16,
    attn_width=128,
    attn_lengths=(1024, 4096, 16384),  # ascending: a cap cuts the longest
    tiny_model=False,
    tiny_vocab=0,
    rnn_batch=None,
    rnn_length=None,
    rnn_steps=10,
    rnn_dtypes=("float32", "bfloat16"),
    gnmt_batch=None,
    gnmt_length=None,
    gnmt_steps=3,
)
TINY = Sizes(
    timing=dataclasses.replace(harness.QUICK, min_repeats=2, max_repeats=2, budget_s=0.01),
    matmul=(64, 128),
    matmul_f32=64,
    attn_tokens=128,
    attn_heads=2,
    attn_width=16,
    attn_lengths=(64,),
    tiny_model=True,
    tiny_vocab=64,
    rnn_batch=4,
    rnn_length=8,
    rnn_steps=2,
    rnn_dtypes=("float32",),  # mixed precision is the same code with another dtype; compiling it costs ~30 s
    gnmt_batch=4,
    gnmt_length=8,
    gnmt_steps=1,
)

# Attention variants: (label, function, implementation). "default" is implementation=None.
ATTN_VARIANTS = ("default", "xla", "chunked", "cudnn", "pallas", "jax.nn cudnn")
# FlashAttention's count (Dao et al.): forward 4·B·H·T·S·K (QKᵀ and PV); forward+backward 3.5× that, the
# backward's five matmuls including the recomputation of QKᵀ, so these TFLOP/s compare with published ones.
FWD_BWD_FLOPS = 3.5


# ------------------------------------------------------------------------------------------------ sections
# Each runs in its own process (``--child NAME``) and saves its result after every row (Recorder), so that
# the parent still has the finished rows when the section is killed at its cap.


class Recorder:
    """A section's result as JSON-ready data, saved to ``path`` after every change."""

    def __init__(self, name: str, path: str, deadline: float):
        self.path, self.deadline = path, deadline
        self.data: dict = {"section": name, "rows": [], "info": {}, "not_run": [], "error": None}
        self.save()

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)

    def row(self, **row) -> None:
        self.data["rows"].append(row)
        self.save()

    def info(self, **info) -> None:
        self.data["info"].update(info)
        self.save()

    def out_of_time(self, what: str) -> bool:
        """True (and ``what`` recorded as not run) when the section's time is up."""
        if time.monotonic() < self.deadline:
            return False
        self.data["not_run"].append(what)
        self.save()
        return True


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _ctx(sizes: Sizes):
    """A ``harness.Ctx`` for the harness's helpers (timing, batches); no PyTorch here."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    # Never execute a program that would not fit: 80 % of what the allocator may use (CPU: 4 GiB).
    limit = int(0.8 * stats["bytes_limit"]) if "bytes_limit" in stats else 4 * harness.GIB
    return harness.Ctx(
        sizes=sizes.timing,
        quick=sizes.tiny_model,
        device="gpu" if device.platform == "gpu" else "cpu",
        jax=jax,
        jnp=jnp,
        np=np,
        torch=None,
        torch_device=None,
        mem_limit=limit,
    )


def section_matmul(rec: Recorder, sizes: Sizes, peak: float | None) -> None:
    """Square matmuls: bfloat16 at several sizes (the fastest is the peak), one float32 for reference."""
    ctx = _ctx(sizes)
    jax, jnp = ctx.jax, ctx.jnp
    cases = [("bfloat16", n) for n in sizes.matmul] + [("float32", sizes.matmul_f32)]
    for dtype, n in cases:
        if rec.out_of_time(f"{dtype} n={n}"):
            continue
        ka, kb = jax.random.split(jax.random.key(n))
        a = jax.random.normal(ka, (n, n), dtype)
        b = jax.random.normal(kb, (n, n), dtype)
        compiled = jax.jit(jnp.matmul).lower(a, b).compile()
        _log(f"matmul: {dtype} {n}x{n}x{n}")
        t = harness.measure(ctx, harness.jax_call(ctx, compiled, a, b))
        rec.row(dtype=dtype, n=n, seconds=t.median, calls=t.calls, tflops=2 * n**3 / t.median / 1e12)


def section_attention(rec: Recorder, sizes: Sizes, peak: float | None) -> None:
    """bfloat16 self-attention, no mask: each implementation of this library and jax.nn's cuDNN path."""
    from attn_jax.attention import dot_product_attention

    ctx = _ctx(sizes)
    jax = ctx.jax
    h, d = sizes.attn_heads, sizes.attn_width
    rec.info(heads=h, width=d, tokens=sizes.attn_tokens, peak_tflops=peak, mem_limit=ctx.mem_limit)

    def lib(q, k, v, implementation):
        return dot_product_attention(q, k, v, implementation=implementation)

    def ref(q, k, v, implementation):  # [B, L, H, K]
        return jax.nn.dot_product_attention(q, k, v, implementation=implementation)

    for length in sizes.attn_lengths:
        b = max(1, sizes.attn_tokens // length)
        shape = (b, h, length, d)
        keys = jax.random.split(jax.random.key(length), 4)
        q, k, v, g = (jax.random.normal(key, shape, "bfloat16") for key in keys)
        tq, tk, tv, tg = (x.swapaxes(1, 2) for x in (q, k, v, g))  # jax.nn's layout, outside the timed call
        variants = {
            "default": (lib, None, (q, k, v, g)),
            "xla": (lib, "xla", (q, k, v, g)),
            "chunked": (lib, "chunked", (q, k, v, g)),
            "cudnn": (lib, "cudnn", (q, k, v, g)),
            "pallas": (lib, "pallas", (q, k, v, g)),  # the Pallas kernel: Triton here, interpreted on the CPU
            "jax.nn cudnn": (ref, "cudnn", (tq, tk, tv, tg)),
        }
        path = chosen_path(ctx, q, k, v)
        flops = 4 * b * h * length * length * d
        # The plain path holds float32 logits and weights [B, H, L, L]: refuse it before compiling, whose
        # autotuning would already allocate buffers that size.
        plain_bytes = 2 * 4 * b * h * length * length
        for mode in ("fwd", "fwd+bwd"):
            if rec.out_of_time(f"L={length} {mode}"):
                continue
            cells: dict[str, dict] = {}
            ready = {}
            for name, (fn, impl, (a1, a2, a3, cot)) in variants.items():
                if (impl == "xla" or (impl is None and path == "xla")) and plain_bytes > ctx.mem_limit:
                    cells[name] = {"note": f"skipped (needs ≥ {harness.fmt_bytes(plain_bytes)})"}
                    continue
                try:
                    compiled, args = compile_attention_pass(jax, fn, impl, (a1, a2, a3, cot), mode)
                except Exception as e:  # cuDNN refuses some dtypes, shapes and platforms: the cell says so
                    cells[name] = {"note": f"n/a ({type(e).__name__})"}
                    continue
                need = harness.compiled_bytes(compiled)
                if need is not None and need > ctx.mem_limit:
                    cells[name] = {"note": f"skipped (needs {harness.fmt_bytes(need)})"}
                    continue
                cells[name] = {"bytes": need}
                ready[name] = harness.jax_call(ctx, compiled, *args)
            _log(f"attention: L={length} B={b} {mode}: {', '.join(ready)}")
            total = flops * (1 if mode == "fwd" else FWD_BWD_FLOPS)
            for name, t in (harness.measure_interleaved(ctx, ready) if ready else {}).items():
                cells[name].update(seconds=t.median, rounds=t.calls, tflops=total / t.median / 1e12)
            rec.row(length=length, batch=b, mode=mode, path=path, flops=total, cells=cells)


def _train_config(spec: str, sizes: Sizes, bf16: bool):
    """The StepConfig of a config file as the trainer builds it (vocabularies = shortlist + 4 specials)."""
    from attn_jax.data import SPECIAL_TOKENS
    from attn_jax.train import StepConfig, load_config, model_config, optimizer_config

    config = load_config(os.path.join(REPO, spec) + (":smoke" if sizes.tiny_model else ""))
    config.mixed_precision = bf16
    if sizes.tiny_model:
        src = tgt = sizes.tiny_vocab
    else:
        src = config.data.src_vocab_size + len(SPECIAL_TOKENS)
        tgt = config.data.tgt_vocab_size + len(SPECIAL_TOKENS)
    step = StepConfig(
        model=model_config(config, src, tgt),
        optimizer=optimizer_config(config),
        label_smoothing=config.label_smoothing,
    )
    return config, step


def _time_training(
    rec: Recorder, sizes: Sizes, spec: str, label: str, bf16: bool, batch, length, steps: int, warmup: int
) -> None:
    """Compile one config's train step, then time ``steps`` steps after ``warmup`` (median step time)."""
    from attn_jax.train import init_train_state, param_count, train_step

    ctx = _ctx(sizes)
    jax, np = ctx.jax, ctx.np
    config, step_cfg = _train_config(spec, sizes, bf16)
    batch = batch or config.data.batch_size
    length = length or config.data.max_source_length
    device = jax.local_devices()[0]
    data = [
        jax.device_put(bt, device)
        for bt in random_batches(ctx, 4, batch, length, step_cfg.model.tgt_vocab, seed=3)
    ]
    tokens = [int(np.asarray(bt.tgt_len).sum()) for bt in data]
    _log(f"{label}: compiling ({param_count(step_cfg.model):,} parameters, batch {batch} x {length})")
    t0 = time.perf_counter()
    state = jax.block_until_ready(init_train_state(step_cfg, 0))
    init_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = train_step.lower(state, data[0], config=step_cfg).compile()
    compile_s = time.perf_counter() - t0
    need = harness.compiled_bytes(compiled)
    if need is not None and need > ctx.mem_limit:
        raise MemoryError(
            f"{label}: the train step needs {harness.fmt_bytes(need)} > {harness.fmt_bytes(ctx.mem_limit)}"
        )
    times, counted, cut = [], [], False
    for i in range(warmup + steps):
        if i > warmup and time.monotonic() >= rec.deadline:  # keep what was timed, and say it was cut
            cut = True
            break
        bt = data[i % len(data)]
        t0 = time.perf_counter()
        state, metrics = compiled(state, bt)
        jax.block_until_ready((state, metrics))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            counted.append(tokens[i % len(data)])
    loss = jax.device_get(metrics.loss)
    median = statistics.median(times)
    rec.row(
        label=label,
        config=spec,
        compute_dtype=step_cfg.model.dtype,
        parameters=param_count(step_cfg.model),
        batch=batch,
        length=length,
        optimizer=step_cfg.optimizer.name,
        compiled_bytes=need,
        init_s=init_s,
        compile_s=compile_s,
        warmup_steps=warmup,
        steps_timed=len(times),
        steps_planned=steps,
        cut_by_cap=cut,
        median_step_s=median,
        target_tokens_per_s=statistics.mean(counted) / median,
        positions_per_s=batch * length / median,
        last_loss_per_token=float(loss.loss / loss.tokens),
    )


def section_rnnsearch(rec: Recorder, sizes: Sizes, peak: float | None) -> None:
    """RNNsearch-50 at the paper's size: float32 (the config) first, then bfloat16 compute."""
    for label in sizes.rnn_dtypes:
        bf16 = label == "bfloat16"
        if rec.out_of_time(f"RNNsearch {label}"):
            continue
        _time_training(
            rec,
            sizes,
            "configs/rnnsearch50.py",
            label,
            bf16,
            sizes.rnn_batch,
            sizes.rnn_length,
            sizes.rnn_steps,
            2,
        )


def section_gnmt(rec: Recorder, sizes: Sizes, peak: float | None) -> None:
    """GNMT (Wu et al. 2016) at the paper's size on one device, float32 as configured."""
    if not rec.out_of_time("GNMT float32"):
        _time_training(
            rec,
            sizes,
            "configs/gnmt_wmt14.py",
            "float32",
            False,
            sizes.gnmt_batch,
            sizes.gnmt_length,
            sizes.gnmt_steps,
            1,
        )


def section_remat(rec: Recorder, sizes: Sizes, peak: float | None) -> None:
    """Temporary bytes of the Transformer's compiled gradient per ``model.remat`` policy (nothing runs)."""
    ctx = _ctx(sizes)
    jax, jnp = ctx.jax, ctx.jnp
    from flax import nnx

    from attn_jax.models import TransformerConfig, build_model
    from attn_jax.models.interface import REMAT_POLICIES

    if sizes.tiny_model:
        base, batch, length = dict(d_model=32, heads=2, d_ff=64, encoder_layers=2, decoder_layers=2), 4, 8
        vocab = sizes.tiny_vocab
    else:
        base, batch, length, vocab = {}, 64, 64, 32000
    rec.info(batch=batch, length=length, vocab=vocab)
    for policy in REMAT_POLICIES:
        if rec.out_of_time(f"remat={policy}"):
            continue
        cfg = TransformerConfig(src_vocab=vocab, tgt_vocab=vocab, max_length=2 * length, remat=policy, **base)
        graphdef, params = nnx.split(nnx.eval_shape(lambda cfg=cfg: build_model(cfg, rngs=nnx.Rngs(0))))
        ints = jax.ShapeDtypeStruct((batch, length), jnp.int32)
        mask = jax.ShapeDtypeStruct((batch, length), jnp.bool_)

        def loss(params, src, mask, tgt, graphdef=graphdef):
            logits, _ = nnx.merge(graphdef, params)(src, mask, tgt)
            return jnp.mean(jax.nn.log_softmax(logits.astype(jnp.float32))[..., 0])

        _log(f"remat: {policy}")
        compiled = jax.jit(jax.grad(loss)).lower(params, ints, mask, ints).compile()
        rec.row(policy=policy, temp_bytes=compiled.memory_analysis().temp_size_in_bytes)


CHILDREN = {
    "remat": section_remat,
    "matmul": section_matmul,
    "attention": section_attention,
    "rnnsearch": section_rnnsearch,
    "gnmt": section_gnmt,
}


def child_main(args: argparse.Namespace) -> int:
    rec = Recorder(args.child, args.result, time.monotonic() + args.deadline_s)
    try:
        import jax

        rec.info(backend=jax.default_backend())
        CHILDREN[args.child](rec, TINY if args.tiny else GPU, args.peak_tflops)
    except Exception as e:  # the parent reports it in the section, with the rows finished before it
        traceback.print_exc()
        rec.data["error"] = f"{type(e).__name__}: {e}"
        rec.save()
        return 1
    return 0


# ------------------------------------------------------------------------------------------------ parent


def run_tests(on_gpu: bool, cap: float, env: dict) -> dict:
    """``pytest -m gpu tests/`` in a subprocess; its summary line and whether it passed."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests"]
    env = dict(env)
    # tests/conftest.py pins JAX to the CPU unless JAX_PLATFORMS is set: "" lets JAX take the GPU.
    env["JAX_PLATFORMS"] = "" if on_gpu else "cpu"
    _log("tests: " + " ".join(cmd[2:]))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=cap)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {
            "section": "tests",
            "command": " ".join(cmd[2:]),
            "seconds": cap,
            "timed_out": True,
            "error": f"pytest did not finish within the cap of {cap:.0f} s",
            "tail": out[-3000:],
        }
    out = proc.stdout + proc.stderr
    counts = dict(
        (k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", out)
    )
    summary = next(
        (ln.strip("= ") for ln in reversed(out.splitlines()) if re.search(r"\d+ \w+ in ", ln)), "?"
    )
    selected = sum(v for k, v in counts.items() if k != "deselected")
    error = None
    if proc.returncode != 0:
        error = f"pytest exit status {proc.returncode}"
    elif selected == 0:
        error = "no test carries the gpu marker"
    elif on_gpu and counts.get("passed", 0) == 0:
        error = "no gpu test ran (all skipped: is JAX's backend the GPU?)"
    if error:
        print(out[-3000:])
    return {
        "section": "tests",
        "command": " ".join(cmd[2:]),
        "seconds": time.perf_counter() - t0,
        "returncode": proc.returncode,
        "counts": counts,
        "summary": summary,
        "error": error,
    }


def run_child(name: str, tiny: bool, cap: float, env: dict, peak: float | None) -> dict:
    """One measuring section in its own process, killed at ``cap`` seconds; its (possibly partial) result."""
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, f"{name}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--result", result]
        cmd += ["--deadline-s", str(max(1.0, cap - MARGIN_S))] + (["--tiny"] if tiny else [])
        if peak is not None:
            cmd += ["--peak-tflops", repr(peak)]
        t0 = time.perf_counter()
        timed_out = False
        try:
            subprocess.run(cmd, cwd=REPO, env=env, timeout=cap, check=False)
        except subprocess.TimeoutExpired:
            timed_out = True
        seconds = time.perf_counter() - t0
        data = {"section": name, "rows": [], "info": {}, "not_run": [], "error": "the process saved nothing"}
        if os.path.exists(result):
            with open(result, encoding="utf-8") as f:
                data = json.load(f)
    data["seconds"], data["timed_out"] = seconds, timed_out
    if timed_out:
        data["error"] = data["error"] or f"killed at the section's cap of {cap:.0f} s (finished rows kept)"
    return data


def _tf(cell: dict, peak: float | None) -> str:
    if "tflops" not in cell:
        return cell.get("note", "—")
    frac = f" ({cell['tflops'] / peak:.0%})" if peak else ""
    return f"{cell['tflops']:.3g}{frac}"


def render(results: dict, peak: float | None, cpu_s: dict) -> list[harness.Section]:
    """The Markdown sections (harness.Section, the benchmark's format) of the results."""
    out = []
    t = results.get("tests")
    if t:
        sec = harness.Section(
            "1. Tests marked `gpu`",
            "`python -m pytest -q -m gpu -p no:cacheprovider tests` with `JAX_PLATFORMS` unset for JAX "
            "(tests/conftest.py otherwise pins the CPU).",
        )
        sec.table(["result", "status"], [[t.get("summary", "?"), "failed" if t.get("error") else "passed"]])
        out.append(("tests", sec))
    m = results.get("matmul")
    if m:
        sec = harness.Section(
            "2. Matmul peak",
            "`jnp.matmul` of two random `n × n` matrices, 2n³ FLOPs; the fastest bfloat16 size is the peak "
            "that "
            "section 3 divides by (the measured peak, not the datasheet's).",
        )
        sec.table(
            ["dtype", "n", "median", "TFLOP/s"],
            [
                [r["dtype"], str(r["n"]), harness.fmt_time(r["seconds"]), f"{r['tflops']:.4g}"]
                for r in m["rows"]
            ],
        )
        out.append(("matmul", sec))
    a = results.get("attention")
    if a:
        info = a.get("info", {})
        sec = harness.Section(
            "3. bfloat16 attention TFLOP/s: attn_jax implementations vs jax.nn cuDNN",
            f"Self-attention T = S = L, no mask, H={info.get('heads')}, K={info.get('width')}, "
            f"B = max(1, {info.get('tokens')} // L); attn_jax `[B, H, L, K]`, jax.nn `[B, L, H, K]`. "
            "FLOPs as FlashAttention counts them: forward 4·B·H·L²·K, forward+backward 3.5× that (the VJP of "
            "q, k, v). Cells: TFLOP/s (fraction of the bfloat16 matmul peak of section 2); the variants of a "
            "row are timed in alternation (`harness.measure_interleaved`).",
        )
        header = ["L", "B", "pass", "default (path)"] + list(ATTN_VARIANTS[1:]) + ["default / jax.nn cudnn"]
        rows = []
        for r in a["rows"]:
            c = r["cells"]
            d, j = c.get("default", {}), c.get("jax.nn cudnn", {})
            ratio = f"{d['tflops'] / j['tflops']:.3g}" if "tflops" in d and "tflops" in j else "—"
            rows.append(
                [str(r["length"]), str(r["batch"]), r["mode"], f"{r['path']}: {_tf(d, peak)}"]
                + [_tf(c.get(v, {}), peak) for v in ATTN_VARIANTS[1:]]
                + [ratio]
            )
        sec.table(header, rows)
        sec.notes.append(
            "`path` is what `implementation=None` chose; `skipped (needs …)` marks a program whose compiled "
            "footprint exceeds 80 % of the GPU's memory (the plain path's `[B, H, L, L]` float32 logits)."
        )
        out.append(("attention", sec))
    for key, title in (
        ("rnnsearch", "4. RNNsearch-50 training at the paper's size"),
        ("gnmt", "5. GNMT training step at the paper's size, one device"),
    ):
        r = results.get(key)
        if not r:
            continue
        spec = "configs/rnnsearch50.py" if key == "rnnsearch" else "configs/gnmt_wmt14.py"
        sec = harness.Section(
            title,
            f"`attn_jax.train.train_step` of `{spec}` (its model, optimiser and vocabularies: shortlist + 4 "
            "specials) on random batches of the config's batch size with S = T = max length and true lengths "
            "in [L/2, L]; state donated; compiled ahead of time, then warm-up steps, then the median step. "
            "Target tokens/s counts the real target tokens (with `</s>`); positions/s counts B·T.",
        )
        sec.table(
            [
                "compute",
                "parameters",
                "B × L",
                "compiled memory",
                "compile",
                "median step",
                "target tokens/s",
                "positions/s",
                "steps timed",
            ],
            [
                [
                    x["compute_dtype"],
                    f"{x['parameters']:,}",
                    f"{x['batch']} × {x['length']}",
                    "?" if x["compiled_bytes"] is None else harness.fmt_bytes(x["compiled_bytes"]),
                    harness.fmt_time(x["compile_s"]),
                    harness.fmt_time(x["median_step_s"]),
                    f"{x['target_tokens_per_s']:,.0f}",
                    f"{x['positions_per_s']:,.0f}",
                    f"{x['steps_timed']}" + (f" of {x['steps_planned']} (cap)" if x["cut_by_cap"] else ""),
                ]
                for x in r["rows"]
            ],
        )
        out.append((key, sec))
    r = results.get("remat")
    if r:
        info, none = r.get("info", {}), {x["policy"]: x["temp_bytes"] for x in r["rows"]}.get("none")
        sec = harness.Section(
            "6. Rematerialisation: the Transformer's gradient memory per `model.remat` policy",
            f"The Transformer base (d 512, 6+6 layers), batch {info.get('batch')}, S = T = {info.get('length')}, "
            f"vocabulary {info.get('vocab')}: `jax.grad` of the log-likelihood compiled for the device, and "
            "XLA's `memory_analysis().temp_size_in_bytes` (nothing runs).",
        )
        sec.table(
            ["policy", "temporaries", "ratio to none"],
            [
                [
                    x["policy"],
                    harness.fmt_bytes(x["temp_bytes"]),
                    f"{x['temp_bytes'] / none:.2f}" if none else "—",
                ]
                for x in r["rows"]
            ],
        )
        out.append(("remat", sec))
    for name, sec in out:
        r = results[name]
        sec.seconds, sec.cpu_seconds = r.get("seconds", 0.0), cpu_s.get(name, 0.0)
        if r.get("error"):
            sec.error = r["error"]
        if r.get("not_run"):
            sec.notes.append(
                f"Not run (the section's time cap of {CAPS[name]} s): {', '.join(r['not_run'])}."
            )
    return [sec for _, sec in out]


def gpu_info(jax) -> list[tuple[str, str]]:
    """What the benchmark's machine table lacks for a GPU: the device, platform version, CUDA plugin and cuDNN."""
    import importlib.metadata

    device = jax.devices()[0]
    rows = [
        ("device", f"{device.device_kind} × {jax.device_count()} (this check uses one)"),
        ("platform version", getattr(device.client, "platform_version", "?")),
    ]
    for name in ("jax-cuda13-plugin", "jax-cuda12-plugin"):
        try:
            rows.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        from jax._src.lib import cuda_versions  # private: informational only

        rows.append(("cuDNN", str(cuda_versions.cudnn_get_version())))
    except Exception:
        pass
    return rows


def report(results: dict, peak, info, argv: Sequence[str], total_s: float, cpu_s: dict, tiny: bool) -> str:
    failed = [k for k, r in results.items() if r.get("error")]
    cut = [k for k, r in results.items() if r.get("not_run")]
    title = "## GPU check (`make gpu-check`)" + (" — tiny sizes, a dry run" if tiny else "")
    lines = [
        title + "\n",
        f"Command: `{' '.join(['python experiments/benchmarks/gpu_check.py', *argv])}`. Total wall time "
        f"{total_s:.0f} s; time caps per section: " + ", ".join(f"{k} {v} s" for k, v in CAPS.items()) + ". "
        "The same numbers are in `gpu_check.json` beside this file.\n",
        "| machine | |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in info]
    lines.append("")
    lines.append(
        f"Sections: {len(results) - len(failed)} of {len(results)} finished"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + (f"; cut at their time cap: {', '.join(cut)}" if cut else "")
        + ".\n"
    )
    lines += [sec.markdown() for sec in render(results, peak, cpu_s)]
    return "\n".join(lines)


def summary_lines(results: dict, peak: float | None) -> list[str]:
    out = []
    if t := results.get("tests"):
        out.append(f"tests: {t.get('summary', '?')}" + (f" — FAILED: {t['error']}" if t.get("error") else ""))
    if "matmul" in results:
        out.append(f"matmul: bfloat16 peak {peak:.4g} TFLOP/s" if peak else "matmul: no peak measured")
    if a := results.get("attention"):
        for r in a["rows"]:
            c = r["cells"]
            out.append(
                f"attention L={r['length']} {r['mode']}: default ({r['path']}) "
                f"{_tf(c.get('default', {}), peak)}, "
                f"pallas {_tf(c.get('pallas', {}), peak)}, "
                f"jax.nn cudnn {_tf(c.get('jax.nn cudnn', {}), peak)} TFLOP/s"
            )
    for key in ("rnnsearch", "gnmt"):
        for x in (results.get(key) or {}).get("rows", []):
            out.append(
                f"{key} {x['compute_dtype']}: {x['target_tokens_per_s']:,.0f} target tokens/s, step "
                f"{harness.fmt_time(x['median_step_s'])} (B={x['batch']}, L={x['length']})"
            )
    for x in (results.get("remat") or {}).get("rows", []):
        out.append(f"remat {x['policy']}: {harness.fmt_bytes(x['temp_bytes'])} of temporaries")
    for k, r in results.items():
        if k != "tests" and r.get("error"):
            out.append(f"{k}: FAILED: {r['error']}")
        if r.get("not_run"):
            out.append(f"{k}: not run (time cap): {', '.join(r['not_run'])}")
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", default=harness.DEFAULT_OUT, help="the RESULTS.md to update (default: %(default)s)"
    )
    p.add_argument("--json", default=None, help="the JSON to write (default: gpu_check.json beside --out)")
    p.add_argument(
        "--tiny", action="store_true", help="tiny sizes, write nothing (the CPU check; on a GPU a dry run)"
    )
    p.add_argument(
        "--sections", default=",".join(CAPS), help="comma-separated sections (default: all): %(default)s"
    )
    # internal: one section in this process
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--deadline-s", type=float, default=60.0, help=argparse.SUPPRESS)
    p.add_argument("--peak-tflops", type=float, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    argv = list(sys.argv[1:] if argv is None else argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if unknown := [s for s in sections if s not in CAPS]:
        raise SystemExit(f"unknown sections {unknown}; choose from {', '.join(CAPS)}")
    child_env = dict(os.environ)
    # This process only looks at the device: the sections' processes get its memory (JAX preallocates 75 %).
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    on_gpu = jax.devices()[0].platform == "gpu"
    tiny = args.tiny or not on_gpu
    if not on_gpu:
        print(NO_GPU_LINE.format(backend=jax.default_backend()), flush=True)
        print(
            "Checking instead that every section builds and runs once at tiny sizes on the CPU.", flush=True
        )
        child_env["JAX_PLATFORMS"] = "cpu"
        # Tiny programs: compiling is nearly all the time, and LLVM's level 0 halves it (tests/conftest.py).
        child_env.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
    elif tiny:
        print(
            "--tiny: every section once at tiny sizes on the GPU; RESULTS.md is left unchanged.", flush=True
        )
    ctx = harness.Ctx(harness.QUICK, tiny, "gpu" if on_gpu else "cpu", jax, None, None, None, None, 0)
    info = harness.machine_info(ctx) + (gpu_info(jax) if on_gpu else [])
    start = time.perf_counter()
    results: dict[str, dict] = {}
    cpu_s: dict[str, float] = {}
    peak = None
    for name in sections:
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if name == "tests":
            results[name] = run_tests(on_gpu, CAPS[name], child_env)
        else:
            results[name] = run_child(name, tiny, CAPS[name], child_env, peak)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s[name] = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
        if name == "matmul":
            bf16 = [r["tflops"] for r in results[name]["rows"] if r["dtype"] == "bfloat16"]
            peak = max(bf16) if bf16 else None
        r = results[name]
        _log(f"{name}: {'FAILED' if r.get('error') else 'done'} in {r.get('seconds', 0):.0f} s")
    total = time.perf_counter() - start
    body = report(results, peak, info, argv, total, cpu_s, tiny)
    print("\nSummary:\n" + "\n".join("  " + ln for ln in summary_lines(results, peak)), flush=True)
    failed = [k for k, r in results.items() if r.get("error")]
    if tiny:
        # Render into a copy, so the writer is exercised too, and leave RESULTS.md as it is.
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "RESULTS.md")
            if os.path.exists(args.out):
                shutil.copyfile(args.out, copy)
            harness.write_results(copy, SECTION, body)
            with open(copy, encoding="utf-8") as f:
                text = f.read()
        if text.count(section_marker(SECTION)) != 1 or text.count(section_marker(SECTION, end=True)) != 1:
            failed.append("writing the section into a copy of RESULTS.md")
        print(
            f"Tiny check {'FAILED: ' + ', '.join(failed) if failed else 'passed'} ({total:.0f} s); "
            f"{args.out} not modified.",
            flush=True,
        )
        return 1 if failed else 0
    harness.write_results(args.out, SECTION, body)
    json_path = args.json or os.path.join(os.path.dirname(os.path.abspath(args.out)), "gpu_check.json")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(
            {
                "command": " ".join(["python experiments/benchmarks/gpu_check.py", *argv]),
                "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                "machine": dict(info),
                "caps_s": CAPS,
                "total_s": total,
                "matmul_peak_tflops": peak,
                "sections": results,
            },
            f,
            indent=1,
        )
    print(f"Wrote the {SECTION} section of {args.out} and {json_path} ({total:.0f} s).", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
