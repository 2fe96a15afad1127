"""The device mesh and the logical-axis rules (attn_jax.parallel), on the 8 fake CPU devices of conftest."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from attn_jax.models import RNNConfig, build_model
from attn_jax.parallel import (
    DEFAULT_RULES,
    LOGICAL_AXES,
    STRATEGIES,
    UnknownStrategyError,
    _mesh,
    _rules,
    batch_sharding,
    logical_to_spec,
    make_mesh,
    param_shardings,
    rules_for,
    shard_state,
)

# --------------------------------------------------------------------------------------------------- mesh


def test_make_mesh_axes_sizes_and_types():
    mesh = make_mesh(data=2, model=2, stage=2)
    assert mesh.axis_names == ("data", "model", "stage")
    assert dict(mesh.shape) == {"data": 2, "model": 2, "stage": 2}
    assert mesh.axis_types == (AxisType.Auto,) * 3
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())


def test_make_mesh_on_a_subset_of_devices():
    devices = jax.devices()[2:5]
    mesh = make_mesh(model=3, devices=devices)
    assert dict(mesh.shape) == {"data": 1, "model": 3, "stage": 1}
    assert {d.id for d in mesh.devices.flat} == {d.id for d in devices}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(data=3), r"needs 3 devices, but 8 are available"),
        (dict(data=2, model=2, stage=4), r"needs 16 devices, but 8 are available"),
        (dict(data=2, devices=jax.devices()[:4]), r"needs 2 devices, but 4 were given"),
        (dict(data=0), r"'data' must have a positive int size"),
        (dict(model=2.0), r"'model' must have a positive int size"),
    ],
)
def test_make_mesh_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_mesh(**kwargs)


# --------------------------------------------------------------------------------------------------- rules


def test_rule_table_covers_the_models_names_and_presets_split_one_strategy_each():
    assert set(LOGICAL_AXES) >= {"batch", "vocab", "hidden", "hidden_in", "embed", "context", "align", "mlp"}
    assert set(LOGICAL_AXES) >= {"layers", "heads", "kv"}
    for strategy in STRATEGIES:
        rules = rules_for(strategy)
        assert [name for name, _ in rules] == list(LOGICAL_AXES)  # same names, same priority order
    mapped = {s: {n: a for n, a in rules_for(s) if a is not None} for s in STRATEGIES}
    assert mapped["data"] == {"batch": "data"}
    assert mapped["pipeline"] == {"layers": "stage"}
    assert mapped["tensor"] == {n: "model" for n in ("vocab", "heads", "align", "mlp", "hidden")}
    assert mapped["data+tensor"] == {**mapped["data"], **mapped["tensor"]}
    assert mapped["data+pipeline"] == {**mapped["data"], **mapped["pipeline"]}
    assert dict(DEFAULT_RULES) == dict(rules_for("tensor+data+pipeline"))


@pytest.mark.parametrize("strategy", ["model", "data+data", "", "data,tensor", None])
def test_rules_for_rejects_unknown_strategies(strategy):
    with pytest.raises(UnknownStrategyError, match="unknown parallelism strategy"):
        rules_for(strategy)


@pytest.mark.parametrize("strategy", ["fsdp+data", "fsdp+pipeline"])
def test_known_parts_that_do_not_combine_are_not_unknown(strategy):
    """The trainer lists the valid names only for an unknown strategy; this one's reason is passed on."""
    with pytest.raises(ValueError, match="fsdp") as raised:
        rules_for(strategy)
    assert not isinstance(raised.value, UnknownStrategyError)


TENSOR = rules_for("tensor")


@pytest.mark.parametrize(
    ("names", "rules", "spec"),
    [
        # A mesh axis is used once; the table's order (not the dims' order) decides who gets it.
        (("mlp", "vocab"), TENSOR, P(None, "model")),  # softmax W_o: split over the vocabulary
        (("vocab", "embed"), TENSOR, P("model", None)),  # embedding table
        (("hidden", "align"), TENSOR, P(None, "model")),  # additive attention's W_a
        (("hidden", "mlp", None), TENSOR, P(None, "model", None)),  # deep output's U_o
        (("hidden_in", None, "hidden"), TENSOR, P(None, None, "model")),  # GRU recurrent kernel U
        (("hidden", "hidden"), TENSOR, P("model", None)),  # the same name twice: the first dim
        (("layers", "hidden_in", None, "hidden"), DEFAULT_RULES, P("stage", None, None, "model")),
        (("batch", "length", "hidden"), DEFAULT_RULES, P("data", None, "model")),
        (("layers", "hidden"), rules_for("data"), P(None, None)),
        ((None, "context"), DEFAULT_RULES, P(None, None)),
        ((), DEFAULT_RULES, P()),
        # Several mesh axes for one name, and a fallback rule for the same name.
        (("vocab",), (("vocab", ("data", "model")), ("vocab", "model")), P(("data", "model"))),
        (
            ("embed", "vocab"),
            (("embed", "model"), ("vocab", ("data", "model")), ("vocab", "data")),
            P("model", "data"),
        ),
    ],
)
def test_logical_to_spec_without_a_mesh(names, rules, spec):
    assert logical_to_spec(names, rules) == spec


def test_logical_to_spec_drops_axes_missing_from_or_trivial_in_the_mesh():
    mesh = make_mesh(data=8)  # model and stage have size 1
    assert logical_to_spec(("batch", "vocab", "layers"), DEFAULT_RULES, mesh=mesh) == P("data", None, None)
    assert logical_to_spec(("vocab",), (("vocab", "expert"),), mesh=mesh) == P(None)
    # A tuple of axes keeps only the non-trivial ones.
    assert logical_to_spec(("vocab",), (("vocab", ("model", "data")),), mesh=mesh) == P("data")
    # The ambient mesh is used when none is passed.
    with jax.set_mesh(make_mesh(model=8)):
        assert logical_to_spec(("batch", "vocab"), DEFAULT_RULES) == P(None, "model")


