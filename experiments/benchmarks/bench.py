"""The attn_jax benchmark harness: every row measured side by side in one process, written to RESULTS.md.

    .venv/bin/python experiments/benchmarks/bench.py                      # full CPU run -> RESULTS.md
    .venv/bin/python experiments/benchmarks/bench.py --quick --out /tmp/R.md   # smoke sizes
    .venv/bin/python experiments/benchmarks/bench.py --device gpu         # the GPU section (+ cuDNN, bfloat16)
    .venv/bin/python experiments/benchmarks/bench.py --quick --rows 2,3   # a subset of the rows, while developing

Rows, one module each in ``rows/`` (README.md says what each measures, why, and how long a run takes):

1. ``dot_product_attention`` (default path) vs ``jax.nn.dot_product_attention`` and PyTorch's
   ``scaled_dot_product_attention`` at 1 and 2 threads, forward and forward+backward;
2. plain vs chunked attention: compiled peak memory as ``L`` grows, the peak RSS growth of one executed call
   (fresh subprocesses), error and time of chunked vs plain;
3. additive attention in a decoder ``lax.scan`` at the paper's sizes: naive autodiff vs the fused scorer;
4. RNNsearch training throughput vs the same architecture in PyTorch (``torch_peers.py``, ``paper_peer.py``);
5. beam-search decoding speed for beams 1, 4, 12 at batch 1 and 32 vs a PyTorch batched beam search at 1 and
   2 threads;
6. compilations during a bucketed training run (must equal the number of batch shapes, not grow with steps);
7. Transformer training tokens/s with and without packed sequences (not in the default ``--rows``);
8. peak RSS and start-up of ``attn-jax train`` as a plain corpus grows, with no data flag (not in the default
   ``--rows``);
9. ``attn-jax serve`` sentences/s and latency under 1, 8 and 32 concurrent HTTP clients vs ``attn-jax translate``
   (not in the default ``--rows``);
10. an imported Marian model of OPUS-MT's shape: attn_jax beam search vs CTranslate2 (float32, int8) and
    transformers' ``generate`` at 1 and 2 threads (not in the default ``--rows``).

Timings are medians of repeated calls after a warm-up call, each ended by ``jax.block_until_ready``. JAX
programs are compiled ahead of time, so compilation is never timed. PyTorch runs with
``torch.set_num_threads(<usable cores>)`` unless a row names its thread counts (rows 1, 4 and 5: 1 and 2).
Memory is XLA's compiled memory analysis (argument + output + temp bytes) of the jitted function, so the large
rows are compiled, never executed; row 2 also measures executed calls' RSS. Running ``--device cpu`` rewrites
only the CPU section of ``--out`` and keeps an earlier GPU section, and vice versa. The exit status is 1 if any
row raised; its section then shows the error. The shared timing, sizes and report live in ``harness/``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # harness, rows and torch_peers live beside this script

from harness import (  # noqa: E402
    DEFAULT_OUT,
    FULL,
    GIB,
    NO_GPU,
    QUICK,
    Ctx,
    Section,
    device_section,
    machine_info,
    measure_peak,
    peak_info,
    torch_thread_counts,
    usable_cores,
    write_results,
)
from rows.row1_attention import row_dot_product  # noqa: E402
from rows.row2_chunked import row_chunked  # noqa: E402
from rows.row3_additive import row_additive  # noqa: E402
from rows.row4_training import row_training  # noqa: E402
from rows.row5_beam import row_beam  # noqa: E402
from rows.row6_compiles import row_compiles  # noqa: E402
from rows.row7_packing import row_packing  # noqa: E402
from rows.row8_large_corpus import row_large_corpus  # noqa: E402
from rows.row9_serving import row_serving  # noqa: E402
from rows.row10_marian import row_marian  # noqa: E402

ROWS: dict[int, Callable[[Ctx], Section]] = {
    1: row_dot_product,
    2: row_chunked,
    3: row_additive,
    4: row_training,
    5: row_beam,
    6: row_compiles,
    7: row_packing,
    8: row_large_corpus,
    9: row_serving,
    10: row_marian,
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke sizes: every row, small and fast")
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
    # `import attn_jax` sets the host allocator before JAX starts (attn_jax/_host_memory.py): one process-wide
    # malloc setting, so both sides of every row, PyTorch included, run under it.
    import attn_jax

    allocator = attn_jax.host_allocator().message
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
        torch.set_num_threads(usable_cores())
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
    ctx.log("measuring the machine's float32 matmul peak and memory bandwidth")
    ctx.peak = measure_peak(ctx, torch_thread_counts())
    info += peak_info(ctx.peak)
    start = time.perf_counter()
    sections = []
    for r in rows:
        t0, c0, load0 = time.perf_counter(), time.process_time(), os.getloadavg()[0]
        try:
            if r == 4 and torch is None:
                raise RuntimeError("row 4 needs PyTorch (pip install -e '.[bench]')")
            sec = ROWS[r](ctx)
        except Exception as e:  # one failing row must not hide the others' numbers
            traceback.print_exc()
            sec = Section(f"{r}. {ROWS[r].__doc__.splitlines()[0]}", error=f"{type(e).__name__}: {e}")
        sec.seconds, sec.cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        sec.load = (load0, os.getloadavg()[0])
        ctx.log(f"row {r} done in {sec.seconds:.0f} s (CPU {sec.cpu_seconds:.0f} s)")
        sections.append(sec)
    total = time.perf_counter() - start
    write_results(args.out, args.device, device_section(ctx, sections, info, argv, total))
    ctx.log(f"wrote {args.out} ({total:.0f} s)")
    return 1 if any(sec.error for sec in sections) else 0


if __name__ == "__main__":
    sys.exit(main())
