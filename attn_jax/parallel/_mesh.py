"""The device mesh: three named axes, ``data`` × ``model`` × ``stage``, all compiler-partitioned (``Auto``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

__all__ = ["MESH_AXES", "make_mesh"]

MESH_AXES: tuple[str, str, str] = ("data", "model", "stage")
"""The mesh's axis names: ``data`` splits the batch, ``model`` splits weights (tensor parallelism), ``stage``
splits a stack of layers into pipeline stages."""


def make_mesh(
    data: int = 1, model: int = 1, stage: int = 1, *, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A ``data × model × stage`` device mesh whose axes are all ``AxisType.Auto``.

    ``Auto`` axes leave the partitioning of everything not pinned by an input/output sharding to the compiler
    (GSPMD/Shardy propagation): the train step only names the shardings of the state and the batch (MaxText's and
    the Flax examples' style), and :func:`~attn_jax.parallel.pipelined_stack` goes manual over the axes it names.
    Devices are laid out by ``jax.make_mesh`` (which orders them so that the last axis is the fastest-connected).

    Args:
      data: size of the ``data`` axis (batch split).
      model: size of the ``model`` axis (weight split).
      stage: size of the ``stage`` axis (pipeline stages).
      devices: the devices to use, exactly ``data · model · stage`` of them; default all of ``jax.devices()``.

    Returns:
      A ``jax.sharding.Mesh`` with axis names ``("data", "model", "stage")``.

    Raises:
      ValueError: a size is not a positive int, or the product of the sizes differs from the number of devices.

    >>> mesh = make_mesh(data=2, devices=jax.devices()[:2])
    >>> dict(mesh.shape)
    {'data': 2, 'model': 1, 'stage': 1}
    """
    sizes = {"data": data, "model": model, "stage": stage}
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"mesh axis {name!r} must have a positive int size, got {size!r}")
    given = devices is not None
    devices = list(devices) if given else jax.devices()
    product = math.prod(sizes.values())
    if product != len(devices):
        shape = " × ".join(f"{k}={v}" for k, v in sizes.items())
        raise ValueError(
            f"mesh {shape} needs {product} devices, but {len(devices)} "
            f"{'were given' if given else 'are available'}; "
            "pass devices=jax.devices()[:n] to use a subset"
        )
    return jax.make_mesh(
        (data, model, stage), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
    )
