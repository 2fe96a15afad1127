"""A stack of recurrent layers, plain (:func:`stacked_scan`) and as GNMT's pipeline wavefront (:func:`pipelined_stack`).

Wu et al. (2016, GNMT, §3 and figure 1) place each LSTM layer of the stack on its own GPU: layer ``l`` can start
time step ``t`` as soon as layer ``l-1`` has finished it, so after a fill of ``stages - 1`` steps all devices
work at once, each on a different time step (a *wavefront*). :func:`pipelined_stack` is that schedule in one
``lax.scan`` under ``jax.shard_map``: the ``L`` layers are split into ``stages`` groups of ``L / stages``
consecutive layers along the mesh's ``stage`` axis; at tick ``t`` stage ``s`` runs its layers on time step
``t - s`` and hands the output to stage ``s + 1`` with ``lax.ppermute``; ``T + stages - 1`` ticks cover all
steps. The result equals :func:`stacked_scan` (the same operations in the same order per layer and step), and
it is differentiable: the reverse pass runs the wavefront backwards (``ppermute``'s transpose is the reverse
permutation).

Layout: every stacked-params leaf is ``[L, ...]``; every carry leaf ``[L, B, ...]``; every ``xs`` / ``ys`` leaf
time-major ``[T, B, ...]``. ``layer_fn(params_l, carry_l, x_t) -> (carry_l, y_t)`` maps one layer over one time
step; ``y_t`` must have ``x_t``'s structure and shapes (it is the next layer's input).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

__all__ = ["pipelined_stack", "stacked_scan"]

LayerFn = Callable  # (params_l, carry_l, x_t) -> (carry_l, y_t)


def _leading(tree, what: str) -> int:
    """The common leading size of every leaf of ``tree`` (ValueError naming the shapes otherwise)."""
    sizes = {jnp.shape(x)[0] if jnp.ndim(x) else None for x in jax.tree.leaves(tree)}
    if len(sizes) != 1 or None in sizes:
        shapes = [list(jnp.shape(x)) for x in jax.tree.leaves(tree)]
        raise ValueError(f"every leaf of {what} needs the same leading axis; got shapes {shapes}")
    return sizes.pop()


def _check(stacked_params, init_carry, xs) -> tuple[int, int]:
    """``(L, T)`` after checking that params and carries share ``L`` and xs leaves share ``T``."""
    num_layers = _leading(stacked_params, "stacked_params [L, ...]")
    carry_layers = _leading(init_carry, "init_carry [L, B, ...]")
    if carry_layers != num_layers:
        raise ValueError(f"init_carry has {carry_layers} layers but stacked_params has {num_layers}")
    return num_layers, _leading(xs, "xs [T, B, ...]")


def _run_layer(layer_fn: LayerFn, params, carry, xs):
    """One layer over all time steps: ``lax.scan`` of ``layer_fn`` (``(final carry, ys)``)."""
    return lax.scan(lambda c, x: layer_fn(params, c, x), carry, xs)


def stacked_scan(layer_fn: LayerFn, stacked_params, init_carry, xs):
    r"""A stack of ``L`` recurrent layers, layer by layer: the plain reference of :func:`pipelined_stack`.

    .. math:: (c^l_t, y^l_t) = f(\theta_l, c^l_{t-1}, y^{l-1}_t), \qquad y^{-1}_t = x_t

    Args:
      layer_fn: ``(params_l, carry_l, x_t) -> (carry_l, y_t)``, ``y_t`` shaped like ``x_t``.
      stacked_params: pytree of ``[L, ...]`` leaves (layer ``l``'s params at index ``l``).
      init_carry: pytree of ``[L, B, ...]`` leaves, each layer's initial carry.
      xs: pytree of time-major ``[T, B, ...]`` leaves, the bottom layer's inputs.

    Returns:
      ``(ys, carries)``: the top layer's outputs ``[T, B, ...]`` and every layer's final carry ``[L, B, ...]``.

    >>> def cell(w, h, x):
    ...     h = jnp.tanh(w * h + x)
    ...     return h, h
    >>> ys, hs = stacked_scan(cell, jnp.ones((3, 1)), jnp.zeros((3, 1)), jnp.ones((5, 1)))
    >>> ys.shape, hs.shape
    ((5, 1), (3, 1))
    """
    _check(stacked_params, init_carry, xs)

    def layer(inputs, params_and_carry):
        params, carry = params_and_carry
        carry, ys = _run_layer(layer_fn, params, carry, inputs)
        return ys, carry

    return lax.scan(layer, xs, (stacked_params, init_carry))


def _stage_mesh(mesh, stage_axis: str, batch_axis: str | None):
    """The mesh to pipeline over (``mesh=`` or the ambient one), checked to have the named axes."""
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            raise ValueError(
                "pipelined_stack needs a mesh: call it under `with jax.set_mesh(mesh):` or pass mesh="
            )
    for axis in (stage_axis, batch_axis):
        if axis is not None and axis not in mesh.axis_names:
            raise ValueError(f"mesh axis {axis!r} not in the mesh's axes {tuple(mesh.axis_names)}")
    return mesh


def pipelined_stack(
    layer_fn: LayerFn,
    stacked_params,
    init_carry,
    xs,
    *,
    stage_axis: str = "stage",
    batch_axis: str | None = None,
    mesh: Mesh | jax.sharding.AbstractMesh | None = None,
):
    """:func:`stacked_scan` as GNMT's pipeline: layer groups on the ``stage_axis`` devices, a wavefront in time.

    With ``S`` = the size of ``stage_axis``, device ``s`` holds layers ``s·L/S … (s+1)·L/S - 1``; at tick ``t``
    (``0 ≤ t < T + S - 1``) it runs them on time step ``t - s`` (when ``0 ≤ t - s < T``; a bubble otherwise:
    computed on stale or zero inputs and discarded) and sends the output to ``s + 1`` by ``lax.ppermute``. The top
    outputs are broadcast from the last stage with a ``psum``. Wu et al. (2016), *Google's Neural Machine
    Translation System*, §3.

    Args:
      layer_fn: ``(params_l, carry_l, x_t) -> (carry_l, y_t)``, ``y_t`` shaped like ``x_t``; it must be finite
        on zero inputs (the bubbles).
      stacked_params: pytree of ``[L, ...]`` leaves; ``L`` a multiple of ``S``.
      init_carry: pytree of ``[L, B, ...]`` leaves.
      xs: pytree of time-major ``[T, B, ...]`` leaves.
      stage_axis: the mesh axis whose devices are the stages.
      batch_axis: a mesh axis to split ``B`` over as well (data × pipeline), or None.
      mesh: the mesh (default: the ambient one, ``with jax.set_mesh(mesh):``).

    Returns:
      ``(ys [T, B, ...], carries [L, B, ...])``, equal to :func:`stacked_scan`'s.

    Raises:
      ValueError: no mesh, an axis missing from it, ``L`` not a multiple of ``S``, ``B`` not a multiple of the
        batch axis' size, or leaves with mismatched leading sizes.
    """
    num_layers, num_steps = _check(stacked_params, init_carry, xs)
    mesh = _stage_mesh(mesh, stage_axis, batch_axis)
    stages = mesh.shape[stage_axis]
    if num_layers % stages:
        raise ValueError(
            f"{num_layers} layers cannot be split into {stages} pipeline stages (mesh axis {stage_axis!r})"
        )
    if batch_axis is not None:
        batch = _leading(jax.tree.map(lambda x: x[0], xs), "xs [T, B, ...]")
        if batch % mesh.shape[batch_axis]:
            raise ValueError(
                f"batch {batch} is not a multiple of mesh axis {batch_axis!r} (size {mesh.shape[batch_axis]})"
            )
    if stages == 1:  # nothing to pipeline; a batch split, if any, is left to the compiler (Auto axes)
        return stacked_scan(layer_fn, stacked_params, init_carry, xs)

    def stage(params, carry, inputs):
        """One device's share: ``params``/``carry`` hold its ``L/S`` layers, ``inputs`` all ``T`` steps."""
        index = lax.axis_index(stage_axis)
        first, last = index == 0, index == stages - 1
        # Stage 0 reads x_t at tick t; the S - 1 ticks after the last step only drain the pipeline.
        padded = jax.tree.map(lambda x: jnp.concatenate([x, jnp.zeros_like(x[: stages - 1])]), inputs)
        # What stage s - 1 sent at the previous tick; it differs per stage, which the scan's carry type must say.
        received = jax.tree.map(
            lambda x: lax.pcast(jnp.zeros_like(x[0]), (stage_axis,), to="varying"), inputs
        )
        ring = [(s, s + 1) for s in range(stages - 1)]

        def local_layers(x, params_and_carry):
            layer_params, layer_carry = params_and_carry
            layer_carry, y = layer_fn(layer_params, layer_carry, x)
            return y, layer_carry

        def tick(state, scanned):
            carry, received = state
            t, x_t = scanned
            valid = (t >= index) & (t - index < num_steps)
            x = jax.tree.map(lambda a, b: jnp.where(first, a, b), x_t, received)
            y, new_carry = lax.scan(local_layers, x, (params, carry))
            carry = jax.tree.map(lambda new, old: jnp.where(valid, new, old), new_carry, carry)
            received = jax.tree.map(lambda v: lax.ppermute(v, stage_axis, ring), y)
            return (carry, received), y

        ticks = jnp.arange(num_steps + stages - 1)
        (carry, _), ys = lax.scan(tick, (carry, received), (ticks, padded))
        # The last stage emits step t - (S - 1) at tick t; broadcast its outputs to every stage.
        ys = jax.tree.map(lambda y: lax.psum(jnp.where(last, y[stages - 1 :], 0), stage_axis), ys)
        return ys, carry

    carry_spec = P(stage_axis, batch_axis)
    io_spec = P(None, batch_axis)
    axis_names = {stage_axis} | ({batch_axis} if batch_axis is not None else set())
    sharded = jax.shard_map(
        stage,
        mesh=mesh,
        in_specs=(P(stage_axis), carry_spec, io_spec),
        out_specs=(io_spec, carry_spec),
        axis_names=axis_names,
    )
    return sharded(stacked_params, init_carry, xs)
