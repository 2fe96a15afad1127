"""Logical axis names → mesh axes: the rule table, its strategy presets, and the shardings they give.

Parameters carry *logical* axis names (``nnx.with_partitioning(..., eager_sharding=False)``, see
``attn_jax/nn/_params.py``); a short rule table maps each name to a mesh axis (or ``None``: replicated), in the
style of MaxText's ``logical_axis_rules`` and Flax's ``logical_to_mesh_axes``. The default table
(:data:`DEFAULT_RULES`), in priority order::

    logical     mesh axis   what carries it
    batch       data        activations and the batch (data parallelism)
    layers      stage       the leading axis of stacked per-layer params (pipeline stages)
    vocab       model       embedding tables E [V, m], the softmax W_o [l, V] and its bias (the largest params)
    heads       model       multi-head projections (Megatron: heads split across devices)
    align       model       additive attention's W_a [n, n'], U_a [2n, n'], v_a, b (column-parallel over n')
    mlp         model       the deep output's maxout units (U_o, V_o, C_o, b_o: column-parallel over l)
    hidden      model       recurrent kernels' output units W [m, 3, n], U [n, 3, n], b (column-parallel)
    hidden_in   None        the recurrent state as an input of U / W_s (so that U is column-, not row-parallel)
    embed       None        word-embedding width m (tables are split over the vocabulary instead)
    context     None        annotation width 2n = [→h; ←h]: a concatenation of two hidden-split halves,
                            which a block split of 2n would not match; its readers are split on their outputs
    kv          None        per-head width (heads are split instead)
    length      None        time/sequence axes of activations

**Priority.** A mesh axis is used at most once per parameter. Rules are applied in table order (as Flax's
``logical_to_mesh_axes`` does), so when two dims of one parameter map to the same mesh axis the dim whose name
comes *first in the table* gets it and the other is replicated: the softmax ``W_o [mlp, vocab]`` is split over
the vocabulary (logits ``[B, T, V]`` split over ``V``; the log-softmax then needs only ``[B, T]`` all-reduces),
additive attention's ``W_a [hidden, align]`` over the alignment width (so ``W_a s`` and ``U_a h_j`` are split the
same way and ``v_aᵀ tanh(·)`` ends in one all-reduce of the scores), and ``U_o [hidden, mlp]`` over ``mlp`` like
the rest of the deep output. A stacked LSTM's ``[layers, hidden_in, 4, hidden]`` kernel goes to
``(stage, None, None, model)``.

**Dropped axes.** Mesh axes absent from the mesh, or of size 1, are dropped from the spec (a ``model=1`` mesh
gives fully replicated weights, written ``P(None, ...)``). A rule left without axes passes its dims on to the
next rule for the same name, as an indivisible dim does.

**Indivisible dims are replicated.** ``jax.jit`` / ``device_put`` need a split dim to be a multiple of its mesh
axes' size; a dim that is not (e.g. a vocabulary of 30 003 on ``model=2``) is replicated instead and the next
rule for the same name, if any, is tried. Pass ``strict=True`` to get a ``ValueError`` naming the parameter
instead (recommended for real runs: pad the vocabulary to a multiple of the mesh instead of silently losing
the split).

**Fully sharded parameters** (``fsdp``, ZeRO-3, MaxText's ``fsdp`` axis). The ``fsdp`` strategy splits the batch over
``data`` as ``data`` does, and also every parameter name (vocab, heads, align, mlp, hidden, hidden_in, embed,
context, kv) over ``data``. Table order picks the dim: the first name of the table that a parameter has, and
that divides by the data axis, gets it (an embedding ``[vocab, embed]`` splits over the vocabulary, a
Transformer query kernel ``[layers, embed, heads, kv]`` over ``embed`` when the heads do not divide). The
``layers`` axis is never split, so a scan over stacked layers reads one layer's shard per iteration and the
compiler gathers it there. Optimiser moments follow their parameters. A parameter with no divisible dim stays
replicated; :func:`sharding_report` counts those. ``fsdp+tensor`` gives the tensor names to ``model`` first
and then, in fallback rows after the table, to ``data`` for a parameter whose other dims took no ``data``
(the softmax ``W_o [mlp, vocab]`` becomes ``(data, model)``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = [
    "DEFAULT_RULES",
    "LOGICAL_AXES",
    "STRATEGIES",
    "Rules",
    "ShardingReport",
    "batch_sharding",
    "gather_layer",
    "gathered_rules",
    "logical_names",
    "logical_to_spec",
    "param_shardings",
    "replicated",
    "rules_for",
    "shard_state",
    "sharding_report",
]

MeshAxes = str | tuple[str, ...] | None
Rules = tuple[tuple[str, MeshAxes], ...]
"""A rule table: ``((logical_name, mesh_axis | (mesh_axes, ...) | None), ...)``, in priority order."""

# (logical name, mesh axis, the strategy that uses it); table order is priority order (see module doc).
_TABLE: tuple[tuple[str, str | None, str | None], ...] = (
    ("batch", "data", "data"),
    ("layers", "stage", "pipeline"),
    ("vocab", "model", "tensor"),
    ("heads", "model", "tensor"),
    ("align", "model", "tensor"),
    ("mlp", "model", "tensor"),
    ("hidden", "model", "tensor"),
    ("hidden_in", None, None),
    ("embed", None, None),
    ("context", None, None),
    ("kv", None, None),
    ("length", None, None),
)

LOGICAL_AXES: tuple[str, ...] = tuple(name for name, _, _ in _TABLE)
"""Every logical axis name the models may use."""

STRATEGIES: tuple[str, ...] = ("data", "tensor", "pipeline", "data+pipeline", "data+tensor", "fsdp")
"""The named presets of :func:`rules_for` (another ``+``-join of ``data``, ``fsdp``, ``tensor``, ``pipeline`` is
accepted too, e.g. ``fsdp+tensor``)."""

_PARTS = ("data", "fsdp", "tensor", "pipeline")

# The logical names of parameter dims; ``fsdp`` maps each one that no other part takes to ``data``.
_PARAM_NAMES = ("vocab", "heads", "align", "mlp", "hidden", "hidden_in", "embed", "context", "kv")


class UnknownStrategyError(ValueError):
    """A strategy that names a part :func:`rules_for` does not know, or names one twice.

    Known parts that do not combine (``fsdp+data``) raise a plain ``ValueError`` instead, so that a caller can
    list the valid names for the first case and pass the reason on for the second.
    """


def rules_for(strategy: str) -> Rules:
    """The rule table of a parallelism ``strategy``: the default table with the other strategies' axes set to None.

    ``"data"``: only ``batch → data`` (weights replicated); ``"tensor"``: ``vocab, heads, align, mlp, hidden →
    model``; ``"pipeline"``: ``layers → stage``; ``"fsdp"``: ``batch`` and every parameter name ``→ data``;
    ``"a+b"``: both. Under ``fsdp+tensor`` the tensor names map to ``model``, the other parameter names to
    ``data``, and fallback rows after the table map the tensor names to ``data`` too (see the module doc).

    >>> dict(rules_for("data+tensor"))["vocab"], dict(rules_for("data"))["vocab"], dict(rules_for("fsdp"))["vocab"]
    ('model', None, 'data')
    """
    parts = strategy.split("+") if isinstance(strategy, str) else []
    if not parts or any(p not in _PARTS for p in parts) or len(set(parts)) != len(parts):
        raise UnknownStrategyError(
            f"unknown parallelism strategy {strategy!r}; expected one of {', '.join(STRATEGIES)} "
            f"(or another '+'-join of {', '.join(_PARTS)})"
        )
    if "fsdp" in parts and "data" in parts:
        raise ValueError(f"{strategy!r}: fsdp already splits the batch over data; drop 'data'")
    if "fsdp" in parts and "pipeline" in parts:
        raise ValueError(
            f"{strategy!r}: fsdp does not combine with pipeline (the pipeline's shard_map takes each stage's "
            "layers whole, which would gather every fsdp split at once); use fsdp, fsdp+tensor or data+pipeline"
        )
    used = set(parts) | ({"data"} if "fsdp" in parts else set())
    rows = [(name, axis if part in used else None) for name, axis, part in _TABLE]
    if "fsdp" not in parts:
        return tuple(rows)
    fallback = tuple((name, "data") for name, axis in rows if name in _PARAM_NAMES and axis is not None)
    rows = [(name, "data" if axis is None and name in _PARAM_NAMES else axis) for name, axis in rows]
    return (*rows, *fallback)


DEFAULT_RULES: Rules = rules_for("data+tensor+pipeline")
"""The full table: data, tensor and pipeline parallelism (axes of size 1 drop out of every spec)."""


def _mesh_sizes(mesh: Mesh | jax.sharding.AbstractMesh | None) -> dict[str, int] | None:
    """Axis sizes of ``mesh`` (default: the ambient ``jax.set_mesh`` mesh); None when there is no mesh."""
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return None
    return dict(mesh.shape)


def _check_rules(rules: Rules) -> None:
    if isinstance(rules, str) or not isinstance(rules, Sequence):
        raise ValueError(f"rules must be a tuple of (logical_name, mesh_axes) pairs, got {rules!r}")
    for rule in rules:
        if not (isinstance(rule, Sequence) and len(rule) == 2 and isinstance(rule[0], str)):
            raise ValueError(f"each rule must be a (logical_name, mesh_axes) pair, got {rule!r}")


def logical_to_spec(
    names: Sequence[str | None],
    rules: Rules = DEFAULT_RULES,
    *,
    mesh: Mesh | jax.sharding.AbstractMesh | None = None,
    shape: Sequence[int] | None = None,
    strict: bool = False,
) -> P:
    """The ``PartitionSpec`` that ``rules`` give an array whose dims have the logical ``names``.

    Rules are applied in table order; a rule assigns its mesh axes to every still-unassigned dim of that name,
    unless one of those axes is already used in this spec (each mesh axis at most once), in which case a later
    rule for the same name may apply; dims no rule assigns are replicated. With a mesh (``mesh=`` or the ambient
    ``jax.set_mesh`` one) mesh axes absent from it or of size 1 are dropped, and with ``shape=`` a dim that is
    not a multiple of its axes' total size is replicated (``strict=True``: ``ValueError``).

    Args:
      names: one logical name (or None: replicated) per dim.
      rules: the rule table (:data:`DEFAULT_RULES`, :func:`rules_for`).
      mesh: the mesh the spec is for (default: the ambient one; without any, no axis is dropped).
      shape: the array's shape, to check divisibility (needs a mesh).
      strict: raise instead of replicating an indivisible dim.

    Returns:
      A ``PartitionSpec`` with one entry per dim.

    Raises:
      ValueError: an unknown logical name (not in ``rules``), ``shape`` of another rank, or (``strict``) an
        indivisible dim.

    >>> logical_to_spec(("mlp", "vocab"), rules_for("tensor"))
    P(None, 'model')
    """
    _check_rules(rules)
    names = tuple(names)
    known = {name for name, _ in rules}
    unknown = [n for n in names if n is not None and n not in known]
    if unknown:
        raise ValueError(
            f"logical axis names {unknown} of {names} have no rule; the rules know {sorted(known)}"
        )
    if shape is not None and len(shape) != len(names):
        raise ValueError(f"{len(names)} logical names {names} for an array of shape {list(shape)}")
    sizes = _mesh_sizes(mesh)
    unassigned = object()
    result: list = [unassigned] * len(names)
    used: set[str] = set()
    for name, axes in rules:
        positions = [i for i, n in enumerate(names) if n == name and result[i] is unassigned]
        if not positions:
            continue
        axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        if sizes is not None:
            axes = tuple(a for a in axes if sizes.get(a, 1) > 1)
        if not axes:
            continue  # nothing to split over here: a later rule for the same name may apply
        for i in positions:
            if used.intersection(axes):
                break  # taken by an earlier rule or dim: leave for a later rule, else replicated
            total = math.prod(sizes[a] for a in axes) if sizes is not None else 1
            if shape is not None and sizes is not None and shape[i] % total:
                if strict:
                    raise ValueError(
                        f"dim {i} ({name!r}) of shape {list(shape)} is not a multiple of mesh axes {axes} "
                        f"(size {total}); pad it or change the rules"
                    )
                continue
            result[i] = axes[0] if len(axes) == 1 else axes
            used.update(axes)
    return P(*(None if r is unassigned else r for r in result))


def logical_names(variable) -> tuple[str | None, ...] | None:
    """The logical axis names an NNX variable was annotated with (``nnx.with_partitioning``), or None."""
    metadata = variable.get_metadata() if isinstance(variable, nnx.Variable) else {}
    for key in ("out_sharding", "sharding_names", "sharding"):  # flax 0.12 name first, older ones after
        names = metadata.get(key)
        if names is not None:
            return tuple(names)
    return None


def gathered_rules(rules: Rules) -> Rules:
    """The rules a layer's weights follow while the layer runs: every parameter name loses the batch's axes.

    Under ``fsdp`` this gathers each weight whole (``fsdp+tensor``: whole but for its ``model`` split); under
    the other strategies, whose parameters never take the batch's axes, it returns ``rules`` unchanged.

    >>> dict(gathered_rules(rules_for("fsdp")))["embed"], dict(gathered_rules(rules_for("fsdp+tensor")))["vocab"]
    (None, 'model')
    """
    batch = dict(rules).get("batch")
    batch_axes = set() if batch is None else {batch} if isinstance(batch, str) else set(batch)
    out = []
    for name, axes in rules:
        if name in _PARAM_NAMES and axes is not None:
            kept = tuple(a for a in ((axes,) if isinstance(axes, str) else axes) if a not in batch_axes)
            axes = None if not kept else kept[0] if len(kept) == 1 else kept
            if axes is None and any(n == name for n, _ in out):
                continue  # a fallback row that only split over the batch's axes
        out.append((name, axes))
    return tuple(out)


def gather_layer(params, mesh: Mesh, rules: Rules):
    """One layer's slice of stacked parameters, constrained to :func:`gathered_rules` (an all-gather under fsdp).

    ``params`` is an ``nnx.State`` slice taken inside a scan over layers: each ``nnx.Variable`` still carries the
    names of the stacked array, whose leading ``layers`` name the slice has lost. Variables without names and
    plain arrays pass through unchanged.
    """
    gathered = gathered_rules(rules)

    def constrain(variable):
        names = logical_names(variable)
        if names is None:
            return variable
        value = variable.get_value()
        names = names[len(names) - value.ndim :]
        spec = logical_to_spec(names, gathered, mesh=mesh, shape=value.shape)
        return variable.replace(jax.lax.with_sharding_constraint(value, NamedSharding(mesh, spec)))

    return jax.tree.map(constrain, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def replicated(mesh: Mesh) -> NamedSharding:
    """The fully replicated sharding on ``mesh`` (scalars, PRNG keys, metrics)."""
    return NamedSharding(mesh, P())


def param_shardings(abstract_params, mesh: Mesh, rules: Rules = DEFAULT_RULES, *, strict: bool = False):
    """A ``NamedSharding`` per parameter from its NNX logical-name metadata and ``rules``.

    Args:
      abstract_params: an ``nnx.State`` (or any pytree) whose leaves are ``nnx.Variable``s, typically
        ``nnx.state(nnx.eval_shape(build), nnx.Param)`` (values may be ``ShapeDtypeStruct``s); plain array
        leaves and variables without names are replicated.
      mesh: the device mesh.
      rules: the rule table.
      strict: see :func:`logical_to_spec`.

    Returns:
      The same tree with a ``NamedSharding`` in place of each variable; an ``nnx.State`` becomes a plain nested
      dict (the structure of ``nnx.to_pure_dict``, as parameters travel in the train state).
    """

    def sharding(path, leaf):
        names = logical_names(leaf)
        if names is None:
            return replicated(mesh)
        try:
            spec = logical_to_spec(names, rules, mesh=mesh, shape=leaf.shape, strict=strict)
        except ValueError as error:
            raise ValueError(f"parameter {jax.tree_util.keystr(path)}: {error}") from None
        return NamedSharding(mesh, spec)

    out = jax.tree_util.tree_map_with_path(
        sharding, abstract_params, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )
    return _pure(out) if isinstance(out, nnx.State) else out


def _pure(tree):
    """An ``nnx.State`` of non-variable leaves as a plain nested dict."""
    if isinstance(tree, (nnx.State, Mapping)):
        return {k: _pure(v) for k, v in tree.items()}
    return tree


def batch_sharding(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """The sharding of every batch array: its leading (``batch``) dim split as the rules say, the rest replicated.

    One ``NamedSharding`` serves arrays of any rank (``P("data")`` names the leading dim only).
    """
    return NamedSharding(mesh, logical_to_spec(("batch",), rules, mesh=mesh))


def shard_state(state, shardings):
    """``state`` placed on the devices as ``shardings`` (a matching tree of ``Sharding``s) say."""
    return jax.device_put(state, shardings)


class ShardingReport(NamedTuple):
    """How a tree of arrays lies on a mesh: what is split, what every device holds whole, what one device holds."""

    arrays: int
    """Arrays in the tree."""
    split: int
    """Arrays split over at least one mesh axis."""
    total_bytes: int
    """The whole tree's bytes, each array counted once."""
    replicated_bytes: int
    """Bytes of the arrays no mesh axis splits (every device holds them whole)."""
    device_bytes: int
    """Bytes one device holds: the sum of its shards (the same on every device of the mesh)."""
    replicated_paths: tuple[str, ...]
    """The replicated arrays' paths (``jax.tree_util.keystr``), in tree order."""


