"""Row 10's target case alone: attn_jax ``beam_search`` (batch 32, beam 4, 32 steps) vs CTranslate2 float32 at 2 threads.

    .venv/bin/python experiments/benchmarks/probes/marian_target_case.py --ct2     # RUNS=3 by default

Builds row 10's random Marian model once in /tmp/r10 (``rows/row10_marian.py``'s builder), imports it, and
decodes row 10's batch. The first call saves the best hypotheses' tokens; later calls (e.g. of a changed tree,
``PYTHONPATH=<other checkout>``) say whether their tokens equal them. Each run: the median of 3 calls, wall and
process CPU time, then CTranslate2's (with ``--ct2``) and the ratio CT2 time / attn_jax time.
"""

import json
import os
import statistics
import sys
import time
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import jax
import jax.numpy as jnp
import numpy as np
import torch
from rows import row10_marian as r10

HF, RUN = "/tmp/r10/hf", "/tmp/r10/run"
os.makedirs("/tmp/r10", exist_ok=True)
ctx = types.SimpleNamespace(torch=torch, np=np, log=print)
if not os.path.exists(HF + "/config.json"):
    r10._build_marian(ctx, HF, r10.FULL_SHAPE)
from attn_jax.data import marian_order  # noqa: E402
from attn_jax.pipeline import import_marian, load_model  # noqa: E402

if not os.path.exists(RUN):
    import_marian(HF, RUN)
loaded = load_model(RUN)
vocab = json.load(open(HF + "/vocab.json"))
pad = len(vocab) - 1
order = marian_order(vocab, pad_id=pad, start_id=pad, eos_id=0, unk_id=1)
ours = {m: i for i, m in enumerate(order) if i != 1}
batch, k, steps = 32, 4, 32
ids, lens, mask, src = r10.source_batch(np, batch, pad, ours)
src, jmask = jnp.asarray(src, jnp.int32), jnp.asarray(mask)
from attn_jax.decoding import beam_search  # noqa: E402


def run():
    return jax.block_until_ready(
        beam_search(
            loaded.model,
            src,
            jmask,
            beam_size=k,
            max_length=steps,
            max_length_ratio=None,
            length_penalty_alpha=0.0,
        )
    )


t0 = time.perf_counter()
r = run()
print(f"first call {time.perf_counter() - t0:.1f} s")
toks = np.asarray(r.tokens[:, 0])
ref = "/tmp/r10/ref_tokens.npy"
if not os.path.exists(ref):
    np.save(ref, toks)
    print("saved reference tokens")
else:
    print("tokens equal to reference:", bool((np.load(ref) == toks).all()), "scores", float(r.scores.sum()))
ct = None
if "--ct2" in sys.argv:
    import ctranslate2

    out = "/tmp/r10/ct2_f32"
    if not os.path.exists(out):
        ctranslate2.converters.TransformersConverter(HF).convert(out, quantization="float32")
    tr = ctranslate2.Translator(out, device="cpu", inter_threads=1, intra_threads=2)
    pieces = {i: p for p, i in vocab.items()}
    tokens = [[pieces[i] for i in row[:n]] for row, n in zip(ids.tolist(), lens, strict=True)]
    ct = lambda: tr.translate_batch(
        tokens, beam_size=k, max_decoding_length=steps, length_penalty=0.0, max_batch_size=0
    )
    ct()
n = int(os.environ.get("RUNS", 3))
for i in range(n):
    t, cpu = [], []
    for _ in range(3):
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        t.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    line = f"run {i}: attn_jax {statistics.median(t):.3f} s (CPU {statistics.median(cpu):.2f} s)"
    if ct:
        c = []
        for _ in range(3):
            t0 = time.perf_counter()
            ct()
            c.append(time.perf_counter() - t0)
        line += f"  CT2 f32 2t {statistics.median(c):.3f} s  ratio {statistics.median(c) / statistics.median(t):.3f}"
    print(line, f"load {os.getloadavg()[0]:.2f}", flush=True)
