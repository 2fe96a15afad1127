"""Parallelism: the device mesh, logical-axis sharding rules, sharding of state and batches, the layer pipeline.

    from attn_jax.parallel import make_mesh, rules_for, param_shardings, batch_sharding
    mesh = make_mesh(data=2, model=4)                   # axes ("data", "model", "stage"), all AxisType.Auto
    rules = rules_for("data+tensor")                    # logical name -> mesh axis, in priority order
    shardings = param_shardings(nnx.state(abstract_model, nnx.Param), mesh, rules)

The sharded train step itself is ``attn_jax.train.make_sharded_train_step`` (it uses these). This package
imports only jax, numpy and flax: never models, data or train code. Multi-process runs join with
:func:`initialize` (``jax.distributed``) before anything touches a device; :func:`leaving` and
:func:`await_peer_report` let a failing process tell the others and blame a lost peer first.
"""

from attn_jax.parallel._distributed import (
    PEER_LOST_STATUS,
    DistributedError,
    await_peer_report,
    cluster_environment,
    initialize,
    leaving,
)
from attn_jax.parallel._mesh import MESH_AXES, make_mesh
from attn_jax.parallel._pipeline import pipelined_stack, stacked_scan
from attn_jax.parallel._rules import (
    DEFAULT_RULES,
    LOGICAL_AXES,
    STRATEGIES,
    Rules,
    ShardingReport,
    UnknownStrategyError,
    batch_sharding,
    gather_layer,
    gathered_rules,
    logical_names,
    logical_to_spec,
    param_shardings,
    replicated,
    rules_for,
    shard_state,
    sharding_report,
)

__all__ = [
    "DEFAULT_RULES",
    "LOGICAL_AXES",
    "MESH_AXES",
    "STRATEGIES",
    "Rules",
    "ShardingReport",
    "UnknownStrategyError",
    "batch_sharding",
    "gather_layer",
    "gathered_rules",
    "logical_names",
    "logical_to_spec",
    "make_mesh",
    "param_shardings",
    "pipelined_stack",
    "replicated",
    "rules_for",
    "shard_state",
    "sharding_report",
    "stacked_scan",
    "DistributedError",
    "PEER_LOST_STATUS",
    "await_peer_report",
    "cluster_environment",
    "initialize",
    "leaving",
]
