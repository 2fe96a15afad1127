"""Every program the library builds lowers for CUDA and TPU, checked on a CPU-only machine.

``jax.export.export(jax.jit(f), platforms=("cuda", "tpu"))(*shape_dtype_structs)`` traces ``f`` and lowers it to
StableHLO for both accelerators at once, without a device of either kind and without compiling. A program that
lowers on the CPU can still fail here: an operation with no CUDA or TPU lowering rule, a CPU-only custom call, a
host callback, a custom call without JAX's export-compatibility guarantee, or a sharding that does not lower.
Each of those raises, and the test fails.

Covered: ``dot_product_attention`` with ``implementation="xla"`` and ``"chunked"`` (padding as lengths, a mask,
causal, grouped-query heads, a sliding window, bfloat16) and the default, the cuDNN path with sequence lengths
(CUDA only: see its test), the Pallas kernel for CUDA and for TPU (one at a time: see its test), additive
attention fused and plain; the train step and the validation (eval) step of
RNNenc, RNNsearch, GNMT and the Transformer on one device; a sharded train step of each on the 8 fake CPU
devices (tests/conftest.py), which together cover the ``data`` and ``data+tensor`` rules and GNMT's
``data+pipeline`` layer pipeline; beam search of each, greedy decoding once. Forward and backward passes, at
tiny sizes; nothing is compiled. The list, for users: docs/performance.md, "Lowered for GPU and TPU in the tests".
"""

import functools
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from jax._src import lib as jax_lib
from jax._src.cudnn import fused_attention_stablehlo

import attn_jax.attention._cudnn as cudnn_module
from attn_jax.attention import additive_attention, dot_product_attention, init_additive_params
from attn_jax.data import Batch
from attn_jax.decoding import beam_search, greedy_decode
from attn_jax.models import GNMTConfig, RNNConfig, TransformerConfig
from attn_jax.parallel import batch_sharding, make_mesh, replicated, rules_for
from attn_jax.train import OptimizerConfig, StepConfig, eval_step, init_train_state, train_step
from attn_jax.train import _step as step_module
from attn_jax.train._sharded import abstract_sharded_state, make_sharded_train_step, train_state_shardings

PLATFORMS = ("cuda", "tpu")

# Odd, distinct sizes: B=3 sentences (8 in the train steps, to split over data=8), H=4 heads, T=5, S=7, K=8.
B, H, T, S, K = 3, 4, 5, 7, 8


def _export(fn, *args, platforms=PLATFORMS, **kwargs):
    """``jax.export`` of ``jax.jit(fn)`` (or of an already jitted ``fn``) for ``platforms``, at ``args``' shapes."""
    jitted = fn if hasattr(fn, "trace") else jax.jit(fn)
    exported = export.export(jitted, platforms=platforms, **kwargs)(*args)
    assert exported.platforms == platforms
    return exported


def _sds(shape, dtype=jnp.float32, sharding=None):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _value_and_grads(attention):
    """``(q, k, v) -> (Σ attention(q, k, v), its gradients)``: the forward and the backward pass in one program."""

    def loss(q, k, v):
        return jnp.sum(attention(q, k, v).astype(jnp.float32))

    return jax.value_and_grad(loss, argnums=(0, 1, 2))


# ------------------------------------------------------------------------------------------- attention kernels

Q_LENGTHS = np.array([[5], [2], [4]])  # [B, 1]: per sentence, shared by the heads
K_LENGTHS = np.array([[7], [3], [0]])  # sentence 2 has no key at all
MASK = np.arange(S)[None, None, None, :] < K_LENGTHS[:, :, None, None]  # [B, 1, 1, S]

