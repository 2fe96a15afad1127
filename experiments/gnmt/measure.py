"""The numbers of experiments/gnmt/README.md: GNMT's memory per device under each parallelism, and its throughput.

    .venv/bin/python experiments/gnmt/measure.py                     # both parts, Markdown on stdout
    .venv/bin/python experiments/gnmt/measure.py --part memory       # only (a)
    .venv/bin/python experiments/gnmt/measure.py --update-readme     # also rewrite the README's tables

Both parts take ~5 min of CPU time, nearly all of it compiling 14 programs ((a) ~1.7 min, (b) ~3.2 min); on the
2-core machine shared with other jobs (load average ~8) the full run took 10 min of wall time.

(a) **Predicted memory per device at the paper's sizes** (``gnmt_wmt14_config``: 8 + 8 LSTM layers of 1024,
32k vocabularies, 280.9M parameters; batch 128, source and target length 50; Adam, float32). For each mesh the
jitted, sharded train step (:func:`attn_jax.train.make_sharded_train_step`) is lowered on *abstract* sharded
arguments (:func:`attn_jax.train.abstract_sharded_state`, ``jax.ShapeDtypeStruct`` batches) and compiled; XLA's
``memory_analysis()`` of the per-device program gives the argument, output, aliased (donated state) and
temporary bytes. Nothing is executed and no paper-size array is allocated. These programs are compiled with
XLA's backend (LLVM) optimisation level 0 to save time: buffer assignment, hence every byte count, is decided on
the HLO before the backend runs (checked equal at both levels on a small GNMT).

(b) **Throughput of the CPU preset** (``gnmt_cpu_config``: 4 + 4 layers of 64, the built-in ``small`` corpus's
vocabularies 1,239 / 898; batches of 32 sentences padded to 32 tokens, the preset's largest bucket) on 1, 2, 4
and 8 *simulated* devices (``--xla_force_host_platform_device_count=8``): data parallel, and pipeline (2 stages;
with 4 and 8 devices, data × pipeline, as the preset's stacks have 2 layers). All simulated devices share this
machine's cores, so the table measures the partitioning's overhead, not a speed-up. Step time is the median of
``--steps`` timed updates after one warm-up update (the donated state fed back each time); tokens/s counts real
(non-pad) target tokens.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import datetime  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # run from a checkout without installing

from attn_jax.data import Batch  # noqa: E402
from attn_jax.models import gnmt_cpu_config, gnmt_wmt14_config  # noqa: E402
from attn_jax.parallel import batch_sharding, make_mesh, rules_for  # noqa: E402
from attn_jax.train import OptimizerConfig, StepConfig, init_train_state  # noqa: E402
from attn_jax.train import _step as step_module  # noqa: E402
from attn_jax.train._sharded import (  # noqa: E402
    abstract_sharded_state,
    make_sharded_train_step,
    shard_train_state,
)

README = os.path.join(HERE, "README.md")
BEGIN, END = "<!-- measure.py:begin -->", "<!-- measure.py:end -->"
GIB = 1 << 30

# (a): configs/gnmt_wmt14.py's optimiser and batch; (b): configs/gnmt_cpu.py's.
PAPER_OPTIMIZER = OptimizerConfig(
    name="adam", learning_rate=2e-4, eps=1e-8, clip_norm=5.0, warmup_steps=2_000
)
PAPER_BATCH, PAPER_LENGTH = 128, 50
CPU_OPTIMIZER = OptimizerConfig(name="adam", learning_rate=2e-3, eps=1e-8, clip_norm=1.0, warmup_steps=100)
CPU_VOCABS = (1239, 898)  # the built-in small corpus's word vocabularies (source, target)
CPU_BATCH, CPU_LENGTH = 32, 32

# (label, strategy, mesh sizes)
MEMORY_MESHES = [
    ("none (1 device)", "data", dict(data=1)),
    ("data", "data", dict(data=8)),
    ("tensor", "tensor", dict(model=8)),
    ("pipeline (2 devices)", "pipeline", dict(stage=2)),
    ("data × pipeline", "data+pipeline", dict(data=4, stage=2)),
    ("data × tensor", "data+tensor", dict(data=2, model=4)),
    ("data × tensor", "data+tensor", dict(data=4, model=2)),
]
THROUGHPUT_MESHES = [
    ("none (1 device)", "data", dict(data=1)),
    ("data", "data", dict(data=2)),
    ("data", "data", dict(data=4)),
    ("data", "data", dict(data=8)),
    ("pipeline", "pipeline", dict(stage=2)),
    ("data × pipeline", "data+pipeline", dict(data=2, stage=2)),
    ("data × pipeline", "data+pipeline", dict(data=4, stage=2)),
]
MEMORY_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}  # see the module docstring


def _mesh(sizes: dict[str, int]):
    return make_mesh(**sizes, devices=jax.devices()[: math.prod(sizes.values())])


def _mesh_label(sizes: dict[str, int]) -> str:
    return " × ".join(f"{k}={v}" for k, v in sizes.items())


def _step_config(model, optimizer, sizes) -> StepConfig:
    return StepConfig(model=model.replace(pipeline_stages=sizes.get("stage", 1)), optimizer=optimizer)


def _compile(config: StepConfig, mesh, rules, state, batch, options=None):
    """The sharded step lowered on ``(state, batch)`` (arrays or abstract) and compiled; ``(compiled, seconds)``."""
    start = time.perf_counter()
    step_module._graphdef(config.model)  # outside the mesh context: see tests/test_gnmt_sharded.py
    step = make_sharded_train_step(config, mesh, rules, strict=True)
    with jax.set_mesh(mesh):  # GNMT's pipelined stacks read the ambient mesh while tracing
        compiled = step.lower(state, batch).compile(options)
    return compiled, time.perf_counter() - start


def _abstract_batch(batch: int, length: int, sharding) -> Batch:
    def spec(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding)

    return Batch(
        src=spec(batch, length),
        src_len=spec(batch),
        tgt_in=spec(batch, length),
        tgt_out=spec(batch, length),
        tgt_len=spec(batch),
        example_id=spec(batch),
    )


def _shard_bytes(tree) -> int:
    """Bytes one device holds of ``tree`` (abstract arrays with shardings): the largest shard per leaf."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.shape else ()
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def measure_memory() -> list[dict]:
    """Part (a): one row per mesh of :data:`MEMORY_MESHES`."""
    rows = []
    for label, strategy, sizes in MEMORY_MESHES:
        config = _step_config(gnmt_wmt14_config(), PAPER_OPTIMIZER, sizes)
        mesh, rules = _mesh(sizes), rules_for(strategy)
        state = abstract_sharded_state(config, mesh, rules, strict=True)
        batch = _abstract_batch(PAPER_BATCH, PAPER_LENGTH, batch_sharding(mesh, rules))
        compiled, seconds = _compile(config, mesh, rules, state, batch, MEMORY_COMPILER_OPTIONS)
        m = compiled.memory_analysis()
        peak = (
            m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
        )
        row = dict(
            label=label,
            mesh=_mesh_label(sizes),
            devices=mesh.size,
            batch=PAPER_BATCH // mesh.shape["data"],
            state=_shard_bytes(state) / GIB,
            params=_shard_bytes(state.params) / GIB,
            argument=m.argument_size_in_bytes / GIB,
            output=m.output_size_in_bytes / GIB,
            alias=m.alias_size_in_bytes / GIB,
            temp=m.temp_size_in_bytes / GIB,
            peak=peak / GIB,
            compile_s=seconds,
        )
        print(
            f"memory {label:22s} {row['mesh']:18s} peak {row['peak']:.2f} GiB ({seconds:.0f} s)", flush=True
        )
        rows.append(row)
    return rows


