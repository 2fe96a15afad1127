"""The examples in public docstrings run and print what they claim (attention core and NNX helpers)."""

import doctest
import importlib

import pytest

MODULES = [
    "attn_jax.attention._softmax",
    "attn_jax.attention._masks",
    "attn_jax.attention._dot_product",
    "attn_jax.attention._plain",
    "attn_jax.attention._multihead",
    "attn_jax.attention._positional",
    "attn_jax.attention._alibi",
    "attn_jax.attention._relative",
    "attn_jax.attention._additive",
    "attn_jax.attention._luong",
    "attn_jax.attention._local",
    "attn_jax.attention._chunked",
    "attn_jax.attention._padding",
    "attn_jax.attention._fused_additive",
    "attn_jax.attention._copy",
    "attn_jax.models.interface",
    "attn_jax.models.transformer",
    "attn_jax.nn.lstm",
    "attn_jax.parallel._mesh",
    "attn_jax.parallel._rules",
    "attn_jax.parallel._pipeline",
    "attn_jax.parallel._distributed",
    "attn_jax.nn.intra",
    "attn_jax.train._config",
    "attn_jax.train._config_help",
    "attn_jax.train._align",
    "attn_jax.train._tensorboard",
    "attn_jax.train._checkpoint",
    "attn_jax.train._early_stopping",
    "attn_jax.eval._options",
    "attn_jax.data._corpus",
    "attn_jax.data._copy",
    "attn_jax.pipeline._attention",
    "attn_jax.pipeline._options",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no docstring examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