def test_logical_to_spec_replicates_indivisible_dims_or_raises_when_strict():
    mesh = make_mesh(data=2, model=4)
    rules = rules_for("data+tensor")
    assert logical_to_spec(("vocab", "embed"), rules, mesh=mesh, shape=(20, 5)) == P("model", None)
    assert logical_to_spec(("vocab", "embed"), rules, mesh=mesh, shape=(30, 5)) == P(None, None)
    # An indivisible dim frees the axis for a later dim of the same parameter.
    assert logical_to_spec(("mlp", "hidden"), rules, mesh=mesh, shape=(6, 8)) == P(None, "model")
    # A fallback rule for the same name is tried: 12 is not a multiple of 8 but is of 4.
    fallback = (("vocab", ("data", "model")), ("vocab", "model"))
    assert logical_to_spec(("vocab",), fallback, mesh=mesh, shape=(16,)) == P(("data", "model"))
    assert logical_to_spec(("vocab",), fallback, mesh=mesh, shape=(12,)) == P("model")
    with pytest.raises(
        ValueError, match=r"dim 0 \('vocab'\) of shape \[30, 5\] is not a multiple of mesh axes"
    ):
        logical_to_spec(("vocab", "embed"), rules, mesh=mesh, shape=(30, 5), strict=True)


def test_logical_to_spec_errors():
    with pytest.raises(ValueError, match=r"logical axis names \['lenght'\] .* have no rule"):
        logical_to_spec(("batch", "lenght"), DEFAULT_RULES)
    with pytest.raises(ValueError, match=r"2 logical names .* for an array of shape \[3\]"):
        logical_to_spec(("vocab", "embed"), DEFAULT_RULES, mesh=make_mesh(data=8), shape=(3,))
    with pytest.raises(ValueError, match="rules must be a tuple"):
        logical_to_spec(("vocab",), "tensor")


# ------------------------------------------------------------------------------------------ param shardings

MODEL = RNNConfig(src_vocab=20, tgt_vocab=24, embed=5, hidden=8, maxout=6, align=12)


@pytest.fixture(scope="module")
def abstract_params():
    abstract = nnx.eval_shape(lambda: build_model(MODEL, rngs=nnx.Rngs(0)))
    return nnx.state(abstract, nnx.Param)


def _specs(shardings):
    return jax.tree.map(lambda s: s.spec, shardings, is_leaf=lambda x: isinstance(x, NamedSharding))


def test_param_shardings_of_rnnsearch_follow_the_rules(abstract_params):
    mesh = make_mesh(data=2, model=4)
    shardings = param_shardings(abstract_params, mesh, rules_for("data+tensor"))
    assert isinstance(shardings, dict)  # the structure of TrainState.params (nnx.to_pure_dict)
    assert jax.tree.structure(_specs(shardings)) == jax.tree.structure(nnx.to_pure_dict(abstract_params))
    assert all(s.mesh == mesh for s in jax.tree.leaves(shardings))
    specs = _specs(shardings)
    assert specs["src_embed"]["embedding"] == P("model", None)
    assert specs["tgt_embed"]["embedding"] == P("model", None)
    out = specs["output"]["params"]
    assert out["w_o"] == P(None, "model") and out["b_w"] == P("model")
    # maxout l=6 is not a multiple of model=4: mlp is replicated and U_o's hidden input dim takes the axis.
    assert out["u_o"] == P("model", None, None) and out["c_o"] == P(None, None, None)
    assert specs["attention"]["params"]["w_q"] == P(None, "model")
    assert specs["attention"]["params"]["w_k"] == P(None, "model")
    assert specs["decoder"]["params"]["u"] == P(None, None, "model")
    assert specs["init_state"]["w_s"] == P(None, "model")
    # data parallelism only: every parameter replicated.
    data = _specs(param_shardings(abstract_params, mesh, rules_for("data")))
    assert all(
        all(axis is None for axis in spec)
        for spec in jax.tree.leaves(data, is_leaf=lambda x: isinstance(x, P))
    )


def test_param_shardings_replicates_unnamed_variables_and_plain_arrays():
    mesh = make_mesh(model=2, devices=jax.devices()[:2])
    tree = {
        "named": nnx.Param(jnp.zeros((4, 3)), out_sharding=("vocab", None), eager_sharding=False),
        "bare": nnx.Param(jnp.zeros(4)),
        "array": jnp.zeros(4),
    }
    specs = _specs(param_shardings(tree, mesh, rules_for("tensor")))
    assert specs == {"named": P("model", None), "bare": P(), "array": P()}


def test_batch_sharding_and_shard_state():
    mesh = make_mesh(data=4, model=2)
    assert batch_sharding(mesh, rules_for("data+tensor")).spec == P("data")
    assert batch_sharding(mesh, rules_for("tensor")).spec == P(None)
    state = {"w": np.arange(24.0, dtype=np.float32).reshape(8, 3), "s": np.float32(2.0)}
    placed = shard_state(state, {"w": NamedSharding(mesh, P("data")), "s": NamedSharding(mesh, P())})
    assert placed["w"].sharding.spec == P("data")
    assert {s.data.shape for s in placed["w"].addressable_shards} == {(2, 3)}
    np.testing.assert_array_equal(placed["w"], state["w"])


@pytest.mark.parametrize("module", [_mesh, _rules], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