def _cpu_batch(rng: np.random.Generator) -> Batch:
    """One batch of the CPU preset's largest bucket: lengths 16..32 (target: with ``</s>``), random word ids."""
    src_vocab, tgt_vocab = CPU_VOCABS
    src_len = rng.integers(16, CPU_LENGTH + 1, CPU_BATCH).astype(np.int32)
    tgt_len = rng.integers(16, CPU_LENGTH + 1, CPU_BATCH).astype(np.int32)
    src_mask = np.arange(CPU_LENGTH) < src_len[:, None]
    tgt_mask = np.arange(CPU_LENGTH) < tgt_len[:, None]
    return Batch(
        src=np.where(src_mask, rng.integers(4, src_vocab, src_mask.shape), 0).astype(np.int32),
        src_len=src_len,
        tgt_in=np.where(tgt_mask, rng.integers(4, tgt_vocab, tgt_mask.shape), 0).astype(np.int32),
        tgt_out=np.where(tgt_mask, rng.integers(4, tgt_vocab, tgt_mask.shape), 0).astype(np.int32),
        tgt_len=tgt_len,
        example_id=np.arange(CPU_BATCH, dtype=np.int32),
    )


def measure_throughput(steps: int) -> list[dict]:
    """Part (b): one row per mesh of :data:`THROUGHPUT_MESHES`."""
    model = gnmt_cpu_config(*CPU_VOCABS)
    batch = _cpu_batch(np.random.default_rng(0))
    tokens = int(batch.tgt_len.sum())
    # One initial state for every mesh (the pipelined model has the same parameters), placed per mesh.
    state = jax.tree.map(np.asarray, init_train_state(StepConfig(model, CPU_OPTIMIZER), jnp.int32(0)))
    rows, base = [], None
    for label, strategy, sizes in THROUGHPUT_MESHES:
        config = _step_config(model, CPU_OPTIMIZER, sizes)
        mesh, rules = _mesh(sizes), rules_for(strategy)
        sharded = shard_train_state(state, config, mesh, rules)
        placed = jax.device_put(batch, batch_sharding(mesh, rules))
        compiled, compile_s = _compile(config, mesh, rules, sharded, placed)
        sharded, metrics = compiled(sharded, placed)  # warm-up
        jax.block_until_ready(metrics)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            sharded, metrics = compiled(sharded, placed)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        base = base or median
        row = dict(
            label=label,
            mesh=_mesh_label(sizes),
            devices=mesh.size,
            step_ms=1e3 * median,
            tokens_s=tokens / median,
            relative=base / median,
            loss=float(metrics.loss.loss / metrics.loss.tokens),
            compile_s=compile_s,
        )
        print(
            f"throughput {label:16s} {row['mesh']:18s} {row['step_ms']:.0f} ms/step "
            f"{row['tokens_s']:.0f} tok/s (compile {compile_s:.0f} s)",
            flush=True,
        )
        rows.append(row)
    return rows


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 0