def sharding_report(shapes, shardings) -> ShardingReport:
    """A :class:`ShardingReport` of ``shapes`` (arrays or ``ShapeDtypeStruct``s) laid out as ``shardings`` say.

    A parameter the rules leave replicated (no dim divides by its mesh axes) costs every device its full size;
    the report counts and names them, so a run says how far its split fell short of ``1 / devices``.

    >>> mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    >>> shapes = {"w": jax.ShapeDtypeStruct((4, 3), "float32"), "b": jax.ShapeDtypeStruct((3,), "float32")}
    >>> report = sharding_report(shapes, {"w": NamedSharding(mesh, P("data")), "b": replicated(mesh)})
    >>> report.split, report.total_bytes, report.device_bytes, report.replicated_paths
    (1, 60, 36, ("['b']",))
    """
    leaves = jax.tree_util.tree_leaves_with_path(shapes)
    flat_shardings = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    if len(leaves) != len(flat_shardings):
        raise ValueError(f"{len(leaves)} arrays but {len(flat_shardings)} shardings")
    split = total = replicated_bytes = device = 0
    paths = []
    for (path, leaf), sharding in zip(leaves, flat_shardings, strict=True):
        itemsize = jax.numpy.dtype(leaf.dtype).itemsize
        size = math.prod(leaf.shape) * itemsize
        shard = math.prod(sharding.shard_shape(leaf.shape)) * itemsize
        total += size
        device += shard
        if shard < size:
            split += 1
        else:
            replicated_bytes += size
            paths.append(jax.tree_util.keystr(path))
    return ShardingReport(len(leaves), split, total, replicated_bytes, device, tuple(paths))
