"""One positive-integer check for every size argument: a NumPy integer passes, 0, -1, True and 2.0 do not.

Each case calls a public function with one size argument replaced; the error must name that argument in the one
wording of ``attn_jax.attention._checks.positive_int``.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_jax.attention import (
    alibi_slopes,
    chunked_dot_product_attention,
    copy_mass,
    dot_product_attention,
    fused_additive_scores,
    init_additive_params,
    init_learned_positions,
    init_multi_head_params,
    init_relative_embeddings,
    relative_position_index,
)
from attn_jax.attention._checks import positive_int
from attn_jax.models import RNNConfig, TransformerConfig, repeat_batch
from attn_jax.nn.intra import init_intra_params
from attn_jax.nn.lstm import init_lstm_params
from attn_jax.nn.recurrent import init_gru_params

KEY = jax.random.key(0)
Q = jnp.ones((2, 3, 4))  # [H=2, T=3, K=4]
KV = jnp.ones((1, 5, 4))  # one key/value head, S=5
POSITIONS = jnp.arange(3)

# (the function, what its error names, a call with the value under test in that argument)
CASES = [
    ("init_additive_params", "attention_dim", lambda n: init_additive_params(KEY, 3, 4, n)),
    ("init_multi_head_params", "num_heads", lambda n: init_multi_head_params(KEY, n, 4)),
    ("init_learned_positions", "max_length", lambda n: init_learned_positions(KEY, n, 4)),
    ("init_relative_embeddings", "features", lambda n: init_relative_embeddings(KEY, 2, n)),
    ("relative_position_index", "max_distance", lambda n: relative_position_index(POSITIONS, POSITIONS, n)),
    ("alibi_slopes", "num_heads", lambda n: alibi_slopes(n)),
    (
        "chunked_dot_product_attention",
        "query_chunk",
        lambda n: chunked_dot_product_attention(Q, Q, Q, query_chunk=n),
    ),
    ("dot_product_attention", "num_kv_heads", lambda n: dot_product_attention(Q, KV, KV, num_kv_heads=n)),
    ("copy_mass", "extended_size", lambda n: copy_mass(jnp.full((3,), 1 / 3), jnp.zeros(3, jnp.int32), n)),
    (
        "fused_additive_scores",
        "block_size",
        lambda n: fused_additive_scores(jnp.ones((3, 2)), jnp.ones((4, 2)), jnp.ones(2), block_size=n),
    ),
    ("init_lstm_params", "hidden", lambda n: init_lstm_params(KEY, 3, n)),
    ("init_gru_params", "context_features", lambda n: init_gru_params(KEY, 3, 2, context_features=n)),
    ("init_intra_params", "input_features", lambda n: init_intra_params(KEY, n, 2, 2)),
    ("repeat_batch", "repeat count", lambda n: repeat_batch({"x": jnp.ones(2)}, n)),
    ("RNNConfig", "model config: hidden", lambda n: RNNConfig(src_vocab=5, tgt_vocab=5, hidden=n)),
    (
        "TransformerConfig",
        "transformer config: d_ff",
        lambda n: TransformerConfig(src_vocab=5, tgt_vocab=5, d_ff=n),
    ),
]
IDS = [function for function, _, _ in CASES]


@pytest.mark.parametrize("function,name,call", CASES, ids=IDS)
def test_accepts_a_numpy_integer(function, name, call):
    call(np.int64(1))


@pytest.mark.parametrize("value", [0, -1, True, 2.0, np.float32(3.0)], ids=repr)
@pytest.mark.parametrize("function,name,call", CASES, ids=IDS)
def test_refuses_what_is_not_a_positive_int(function, name, call, value):
    with pytest.raises(
        ValueError, match="^" + re.escape(f"{name} must be a positive int, got {value!r}") + "$"
    ):
        call(value)


def test_configs_store_a_python_int():
    # a NumPy size would not survive json.dumps of a run's config
    assert type(RNNConfig(src_vocab=np.int64(5), tgt_vocab=5).src_vocab) is int
    assert type(TransformerConfig(src_vocab=5, tgt_vocab=5, heads=np.int32(2)).heads) is int
    assert positive_int("n", np.uint8(7)) == 7 and type(positive_int("n", np.uint8(7))) is int