def markdown(memory: list[dict] | None, throughput: list[dict] | None, header: dict) -> str:
    """The README's results block (between the measure.py markers)."""
    out = [
        f"Produced by `{header['command']}` on {header['date']} ({header['machine']}; load average "
        f"{header['load_before']} before, {header['load_after']} after: other jobs shared the machine; "
        f"{header['wall']:.0f} s in all).",
        "",
    ]
    if memory:
        out += [
            "**(a) Predicted memory per device, paper preset** (`gnmt_wmt14_config`: 280.9M parameters, Adam "
            "float32; batch 128, lengths 50 × 50). XLA's `memory_analysis()` of the compiled per-device "
            "program; *state* = parameters + Adam moments held by one device (from the shardings); *peak* = "
            "arguments + outputs − aliased (the donated state is updated in place) + temporaries.",
            "",
            "| strategy | mesh | devices | batch / device | params GiB | state GiB | arguments GiB | "
            "temporaries GiB | peak GiB |",
            "|---|---|--:|--:|--:|--:|--:|--:|--:|",
        ]
        out += [
            f"| {r['label']} | {r['mesh']} | {r['devices']} | {r['batch']} | {r['params']:.2f} | "
            f"{r['state']:.2f} | {r['argument']:.2f} | {r['temp']:.2f} | {r['peak']:.2f} |"
            for r in memory
        ]
        out.append("")
    if throughput:
        out += [
            "**(b) Throughput, CPU preset, CPU simulation** (`gnmt_cpu_config` 4 + 4 × 64, vocabularies "
            "1,239 / 898; batch 32 × 32 tokens, "
            f"{header['tokens']} real target tokens per batch; median of {header['steps']} updates). "
            f"The simulated devices share {header['cores']} CPU cores: this measures the overhead of "
            "partitioning, not a speed-up.",
            "",
            "| strategy | mesh | devices | ms / step | target tokens / s | vs 1 device | compile s |",
            "|---|---|--:|--:|--:|--:|--:|",
        ]
        out += [
            f"| {r['label']} | {r['mesh']} | {r['devices']} | {r['step_ms']:.0f} | {r['tokens_s']:.0f} | "
            f"{r['relative']:.2f}× | {r['compile_s']:.0f} |"
            for r in throughput
        ]
        out += ["", "GPU row: not measured (no accelerator available in this session).", ""]
    return "\n".join(out)


def update_readme(block: str, path: str = README) -> None:
    """Replace the text between the README's measure.py markers with ``block``."""
    with open(path) as f:
        text = f.read()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no {BEGIN} ... {END} block to update")
    with open(path, "w") as f:
        f.write(pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", text))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("memory", "throughput", "all"), default="all")
    parser.add_argument("--steps", type=int, default=7, help="timed updates per mesh (default: %(default)s)")
    parser.add_argument("--update-readme", action="store_true", help="rewrite the tables in README.md")
    args = parser.parse_args(argv)
    if jax.device_count() < 8:
        raise SystemExit(
            f"needs 8 (simulated) devices, found {jax.device_count()}: import jax after XLA_FLAGS"
        )

    start, load_before = time.perf_counter(), f"{os.getloadavg()[0]:.1f}"
    memory = measure_memory() if args.part in ("memory", "all") else None
    throughput = measure_throughput(args.steps) if args.part in ("throughput", "all") else None
    command = "python experiments/gnmt/measure.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    header = dict(
        command=command.replace(" --update-readme", ""),
        date=datetime.date.today().isoformat(),
        machine=f"{platform.processor() or platform.machine()}, {_cores()} cores, jax {jax.__version__}",
        load_before=load_before,
        load_after=f"{os.getloadavg()[0]:.1f}",
        wall=time.perf_counter() - start,
        cores=_cores(),
        steps=args.steps,
        tokens=int(_cpu_batch(np.random.default_rng(0)).tgt_len.sum()),
    )
    block = markdown(memory, throughput, header)
    print(block)
    if args.update_readme:
        update_readme(block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
