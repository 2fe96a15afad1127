"""Fully sharded parameters (``parallel.strategy=fsdp``) on 8 fake CPU devices.

A small Transformer whose widths divide by 8 (d=32, d_ff=48, vocabularies 64 and 72) but whose 4 heads do not,
so the rules' fall-through to the next name is exercised. Parameters are drawn from N(0, 0.5²) and Adam has
``eps=1`` (see tests/test_sharded_step.py: the first update is then a smooth function of the gradient). The
fully sharded step must hold 1/8 of the state per device, equal the single-device step, gather each layer's
weights rather than the batch, and checkpoint onto another device count.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from attn_jax.models import GNMTConfig, RNNConfig, TransformerConfig
from attn_jax.parallel import gathered_rules, make_mesh, rules_for, sharding_report
from attn_jax.train import OptimizerConfig, StepConfig, train_step
from attn_jax.train._checkpoint import CheckpointManager
from attn_jax.train._sharded import (
    abstract_sharded_state,
    make_sharded_train_step,
    shard_train_state,
    train_state_shardings,
)
from tests import test_sharded_step as sharded_step
from tests.tolerance import assert_close_f32

D, FF, HEADS, LAYERS = 32, 48, 4, 2
MODEL = TransformerConfig(
    src_vocab=64,
    tgt_vocab=72,
    d_model=D,
    heads=HEADS,
    d_ff=FF,
    encoder_layers=LAYERS,
    decoder_layers=LAYERS,
    dropout=0.0,
    max_length=16,
)
OPTIMIZER = OptimizerConfig(name="adam", learning_rate=0.1, eps=1.0, clip_norm=1.0)
CONFIG = StepConfig(model=MODEL, optimizer=OPTIMIZER)
B, S, T = 8, 7, 6
# The step's longest summation chain, generously: per layer the projections over d, the FFN over d_ff and the
# attention over the keys, forward and backward through every layer, then the loss over B·T tokens and V logits.
STEP_REDUCTION = 2 * (2 * LAYERS) * (4 * D + FF + S + T) + B * T + MODEL.tgt_vocab


def _host(tree):
    return jax.tree.map(np.array, tree)


def _initial(model):
    """test_sharded_step's initial state and batch, with this file's optimizer; the sizes B, S, T agree."""
    assert (B, S, T) == (sharded_step.B, sharded_step.S, sharded_step.T)
    return sharded_step.initial_state_and_batch(model, OPTIMIZER)


@pytest.fixture(scope="module")
def initial():
    return _initial(MODEL)


def _close(got, want):
    """``assert_close_f32`` leaf by leaf, each against the tree's largest entry.

    N(0, 0.5²) weights saturate the attention softmax, whose backward then cancels terms as large as the largest
    gradients down to ~1e-6 (a query bias) or to rounding noise (a key bias, whose gradient is zero in exact
    arithmetic: it adds the same ``q·b`` to every logit of a query). Those terms, not a leaf's own maximum, set
    the scale of its rounding.
    """
    top = max(float(np.max(np.abs(x))) for x in jax.tree.leaves(want))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True):
        assert_close_f32(a, b, reduction=STEP_REDUCTION, scale=top, err_msg=jax.tree_util.keystr(path))


def _device_bytes(tree, device) -> int:
    """Bytes of ``tree``'s shards that live on ``device``, read from the arrays themselves."""
    return sum(
        shard.data.nbytes
        for x in jax.tree.leaves(tree)
        for shard in x.addressable_shards
        if shard.device == device
    )


