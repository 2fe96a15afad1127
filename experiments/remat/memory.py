"""Temporary memory of one compiled training gradient per ``model.remat`` policy, from XLA's memory_analysis.

    python experiments/remat/memory.py [MODEL ...] > experiments/remat/table.md

Two sizes per model (Transformer, GNMT, RNNsearch, RNNenc; the models named, or all), batch 16 of 32-token
sources and targets; the gradient of the teacher-forced log-likelihood, jitted and compiled for this machine's
backend. About a minute per model on a 2-core CPU.
"""

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_jax.models import GNMT, GNMTConfig, RNNConfig, RNNenc, RNNsearch, Transformer, TransformerConfig
from attn_jax.models.interface import REMAT_POLICIES

B, S, T, V = 16, 32, 32, 4000
SIZES = {
    "transformer": [
        (
            "d 256, 3+3 layers",
            TransformerConfig(
                src_vocab=V,
                tgt_vocab=V,
                d_model=256,
                heads=4,
                d_ff=1024,
                encoder_layers=3,
                decoder_layers=3,
                max_length=64,
            ),
        ),
        ("d 512, 6+6 layers", TransformerConfig(src_vocab=V, tgt_vocab=V, max_length=64)),
    ],
    "gnmt": [
        (
            "n 128, 4+4 layers",
            GNMTConfig(
                src_vocab=V, tgt_vocab=V, embed=128, hidden=128, align=128, encoder_layers=4, decoder_layers=4
            ),
        ),
        ("n 512, 8+8 layers", GNMTConfig(src_vocab=V, tgt_vocab=V, embed=512, hidden=512, align=512)),
    ],
    "rnnsearch": [
        (
            "n 256, align 256",
            RNNConfig(src_vocab=V, tgt_vocab=V, embed=128, hidden=256, maxout=128, align=256),
        ),
        ("n 1000, align 1000 (the paper's)", RNNConfig(src_vocab=V, tgt_vocab=V)),
    ],
    "rnnenc": [
        ("n 256", RNNConfig(src_vocab=V, tgt_vocab=V, arch="rnnenc", embed=128, hidden=256, maxout=128)),
        ("n 1000 (the paper's)", RNNConfig(src_vocab=V, tgt_vocab=V, arch="rnnenc")),
    ],
}
CLASSES = {"transformer": Transformer, "gnmt": GNMT, "rnnsearch": RNNsearch, "rnnenc": RNNenc}


def temp_bytes(cls, cfg) -> int:
    """XLA's temporary bytes for the compiled gradient of ``cls(cfg)`` on one batch (no parameters drawn)."""
    abstract = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(abstract)
    src = jax.ShapeDtypeStruct((B, S), jnp.int32)
    tgt = jax.ShapeDtypeStruct((B, T), jnp.int32)
    mask = jax.ShapeDtypeStruct((B, S), jnp.bool_)

    def loss(params, src, mask, tgt):
        logits, _ = nnx.merge(graphdef, params)(src, mask, tgt)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    compiled = jax.jit(jax.grad(loss)).lower(params, src, mask, tgt).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def main() -> None:
    policies = list(REMAT_POLICIES)
    print(
        f"Backend {jax.default_backend()}, jax {jax.__version__}; batch {B}, lengths {S}/{T}, vocabulary {V}."
    )
    print("Temporary MiB of the compiled gradient (ratio to `none`).\n")
    print("| model | size | " + " | ".join(policies) + " |")
    print("|---|---|" + "---|" * len(policies))
    for name in sys.argv[1:] or SIZES:
        for label, cfg in SIZES[name]:
            got = {p: temp_bytes(CLASSES[name], dataclasses.replace(cfg, remat=p)) for p in policies}
            cells = [f"{got[p] / 2**20:.1f} ({got[p] / got['none']:.2f})" for p in policies]
            print(f"| {name} | {label} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nCommand: `python {' '.join(sys.argv)}`.")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