ATTENTION_CASES = {
    "xla, lengths": dict(implementation="xla", query_lengths=Q_LENGTHS, key_lengths=K_LENGTHS),
    "xla, mask, causal": dict(implementation="xla", mask=MASK, causal=True),
    "xla, window": dict(implementation="xla", local_window=(2, 1), key_lengths=K_LENGTHS),
    "xla, gqa": dict(implementation="xla", num_kv_heads=2, key_lengths=K_LENGTHS),
    "xla, bfloat16": dict(implementation="xla", key_lengths=K_LENGTHS, causal=True, dtype=jnp.bfloat16),
    "chunked, lengths, causal": dict(
        implementation="chunked", query_lengths=Q_LENGTHS, key_lengths=K_LENGTHS, causal=True
    ),
    # one case for the rest: each chunked trace stages both batch loops (see the next test)
    "chunked, mask, window, gqa": dict(
        implementation="chunked", mask=MASK, local_window=(2, 1), num_kv_heads=2
    ),
    "default": dict(key_lengths=K_LENGTHS),
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_dot_product_attention_lowers(case):
    options = dict(ATTENTION_CASES[case])
    dtype = options.pop("dtype", jnp.float32)
    mask = options.pop("mask", None)
    kv_heads = options.get("num_kv_heads", H)
    fn = _value_and_grads(lambda q, k, v: dot_product_attention(q, k, v, mask, **options))
    _export(fn, _sds((B, H, T, K), dtype), _sds((B, kv_heads, S, K), dtype), _sds((B, kv_heads, S, K), dtype))


def test_chunked_kernel_loops_over_the_batch_on_the_cpu_only():
    # The blocked kernel's (batch, head) axes are a lax.map on the CPU (cache-sized blocks) and vmapped on
    # accelerators. The choice belongs to the platform the program is lowered for, not to the machine that
    # traces it: exported here for CUDA or TPU it must not keep the CPU's extra loop.
    fn = _value_and_grads(
        lambda q, k, v: dot_product_attention(q, k, v, implementation="chunked", causal=True)
    )

    def loops(platform, *batch):  # while loops in the program: the block loops, and the batch loops if any
        args = (_sds((*batch, T, K)), _sds((*batch, S, K)), _sds((*batch, S, K)))
        return _export(fn, *args, platforms=(platform,)).mlir_module().count("stablehlo.while")

    single = loops("cpu")  # one [T, K] query: no batch axis to loop over
    assert loops("cuda", B, H) == loops("tpu", B, H) == single
    assert loops("cpu", B, H) > single


# implementation="pallas" is one Pallas kernel source with a Triton lowering (CUDA) and a Mosaic one (TPU), picked
# by lax.platform_dependent. Each export names one platform: JAX lowers every kept platform_dependent branch for
# every platform of the module, so an export for ("cuda", "tpu") at once lowers the Triton kernel for the TPU
# (the last test here). jax.export refuses Triton's custom call (Triton IR has no compatibility guarantee), so
# its check is disabled. Lowering builds each kernel's IR without a device: Triton compiles that IR to PTX, and
# Mosaic to TPU code, inside XLA on the device, which `make gpu-check` does on a GPU.
PALLAS_TARGETS = {"cuda": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}
PALLAS_CASES = {
    "lengths, causal": dict(query_lengths=Q_LENGTHS, key_lengths=K_LENGTHS, causal=True),
    "window, gqa, bfloat16": dict(
        local_window=(2, 1), num_kv_heads=2, key_lengths=K_LENGTHS, dtype=jnp.bfloat16
    ),
}


def _pallas_export(options, platforms):
    options = dict(options)
    dtype = options.pop("dtype", jnp.float32)
    kv_heads = options.get("num_kv_heads", H)
    fn = _value_and_grads(lambda q, k, v: dot_product_attention(q, k, v, implementation="pallas", **options))
    args = (_sds((B, H, T, K), dtype), _sds((B, kv_heads, S, K), dtype), _sds((B, kv_heads, S, K), dtype))
    checks = [export.DisabledSafetyCheck.custom_call(PALLAS_TARGETS["cuda"])]
    return _export(fn, *args, platforms=platforms, disabled_checks=checks)


@pytest.mark.parametrize("platform", list(PALLAS_TARGETS))
@pytest.mark.parametrize("case", list(PALLAS_CASES))
def test_pallas_path_lowers(case, platform):
    text = _pallas_export(PALLAS_CASES[case], (platform,)).mlir_module()
    # three kernels: the forward, then dK/dV and dQ; no other platform's kernel, no interpreter loop
    calls = re.findall(r"stablehlo\.custom_call @([\w$.]+)\(", text)
    assert calls.count(PALLAS_TARGETS[platform]) == 3, calls
    assert not set(calls) & (set(PALLAS_TARGETS.values()) - {PALLAS_TARGETS[platform]})
    assert "stablehlo.while" not in text


def test_pallas_path_lowers_for_one_accelerator_at_a_time():
    # The limit named above. JAX 0.10 refuses Triton's compiler params in the TPU lowering: a ValueError once
    # a CUDA lowering has registered them, an AssertionError before. When this starts to pass, export the
    # Pallas cases for PLATFORMS at once.
    with pytest.raises(
        (ValueError, AssertionError), match="^$|Compiler params for platform gpu cannot be used"
    ):
        _pallas_export(PALLAS_CASES["lengths, causal"], PLATFORMS)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
def test_additive_attention_lowers(fused):
    params = jax.eval_shape(lambda: init_additive_params(jax.random.key(0), 6, K, 10))

    def loss(params, query, keys):
        context = additive_attention(params, query, keys, mask=MASK[:, 0], fused=fused)
        return jnp.sum(context)

    _export(jax.value_and_grad(loss, argnums=(0, 1, 2)), params, _sds((B, T, 6)), _sds((B, S, K)))


# cuDNN flash attention is a CUDA custom call: it has no TPU lowering, and three checks that need a CUDA machine
# stand before it at trace time. Faked here, each for the reason given:
# 1. ours (attention/_cudnn.py): implementation="cudnn" refuses unless JAX's default backend is a CUDA GPU, whose
#    compute capability sets the largest head width (128, or 256 from Hopper on);
# 2. JAX's: jax.nn.dot_product_attention(implementation="cudnn") reads the cuDNN version at trace time
#    (jax._src.cudnn.fused_attention_stablehlo.check_cudnn_version), which raises "cuDNN is not detected."
#    without a JAX CUDA plugin (jax-cuda12-plugin) installed;
# 3. jax.export's: it refuses custom calls outside its list of targets with a compatibility guarantee, and cuDNN's
#    fused attention (__cudnn$fmha...) is not on it (a serialized program is tied to the cuDNN it was made for).
# `make gpu-check` (experiments/benchmarks/gpu_check.py) runs this path unfaked on a GPU: the `gpu` tests of
# tests/test_cudnn_lengths.py and the cuDNN rows of its attention section.
CUDNN_TARGETS = ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward")


@pytest.fixture
def fake_cuda(monkeypatch):
    """A Hopper GPU for our check, a cuDNN version for JAX's when no CUDA plugin is installed."""
    monkeypatch.setattr(cudnn_module, "_cuda_device", lambda: types.SimpleNamespace(compute_capability="9.0"))
    if jax_lib.cuda_versions is None:
        monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 90800)