def _all_gather_shapes(hlo: str) -> set[tuple[int, ...]]:
    """Result shapes of every all-gather (its async ``-start`` form too) in HLO text."""
    shapes = set()
    for line in hlo.splitlines():
        match = re.search(r"=\s*(.*?)\sall-gather(?:-start)?\(", line)
        if match:
            shapes |= {
                tuple(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\[([\d,]*)\]", match[1])
            }
    return shapes


def test_fsdp_rules_split_each_parameter_over_data_and_gather_it_whole():
    mesh, rules = make_mesh(data=8), rules_for("fsdp")
    params = train_state_shardings(CONFIG, mesh, rules).params
    # Written out by hand from the rule table: the first name (in table order) whose dim divides by 8 takes data.
    assert params["tgt_embed"].spec == P("data", None)  # [vocab, embed]: the vocabulary first
    assert params["encoder"]["ffn"]["w_1"].spec == P(
        None, None, "data"
    )  # [layers, embed, mlp]: mlp before embed
    assert params["encoder"]["ffn"]["w_2"].spec == P(None, "data", None)  # [layers, mlp, embed]
    # [layers, embed, heads, kv]: 4 heads do not divide by 8, so embed takes data; layers never split.
    assert params["decoder"]["self_attention"]["query"]["kernel"].spec == P(None, "data", None, None)
    assert params["decoder"]["self_attention"]["out"]["kernel"].spec == P(None, None, None, "data")
    # While a layer runs its weights are whole; under fsdp+tensor whole but for the model split.
    assert dict(gathered_rules(rules_for("fsdp")))["mlp"] is None
    assert dict(gathered_rules(rules_for("fsdp+tensor")))["mlp"] == "model"
    assert gathered_rules(rules_for("data+tensor")) == rules_for("data+tensor")


def test_fsdp_holds_an_eighth_of_the_train_state_per_device(initial):
    state = initial[0]
    total = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))
    mesh = make_mesh(data=8)
    fsdp = shard_train_state(state, CONFIG, mesh, rules_for("fsdp"))
    data = shard_train_state(state, CONFIG, mesh, rules_for("data"))
    scalars = (
        sum(np.asarray(x).nbytes for x in jax.tree.leaves(state) if np.ndim(x) == 0) + 8
    )  # step, counts, key
    for device in mesh.devices.flat:
        assert _device_bytes(data, device) == total  # every device holds all of it
        assert _device_bytes(fsdp, device) <= total / 8 + scalars, (
            device,
            _device_bytes(fsdp, device),
            total,
        )
    # The report the trainer logs agrees with the arrays.
    rules = rules_for("fsdp")
    report = sharding_report(
        abstract_sharded_state(CONFIG, mesh, rules), train_state_shardings(CONFIG, mesh, rules)
    )
    assert report.total_bytes == total and report.device_bytes == _device_bytes(fsdp, mesh.devices.flat[0])
    assert report.replicated_paths == (".step", ".opt_state[1][0].count", ".opt_state[1][1].count", ".rng")


