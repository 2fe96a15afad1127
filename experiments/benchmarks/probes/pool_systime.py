"""Where the system CPU time of row 1 goes: attn_jax and torch SDPA fwd+bwd, each alone or both in one process.

    PY=/work/main/.venv/bin/python
    $PY experiments/benchmarks/probes/pool_systime.py --side jax            # attn_jax alone
    $PY experiments/benchmarks/probes/pool_systime.py --side torch          # torch SDPA alone
    $PY experiments/benchmarks/probes/pool_systime.py --side both           # alternating, as row 1 does
    $PY experiments/benchmarks/probes/pool_systime.py --side both --omp-wait passive
    $PY experiments/benchmarks/probes/pool_systime.py --work beam --side torch --torch-threads 2   # row 5's peer
    strace -c -f -o /tmp/s.txt $PY experiments/benchmarks/probes/pool_systime.py --side both --calls 4
    perf stat -e task-clock,context-switches,page-faults,cpu-migrations $PY .../pool_systime.py --side both

Every timed call reports the process's ``getrusage`` difference (all threads) and, per thread group (the
main thread, PyTorch's OpenMP workers, XLA's workers), user and system ticks from ``/proc/self/task``. The
groups are told apart by the threads that exist before and after each framework first runs. One JSON line per
side goes to stdout; ``--json PATH`` appends it to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--side", choices=("jax", "torch", "both"), default="both")
p.add_argument("--calls", type=int, default=10, help="timed calls per side")
p.add_argument("--length", type=int, default=1024)
p.add_argument("--torch-threads", type=int, default=2)
p.add_argument("--allocator", choices=("keep", "default"), default="keep", help="ATTN_JAX_HOST_ALLOCATOR")
p.add_argument("--omp-wait", choices=("unset", "passive", "active"), default="unset", help="OMP_WAIT_POLICY")
p.add_argument("--sync-dispatch", action="store_true", help="jax_cpu_enable_async_dispatch=False")
p.add_argument("--work", choices=("attention", "beam"), default="attention", help="row 1's or row 5's call")
p.add_argument("--batch", type=int, default=32, help="--work beam: source sentences")
p.add_argument("--beam", type=int, default=1, help="--work beam: beam size")
p.add_argument(
    "--jax-impl",
    default="default",
    help="attention: comma-separated default, xla, chunked; default@N maps N (batch, head) pairs a step",
)
p.add_argument("--json", default=None)
args = p.parse_args()

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["ATTN_JAX_HOST_ALLOCATOR"] = args.allocator
if args.omp_wait != "unset":
    os.environ["OMP_WAIT_POLICY"] = args.omp_wait.upper()
sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)

import attn_jax  # noqa: E402

allocator = attn_jax.tune_host_allocator()
import jax  # noqa: E402
import numpy as np  # noqa: E402

if args.sync_dispatch:
    jax.config.update("jax_cpu_enable_async_dispatch", False)
TICK = os.sysconf("SC_CLK_TCK")
FIELDS = ("ru_utime", "ru_stime", "ru_minflt", "ru_nvcsw", "ru_nivcsw")


def threads() -> dict[int, tuple[int, int, int]]:
    """tid -> (utime ticks, stime ticks, voluntary switches) of every thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/status") as f:
                vol = next(int(x.split()[1]) for x in f if x.startswith("voluntary_ctxt_switches"))
        except (FileNotFoundError, StopIteration):
            continue
        out[int(tid)] = (int(st[11]), int(st[12]), vol)
    return out