@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_path_with_sequence_lengths_lowers_for_cuda(fake_cuda, causal):
    # bfloat16, K a multiple of 8 and even T, S: what cuDNN takes. Padding as lengths reaches it as its own
    # padding mask (sequence lengths), never as a dense [T, S] operand.
    t, s = 6, 10
    lengths = dict(query_lengths=np.array([[6], [3], [4]]), key_lengths=np.array([[10], [5], [0]]))
    fn = _value_and_grads(
        lambda q, k, v: dot_product_attention(q, k, v, implementation="cudnn", causal=causal, **lengths)
    )
    args = (
        _sds((B, H, t, K), jnp.bfloat16),
        _sds((B, 1, s, K), jnp.bfloat16),
        _sds((B, H, s, K), jnp.bfloat16),
    )
    checks = [export.DisabledSafetyCheck.custom_call(target) for target in CUDNN_TARGETS]
    text = _export(fn, *args, platforms=("cuda",), disabled_checks=checks).mlir_module()
    for target in CUDNN_TARGETS:  # the forward and the backward kernel
        assert f"stablehlo.custom_call @{target}(" in text, target
    mask_types = set(re.findall(r"mask_type\\22: \\22(\w+)\\22", text))
    assert mask_types == {"PADDING_CAUSAL" if causal else "PADDING"}, mask_types
    with pytest.raises(NotImplementedError, match="'dot_product_attention_fwd' not found for platform tpu"):
        _export(fn, *args, platforms=("tpu",), disabled_checks=checks)


@pytest.mark.skipif(jax_lib.cuda_versions is not None, reason="a JAX CUDA plugin is installed here")
def test_without_a_cuda_plugin_jax_refuses_to_trace_cudnn(monkeypatch):
    # Check 2 above, as JAX words it: when this starts to pass, drop that fake.
    monkeypatch.setattr(cudnn_module, "_cuda_device", lambda: types.SimpleNamespace(compute_capability="9.0"))
    x = _sds((B, H, 6, K), jnp.bfloat16)
    with pytest.raises(RuntimeError, match=r"^cuDNN is not detected\."):
        _export(
            functools.partial(dot_product_attention, implementation="cudnn"), x, x, x, platforms=("cuda",)
        )


# ------------------------------------------------------------------------------------- train, eval and search

MODELS = {
    "rnnenc": RNNConfig(src_vocab=20, tgt_vocab=24, arch="rnnenc", embed=6, hidden=8, maxout=4, align=10),
    "rnnsearch": RNNConfig(src_vocab=20, tgt_vocab=24, embed=6, hidden=8, maxout=4, align=10),
    # 4 + 4 layers with residuals from layer 3: stacks of 2 layers, which split into 2 pipeline stages
    "gnmt": GNMTConfig(
        src_vocab=20,
        tgt_vocab=24,
        embed=6,
        hidden=8,
        align=10,
        encoder_layers=4,
        decoder_layers=4,
        residual_start=3,
    ),
    # grouped-query attention and dropout (its random bits are part of the program)
    "transformer": TransformerConfig(
        src_vocab=20,
        tgt_vocab=24,
        d_model=16,
        heads=4,
        num_kv_heads=2,
        d_ff=12,
        encoder_layers=1,
        decoder_layers=1,
        dropout=0.1,
        max_length=16,
    ),
}
OPTIMIZER = OptimizerConfig(name="adam", learning_rate=0.1, clip_norm=1.0)
STEP_BATCH = 8  # splits over data=8 and data=4


