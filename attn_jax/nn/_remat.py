"""Activation rematerialisation of a scan's body: the ``jax.checkpoint`` policies that ``model.remat`` names."""

import jax

# What a checkpointed body keeps for the backward pass; ``None`` keeps nothing but the body's inputs.
REMAT_POLICIES = {
    "none": None,
    "full": None,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def remat_scan_body(fn, remat: str):
    """``fn`` (the body of a scan over layers or over time) under ``jax.checkpoint`` with policy ``remat``.

    The backward pass then recomputes what the policy does not keep, one iteration at a time, instead of
    storing it for every iteration. ``"none"`` returns ``fn``. ``prevent_cse=False``: inside a scan,
    common-subexpression elimination cannot undo the recomputation.
    """
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat must be one of {', '.join(REMAT_POLICIES)}; got {remat!r}")
    if remat == "none":
        return fn
    return jax.checkpoint(fn, policy=REMAT_POLICIES[remat], prevent_cse=False)
