"""Per-device memory of the compiled sharded train step, data parallel against fully sharded, on 8 devices.

    python experiments/fsdp/memory.py > experiments/fsdp/table.md

On the CPU it simulates 8 devices (``--xla_force_host_platform_device_count=8``, set before jax is imported);
on an accelerator host with 8 devices it uses them. For each model it compiles the step of
``attn_jax.train.make_sharded_train_step`` for ``parallel.strategy`` ``data`` and ``fsdp`` (no step runs) and
prints XLA's per-device ``memory_analysis``: the arguments (the train state plus one batch shard) and the
temporaries. Adam keeps two moments per parameter, so the state is three times the parameters.
"""

import os
import sys

if "jax" not in sys.modules:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from attn_jax.data import Batch  # noqa: E402
from attn_jax.models import GNMTConfig, TransformerConfig  # noqa: E402
from attn_jax.parallel import make_mesh, rules_for, sharding_report  # noqa: E402
from attn_jax.train import OptimizerConfig, StepConfig  # noqa: E402
from attn_jax.train._sharded import (  # noqa: E402
    abstract_sharded_state,
    make_sharded_train_step,
    train_state_shardings,
)

DEVICES = 8
B, S, T, V = 32, 32, 32, 8000
MODELS = {
    "Transformer base (d 512, 6+6)": TransformerConfig(src_vocab=V, tgt_vocab=V, max_length=64),
    "Transformer big (d 1024, 6+6)": TransformerConfig(
        src_vocab=V, tgt_vocab=V, d_model=1024, heads=16, d_ff=4096, max_length=64
    ),
    "GNMT (n 512, 8+8)": GNMTConfig(src_vocab=V, tgt_vocab=V, embed=512, hidden=512, align=512),
}


def step_memory(model, strategy: str):
    """``(arguments, temporaries, state report)`` per device of the compiled step under ``strategy``."""
    config = StepConfig(model=model, optimizer=OptimizerConfig(name="adam"))
    mesh, rules = make_mesh(data=DEVICES, devices=jax.devices()[:DEVICES]), rules_for(strategy)
    state = abstract_sharded_state(config, mesh, rules)
    ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    batch = Batch(
        src=ints(B, S),
        src_len=ints(B),
        tgt_in=ints(B, T),
        tgt_out=ints(B, T),
        tgt_len=ints(B),
        example_id=ints(B),
    )
    compiled = make_sharded_train_step(config, mesh, rules).lower(state, batch).compile()
    memory = compiled.memory_analysis()
    report = sharding_report(state, train_state_shardings(config, mesh, rules))
    return memory.argument_size_in_bytes, memory.temp_size_in_bytes, report


def main() -> None:
    if len(jax.devices()) < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices, found {len(jax.devices())}")
    mib = 2**20
    print(f"Backend {jax.default_backend()}, jax {jax.__version__}; {DEVICES} devices, batch {B} (global), ")
    print(f"lengths {S}/{T}, vocabularies {V}, Adam. MiB per device of the compiled step.\n")
    print(
        "| model | train state | data: arguments | data: temporaries | fsdp: arguments | fsdp: temporaries "
        "| fsdp/data, arguments + temporaries | replicated under fsdp |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, model in MODELS.items():
        data_args, data_temp, report = step_memory(model, "data")
        fsdp_args, fsdp_temp, fsdp_report = step_memory(model, "fsdp")
        ratio = (fsdp_args + fsdp_temp) / (data_args + data_temp)
        kept = fsdp_report.arrays - fsdp_report.split
        print(
            f"| {label} | {report.total_bytes / mib:.1f} | {data_args / mib:.1f} | {data_temp / mib:.1f} | "
            f"{fsdp_args / mib:.1f} | {fsdp_temp / mib:.1f} | {ratio:.2f} | "
            f"{kept} arrays, {fsdp_report.replicated_bytes / 1024:.1f} KiB |",
            flush=True,
        )
    print(f"\nCommand: `python {' '.join(sys.argv)}`.")


if __name__ == "__main__":
    main()