def _config(arch: str, stages: int = 1) -> StepConfig:
    model = MODELS[arch]
    return StepConfig(
        model=model.replace(pipeline_stages=stages) if stages > 1 else model, optimizer=OPTIMIZER
    )


def _batch(sharding=None) -> Batch:
    def ints(*shape):
        return _sds(shape, jnp.int32, sharding)

    n = STEP_BATCH
    return Batch(
        src=ints(n, S),
        src_len=ints(n),
        tgt_in=ints(n, T),
        tgt_out=ints(n, T),
        tgt_len=ints(n),
        example_id=ints(n),
    )


@functools.cache
def _abstract_state(config: StepConfig):
    return jax.eval_shape(functools.partial(init_train_state, config), jnp.zeros((), jnp.int32))


ARCHS = list(MODELS)


@pytest.mark.parametrize("arch", ARCHS)
def test_train_and_eval_steps_lower(arch):
    config = _config(arch)
    state = _abstract_state(config)
    _export(functools.partial(train_step, config=config), state, _batch())
    _export(functools.partial(eval_step, config=config), state.params, _batch())


def _search(config: StepConfig, beam_size: int):
    """``(params, src, src_mask) -> BeamResult``: the search ``attn-jax translate`` runs, as one function."""

    def search(params, src, src_mask):
        model = step_module.build_module(config.model, params)
        if beam_size == 1:
            return greedy_decode(model, src, src_mask, max_length=9)
        return beam_search(model, src, src_mask, beam_size=beam_size, num_return=2, max_length=9)

    return search


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_search_and_greedy_decoding_lower(arch):
    config = _config(arch)
    params = _abstract_state(config).params
    for beam_size in (4, 1) if arch == "rnnsearch" else (4,):  # greedy is the same search with one beam
        _export(_search(config, beam_size), params, _sds((B, S), jnp.int32), _sds((B, S), jnp.bool_))


# Each architecture on one 8-device layout, and each layout once. Lowering does not partition (the compiler
# does that, for the device it compiles for): a sharded program is the unsharded one with its mesh, the
# shardings of its inputs and outputs, and GNMT's pipeline (a shard_map) written into it.
SHARDED = [  # (architecture, strategy, mesh axes, pipeline stages)
    ("rnnenc", "data", dict(data=8), 1),
    ("rnnsearch", "data+tensor", dict(data=4, model=2), 1),
    ("transformer", "data+tensor", dict(data=4, model=2), 1),
    ("gnmt", "data+pipeline", dict(data=4, stage=2), 2),
]


@pytest.mark.parametrize(
    ("arch", "strategy", "axes", "stages"), SHARDED, ids=[f"{c[0]}-{c[1]}" for c in SHARDED]
)
def test_sharded_train_step_lowers(arch, strategy, axes, stages):
    config, rules = _config(arch, stages), rules_for(strategy)
    mesh = make_mesh(**axes, devices=jax.devices()[:8])
    step_module._graphdef(config.model)  # outside the mesh context (see make_sharded_train_step)
    step = make_sharded_train_step(config, mesh, rules)
    state = abstract_sharded_state(config, mesh, rules)
    batch = _batch(batch_sharding(mesh, rules))
    with jax.set_mesh(mesh):  # GNMT's pipeline reads the ambient mesh at trace time, as the trainer sets it
        exported = _export(step, state, batch)
    assert exported.nr_devices == 8
    # The program carries the mesh's shardings: the batch split over data, the weights as the rules say.
    text = exported.mlir_module()
    assert re.search(r'tensor<8x7xi32> \{sdy\.sharding = #sdy\.sharding<@mesh, \[\{"data"\}, \{\}\]>', text)
    split_weights = re.findall(r'sdy\.sharding<@mesh, \[[^\]]*"(model|stage)"', text)
    if strategy == "data":
        assert not split_weights
    else:
        assert split_weights
    if "pipeline" in strategy:
        # the wavefront hands each stage's output to the next (shard_map + ppermute)
        assert "sdy.manual_computation" in text and "stablehlo.collective_permute" in text
    if arch == "rnnsearch":
        # the validation step as the trainer jits it on a mesh (train/_loop.py)
        shardings = train_state_shardings(config, mesh, rules)
        validate = jax.jit(
            functools.partial(eval_step, config=config),
            in_shardings=(shardings.params, batch_sharding(mesh, rules)),
            out_shardings=replicated(mesh),
        )
        with jax.set_mesh(mesh):
            assert _export(validate, state.params, batch).nr_devices == 8
