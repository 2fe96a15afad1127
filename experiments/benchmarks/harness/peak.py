"""The machine's own limits and how much of them a row reaches: matmul FLOP counts, measured peaks, % of peak.

A row's GFLOP/s counts only the matrix products a program must do (model FLOPs, as in MFU): attention
recomputed in a backward pass, or an extra bias, is not credited. The peak is the faster of a large float32
matmul in XLA and in PyTorch at the bench's threads, measured in the same run; memory bandwidth is a large
float32 copy (bytes read + bytes written per second).
"""

from __future__ import annotations

import dataclasses
import math
import time

from harness.context import Ctx, usable_cores

# The matmul that stands for the machine's peak: large enough to run at full speed on every core, small enough
# to take milliseconds. 2048^3 is where both XLA's and PyTorch's CPU GEMMs reach their plateau on x86.
PEAK_MATMUL_N = 2048
# The copy that stands for memory bandwidth: 256 MiB each way, far past any last-level cache.
BANDWIDTH_ELEMENTS = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Peak:
    """Measured limits: float32 matmul GFLOP/s per side, and memory bandwidth in GB/s."""

    matmul_gflops: dict[str, float]  # "XLA (2 threads)" -> GFLOP/s; PyTorch at each thread count
    bandwidth_gbs: float

    @property
    def gflops(self) -> float:
        """The machine's matmul peak: the fastest side."""
        return max(self.matmul_gflops.values())

    def percent(self, gflops: float) -> str:
        return f"{100.0 * gflops / self.gflops:.0f} %"


def attention_flops(batch: int, heads: int, length: int, width: int, mode: str) -> float:
    """Model FLOPs of self-attention: ``QKᵀ`` and ``PV`` forward; their four gradient products backward.

    Forward is ``2 · 2·B·H·L²·K``; ``fwd+bwd`` adds ``dV = Pᵀ dO``, ``dP = dO Vᵀ``, ``dQ = dS K``,
    ``dK = dSᵀ Q``: three times the forward. Softmax and scaling are not counted.
    """
    forward = 4.0 * batch * heads * length * length * width
    if mode == "fwd":
        return forward
    if mode == "fwd+bwd":
        return 3.0 * forward
    raise ValueError(f"mode must be 'fwd' or 'fwd+bwd', got {mode!r}")


def matmul_flops(closed_jaxpr) -> float:
    """FLOPs of every ``dot_general`` in a traced program, a ``scan`` body counted once per iteration.

    Sub-programs (``pjit``, ``custom_vjp_call``, ``remat``) are walked; a ``cond`` counts its costliest
    branch; a ``while_loop`` has no known trip count and raises.
    """
    return _walk(closed_jaxpr.jaxpr)


def _walk(jaxpr) -> float:
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_flops(eqn)
        elif name == "scan":
            total += eqn.params["length"] * _walk(eqn.params["jaxpr"].jaxpr)
        elif name == "while":
            raise ValueError("matmul_flops: a while_loop has no static trip count")
        elif name == "cond":
            total += max(_walk(b.jaxpr) for b in eqn.params["branches"])
        else:
            for sub in _sub_jaxprs(eqn.params):
                total += _walk(sub)
    return total


def _sub_jaxprs(params: dict):
    """The jaxprs nested in an equation's parameters (``pjit``'s ``jaxpr``, ``custom_vjp``'s ``call_jaxpr``)."""
    for value in params.values():
        inner = getattr(value, "jaxpr", value)  # ClosedJaxpr -> Jaxpr
        if hasattr(inner, "eqns"):
            yield inner


def _dot_flops(eqn) -> float:
    """``2 · batch · M · N · contracted`` for one ``dot_general``."""
    lhs, rhs = (v.aval.shape for v in eqn.invars)
    (lc, rc), (lb, _) = eqn.params["dimension_numbers"]
    batch = math.prod(lhs[d] for d in lb)
    contract = math.prod(lhs[d] for d in lc)
    m = math.prod(lhs) // (batch * contract)
    n = math.prod(rhs) // (batch * contract)
    return 2.0 * batch * m * n * contract


def measure_peak(ctx: Ctx, torch_threads: list[int]) -> Peak:
    """Float32 matmul GFLOP/s in XLA (every usable core) and in PyTorch at each of ``torch_threads``; bandwidth."""
    jax, jnp, np = ctx.jax, ctx.jnp, ctx.np
    n = 256 if ctx.quick else PEAK_MATMUL_N
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    flops = 2.0 * n**3
    usable = usable_cores()
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    mm = jax.jit(jnp.matmul).lower(ja, jb).compile()
    out = {f"XLA ({usable} threads)": flops / _best(lambda: jax.block_until_ready(mm(ja, jb)))}
    if ctx.torch is not None and ctx.torch_device == "cpu":
        torch = ctx.torch
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        before = torch.get_num_threads()
        for t in torch_threads:
            torch.set_num_threads(t)
            try:
                out[f"PyTorch ({t} thread{'s' if t > 1 else ''})"] = flops / _best(lambda: torch.mm(ta, tb))
            finally:
                torch.set_num_threads(before)
    elements = BANDWIDTH_ELEMENTS // (64 if ctx.quick else 1)
    x = jnp.ones((elements,), jnp.float32)
    copy = jax.jit(lambda x: x * 2.0).lower(x).compile()
    bandwidth = 2 * 4 * elements / _best(lambda: jax.block_until_ready(copy(x)))
    return Peak({k: v / 1e9 for k, v in out.items()}, bandwidth / 1e9)


def _best(call, repeats: int = 7) -> float:
    """The fastest of ``repeats`` calls after a warm-up: a peak is what the machine can do, not what it did."""
    call()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return min(samples)


def peak_info(peak: Peak) -> list[tuple[str, str]]:
    """The machine table's rows for the measured limits."""
    sides = "; ".join(f"{name} {g:.0f}" for name, g in peak.matmul_gflops.items())
    return [
        ("float32 matmul, GFLOP/s (measured)", sides),
        ("memory bandwidth, GB/s (measured copy)", f"{peak.bandwidth_gbs:.1f}"),
    ]
