"""Wrapping the core's plain param pytrees into NNX ``Param``s that carry logical axis names."""

from __future__ import annotations

from collections.abc import Mapping

import jax
from flax import nnx


def partitioned(value: jax.Array, names: tuple[str | None, ...]) -> nnx.Param:
    """An ``nnx.Param`` annotated with logical axis ``names``, as ``nnx.with_partitioning`` would annotate it.

    ``eager_sharding=False`` keeps modules constructible without a mesh: the trainer maps the logical names to
    mesh axes through the config's rule table (``nnx.get_partition_spec`` + logical axis rules) and shards the state
    explicitly, instead of every constructor needing a mesh in context.
    """
    if len(names) != value.ndim:
        raise ValueError(
            f"{len(names)} logical axis names {names} for a parameter of shape {list(value.shape)}"
        )
    init = nnx.with_partitioning(lambda *_: value, names, eager_sharding=False)
    return nnx.Param(init(None, value.shape, value.dtype))


def wrap(params: Mapping, names: Mapping) -> dict:
    """Turn a (nested) dict of arrays into the same structure of partitioned ``nnx.Param``s (used as ``nnx.Dict``)."""
    out = {}
    for k, v in params.items():
        out[k] = nnx.Dict(wrap(v, names[k])) if isinstance(v, Mapping) else partitioned(v, names[k])
    return out


def unwrap(module_params) -> dict:
    """The plain pytree of arrays the functional core expects, read from NNX ``Param``s."""
    out = {}
    for k, v in module_params.items():
        out[k] = v[...] if isinstance(v, nnx.Variable) else unwrap(v)
    return out