@pytest.mark.parametrize(
    "strategy,mesh_shape", [("fsdp", dict(data=8)), ("fsdp+tensor", dict(data=4, model=2))]
)
def test_fsdp_step_equals_the_single_device_step_and_gathers_weights_not_the_batch(
    initial, strategy, mesh_shape
):
    state, batch = initial
    want, want_metrics = _host(train_step(jax.tree.map(jnp.array, state), batch, CONFIG))
    want_two = _host(train_step(jax.tree.map(jnp.array, want), batch, CONFIG)[0])
    mesh, rules = make_mesh(**mesh_shape), rules_for(strategy)
    sharded = shard_train_state(state, CONFIG, mesh, rules)
    compiled = make_sharded_train_step(CONFIG, mesh, rules).lower(sharded, batch).compile()
    got, metrics = compiled(sharded, batch)

    assert_close_f32(_host(metrics), want_metrics, reduction=STEP_REDUCTION)
    b1 = OPTIMIZER.b1
    grads = jax.tree.map(lambda mu: np.asarray(mu) / (1 - b1), got.opt_state[1][0].mu)
    want_grads = jax.tree.map(lambda mu: np.asarray(mu) / (1 - b1), want.opt_state[1][0].mu)
    _close(grads, want_grads)
    assert max(float(np.max(np.abs(g))) for g in jax.tree.leaves(want_grads)) > 1e-2  # not a vacuous check
    delta = jax.tree.map(lambda a, b: np.asarray(a) - b, got.params, state.params)
    _close(delta, jax.tree.map(lambda a, b: np.asarray(a) - b, want.params, state.params))
    # The state stays sharded (Adam's moments like their parameters) and feeds the next step as is.
    spec = train_state_shardings(CONFIG, mesh, rules).params["encoder"]["ffn"]["w_1"].spec
    assert got.params["encoder"]["ffn"]["w_1"].sharding.spec == spec
    assert got.opt_state[1][0].nu["encoder"]["ffn"]["w_1"].sharding.spec == spec
    got_two, _ = compiled(got, batch)
    _close(_host(got_two.params), want_two.params)

    # Each scanned layer all-gathers its own FFN weight (one layer, not the stack) ...
    gathered = _all_gather_shapes(compiled.as_text())
    ffn = (D, FF // mesh.shape["model"])
    assert {ffn, (1, *ffn)} & gathered, sorted(gathered)
    # ... and never the batch of attention weights [B, H, T, S], which a compiler left to itself gathers instead.
    heads = HEADS // mesh.shape["model"]
    attention = {(B, heads, t, s) for t in (S, T) for s in (S, T)}
    assert not attention & gathered, sorted(attention & gathered)


def test_fsdp_step_of_an_rnn_model_equals_the_single_device_step():
    model = RNNConfig(src_vocab=24, tgt_vocab=32, embed=8, hidden=16, maxout=8, align=16)
    config = StepConfig(model=model, optimizer=OPTIMIZER)
    state, batch = _initial(model)
    want, _ = train_step(jax.tree.map(jnp.array, state), batch, config)
    mesh, rules = make_mesh(data=8), rules_for("fsdp")
    report = sharding_report(
        abstract_sharded_state(config, mesh, rules), train_state_shardings(config, mesh, rules)
    )
    assert report.device_bytes < report.total_bytes / 4  # most of it split (widths that divide by 8)
    got, _ = make_sharded_train_step(config, mesh, rules)(
        shard_train_state(state, config, mesh, rules), batch
    )
    reduction = 2 * (S * 24 + T * 80) + B * T + model.tgt_vocab
    assert_close_f32(_host(got.params), _host(want.params), reduction=reduction)


def test_fsdp_step_of_gnmt_gathers_each_stacked_layer_and_equals_the_single_device_step():
    """GNMT's uniform LSTM stacks run as a scan over layers: under fsdp each layer all-gathers its own slice
    of the stacked weights ``[n, 4, n]``, never the whole ``[L, n, 4, n]`` stack, and the step is unchanged."""
    model = GNMTConfig(
        src_vocab=24, tgt_vocab=32, embed=16, hidden=16, align=16, encoder_layers=4, decoder_layers=4
    )
    config = StepConfig(model=model, optimizer=OPTIMIZER)
    state, batch = _initial(model)
    want, _ = train_step(jax.tree.map(jnp.array, state), batch, config)
    mesh, rules = make_mesh(data=8), rules_for("fsdp")
    sharded = shard_train_state(state, config, mesh, rules)
    compiled = make_sharded_train_step(config, mesh, rules).lower(sharded, batch).compile()
    got, _ = compiled(sharded, batch)
    n, depth = model.hidden, model.encoder_stack_layers
    gathered = _all_gather_shapes(compiled.as_text())
    assert {(n, 4, n), (1, n, 4, n)} & gathered, sorted(gathered)
    assert (depth, n, 4, n) not in gathered, sorted(gathered)
    reduction = 2 * (S * 64 + T * 160) + B * T + model.tgt_vocab
    assert_close_f32(_host(got.params), _host(want.params), reduction=reduction)


@pytest.mark.slow  # orbax saves a sharded state array by array
def test_fsdp_checkpoint_restores_bit_exactly_on_another_device_count(initial, tmp_path):
    state, batch = initial
    manager = CheckpointManager(tmp_path, async_save=False, keep_best=False)
    manager.save(1, shard_train_state(state, CONFIG, make_mesh(data=8), rules_for("fsdp")), {}, {})
    manager.wait()
    for mesh_shape, strategy in ((dict(data=4), "fsdp"), (dict(data=2), "data")):
        mesh = make_mesh(**mesh_shape, devices=jax.devices()[: mesh_shape["data"]])
        rules = rules_for(strategy)
        restored = manager.restore(1, abstract_sharded_state(CONFIG, mesh, rules)).state
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), restored, state)
        shardings = jax.tree.leaves(train_state_shardings(CONFIG, mesh, rules))
        for x, s in zip(jax.tree.leaves(restored), shardings, strict=True):
            assert x.sharding.is_equivalent_to(s, np.ndim(x)), (x.sharding, s)
    manager.close()
    assert restored.params["tgt_embed"].sharding.spec == P(None, None)  # the data strategy replicates it


@pytest.mark.parametrize(
    "strategy,message",
    [
        ("fsdp+data", "fsdp already splits the batch over data"),
        ("fsdp+pipeline", "fsdp does not combine with pipeline"),
    ],
)
def test_fsdp_combinations_that_cannot_work_are_one_line_errors(strategy, message):
    with pytest.raises(ValueError, match=message):
        rules_for(strategy)