b, h, d, length = 4, 8, 64, args.length
rng = np.random.default_rng(0)
arrays = [rng.standard_normal((b, h, length, d)).astype(np.float32) for _ in range(4)]
calls = {}
main_tid = {os.getpid()}
groups: dict[str, set[int]] = {"main": main_tid}
before = set(threads())
if args.work == "beam":  # row 5's bench-size RNNsearch, random parameters, width 30
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    vocab, m, n, lo, a, length = 2000, 128, 256, 128, 128, 30
    lens = rng.integers(length // 2, length + 1, args.batch)
    mask = np.arange(length)[None, :] < lens[:, None]
    tokens = np.where(mask, rng.integers(4, vocab, (args.batch, length)), 0)
if args.side in ("jax", "both"):
    if args.work == "beam":
        from attn_jax.decoding import beam_search
        from attn_jax.models import RNNConfig
        from attn_jax.train import OptimizerConfig, StepConfig, build_module, init_train_state

        cfg = RNNConfig(src_vocab=vocab, tgt_vocab=vocab, embed=m, hidden=n, maxout=lo, align=a)
        params = init_train_state(StepConfig(model=cfg, optimizer=OptimizerConfig(name="adam")), 0).params
        model = build_module(cfg, params)
        src, jmask = jax.numpy.asarray(tokens, "int32"), jax.numpy.asarray(mask)
        calls["jax"] = lambda: jax.block_until_ready(
            beam_search(model, src, jmask, beam_size=args.beam, max_length=length, max_length_ratio=None)
        )
    else:
        import functools

        from attn_jax.attention import dot_product_attention

        q, k, v, g = (jax.numpy.asarray(x) for x in arrays)
        import attn_jax.attention._chunked as chunked

        class _BatchedMap:  # chunked's (batch, head) loops with lax.map(batch_size=N); other maps unchanged
            def __init__(self, n):
                self.n = n

            def __getattr__(self, name):
                return getattr(jax.lax, name)

            def map(self, f, xs, **kw):
                if sys._getframe(1).f_code.co_name == "_map_batch":
                    kw["batch_size"] = self.n
                return jax.lax.map(f, xs, **kw)

        for spec in args.jax_impl.split(","):
            impl, _, per_step = spec.partition("@")  # "default@4": 4 (batch, head) pairs per loop step
            f = functools.partial(dot_product_attention, implementation=None if impl == "default" else impl)
            prog = jax.jit(lambda q, k, v, g, f=f: jax.vjp(f, q, k, v)[1](g))
            chunked.lax = _BatchedMap(int(per_step)) if per_step else jax.lax
            compiled = prog.lower(q, k, v, g).compile()
            chunked.lax = jax.lax
            impl = spec
            name = "jax" if impl == "default" else f"jax {impl}"
            calls[name] = lambda c=compiled: jax.block_until_ready(c(q, k, v, g))
    for c in calls.values():
        c()
    now = set(threads())
    groups["xla"] = now - before - main_tid
    before = now
if args.side in ("torch", "both"):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.torch_threads)
    if args.work == "beam":
        import torch_peers

        torch.manual_seed(0)
        tmodel = torch_peers.TorchRNNsearch(vocab, vocab, m, n, lo, a)
        tsrc, tmask = torch.as_tensor(tokens), torch.as_tensor(mask)

        def torch_call():
            torch_peers.beam_search(tmodel, tsrc, tmask, beam_size=args.beam, max_length=length)

    else:
        tq, tk, tv, tg = (torch.from_numpy(x) for x in arrays)
        for t in (tq, tk, tv):
            t.requires_grad_(True)

        def torch_call():
            for t in (tq, tk, tv):
                t.grad = None
            F.scaled_dot_product_attention(tq, tk, tv).backward(tg)

    calls["torch"] = torch_call
    calls["torch"]()
    now = set(threads())
    groups["torch"] = now - before - main_tid
for c in calls.values():  # second warm-up
    c()

used = {n: {"wall": [], **{f: 0.0 for f in FIELDS}, "threads": {g: [0, 0, 0] for g in groups}} for n in calls}
names = list(calls)
for r in range(args.calls):
    for n in names[r % len(names) :] + names[: r % len(names)]:
        t0s, r0 = threads(), resource.getrusage(resource.RUSAGE_SELF)
        w0 = time.perf_counter()
        calls[n]()
        used[n]["wall"].append(time.perf_counter() - w0)
        r1, t1s = resource.getrusage(resource.RUSAGE_SELF), threads()
        for f in FIELDS:
            used[n][f] += getattr(r1, f) - getattr(r0, f)
        for tid, (u1, s1, v1) in t1s.items():
            u0, s0, v0 = t0s.get(tid, (0, 0, 0))
            grp = next((g for g, tids in groups.items() if tid in tids), "other")
            acc = used[n]["threads"].setdefault(grp, [0, 0, 0])
            acc[0] += u1 - u0
            acc[1] += s1 - s0
            acc[2] += v1 - v0
for n, u in used.items():
    c = args.calls
    row = {
        "side": n,
        "mode": args.side,
        "work": args.work if args.work == "attention" else f"beam {args.beam}, batch {args.batch}",
        "L": length,
        "allocator": allocator.applied,
        "omp_wait": args.omp_wait,
        "sync_dispatch": args.sync_dispatch,
        "torch_threads": args.torch_threads,
        "median_ms": round(1e3 * statistics.median(u["wall"]), 1),
        "user_ms": round(1e3 * u["ru_utime"] / c, 1),
        "sys_ms": round(1e3 * u["ru_stime"] / c, 1),
        "minflt": round(u["ru_minflt"] / c),
        "vol_sw": round(u["ru_nvcsw"] / c),
        "invol_sw": round(u["ru_nivcsw"] / c),
        # per thread group: [user ms, sys ms, voluntary switches] per call (ticks are 10 ms: sums over calls)
        "threads": {
            g: [round(1e3 * x[0] / TICK / c, 1), round(1e3 * x[1] / TICK / c, 1), round(x[2] / c)]
            for g, x in u["threads"].items()
        },
        "load1": os.getloadavg()[0],
    }
    line = json.dumps(row)
    print(line, flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(line + "\n")
