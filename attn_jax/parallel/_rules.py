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
gives fully replicated weights, written ``P(None, ...)``).

**Indivisible dims are replicated.** ``jax.jit`` / ``device_put`` need a split dim to be a multiple of its mesh
axes' size; a dim that is not (e.g. a vocabulary of 30 003 on ``model=2``) is replicated instead and the next
rule for the same name, if any, is tried. Pass ``strict=True`` to get a ``ValueError`` naming the parameter
instead (recommended for real runs: pad the vocabulary to a multiple of the mesh instead of silently losing
the split).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = [
    "DEFAULT_RULES",
    "LOGICAL_AXES",
    "STRATEGIES",
    "Rules",
    "batch_sharding",
    "logical_names",
    "logical_to_spec",
    "param_shardings",
    "replicated",
    "rules_for",
    "shard_state",
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

STRATEGIES: tuple[str, ...] = ("data", "tensor", "pipeline", "data+pipeline", "data+tensor")
"""The named presets of :func:`rules_for` (any ``+``-join of ``data``, ``tensor``, ``pipeline`` is accepted)."""

_PARTS = ("data", "tensor", "pipeline")


def rules_for(strategy: str) -> Rules:
    """The rule table of a parallelism ``strategy``: the default table with the other strategies' axes set to None.

    ``"data"``: only ``batch → data`` (weights replicated); ``"tensor"``: ``vocab, heads, align, mlp, hidden →
    model``; ``"pipeline"``: ``layers → stage``; ``"a+b"``: both.

    >>> dict(rules_for("data+tensor"))["vocab"], dict(rules_for("data"))["vocab"]
    ('model', None)
    """
    parts = strategy.split("+") if isinstance(strategy, str) else []
    if not parts or any(p not in _PARTS for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(
            f"unknown parallelism strategy {strategy!r}; expected one of {', '.join(STRATEGIES)} "
            f"(or another '+'-join of {', '.join(_PARTS)})"
        )
    return tuple((name, axis if used in parts else None) for name, axis, used in _TABLE)


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
            for i in positions:
                result[i] = None
            continue
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
