"""Pure-JAX attention: scorers, masked softmax (or sparsemax, 1.5-entmax), dot-product and multi-head attention,
masks, positions, the pointer-generator copy mixture.

No Flax in here: parameters are plain pytrees (dicts of arrays), every function is jit-, vmap- and grad-able and
accepts any number of leading batch axes ``[..., T, D]``. The numerics policy is written in ``_softmax.py``.
"""

from attn_jax.attention._additive import (
    additive_attention,
    additive_attention_step,
    additive_scores,
    init_additive_params,
    project_keys,
)
from attn_jax.attention._alibi import alibi_bias, alibi_slopes
from attn_jax.attention._chunked import chunked_dot_product_attention
from attn_jax.attention._copy import copy_mass, pointer_generator_log_probs
from attn_jax.attention._dot_product import (
    dot_product_attention,
    dot_product_implementation,
    dot_product_scores,
)
from attn_jax.attention._fused_additive import fused_additive_scores
from attn_jax.attention._local import (
    init_local_p_params,
    local_attention,
    local_window_mask,
    monotonic_centers,
    predictive_centers,
)
from attn_jax.attention._luong import (
    concat_scores,
    dot_scores,
    general_scores,
    init_general_params,
    init_location_params,
    location_scores,
    luong_attention,
)
from attn_jax.attention._masks import (
    combine_masks,
    from_torch_attn_mask,
    from_torch_key_padding_mask,
    key_padding_mask,
    make_attention_mask,
    make_causal_mask,
    make_padding_mask,
    make_segment_mask,
    padding_lengths,
    padding_mask_from_tokens,
    segment_positions,
    sliding_window_mask,
)
from attn_jax.attention._multihead import (
    init_multi_head_params,
    merge_heads,
    multi_head_attention,
    split_heads,
)
from attn_jax.attention._normalizers import (
    NORMALIZERS,
    check_normalizer,
    entmax15,
    masked_normalize,
    sparsemax,
)
from attn_jax.attention._padding import zero_masked_keys, zero_masked_queries
from attn_jax.attention._positional import (
    init_learned_positions,
    learned_positions,
    rotary_embedding,
    sinusoidal_positions,
)
from attn_jax.attention._relative import (
    init_relative_embeddings,
    relative_attention,
    relative_position_index,
)
from attn_jax.attention._softmax import (
    assert_valid_attention_weights,
    attend,
    masked_softmax,
    weighted_context,
)

__all__ = [
    # additive (Bahdanau)
    "additive_attention",
    "additive_attention_step",
    "additive_scores",
    "init_additive_params",
    "project_keys",
    "fused_additive_scores",
    # Luong
    "concat_scores",
    "dot_scores",
    "general_scores",
    "init_general_params",
    "init_location_params",
    "location_scores",
    "luong_attention",
    # Luong local
    "init_local_p_params",
    "local_attention",
    "local_window_mask",
    "monotonic_centers",
    "predictive_centers",
    # dot-product and multi-head
    "dot_product_attention",
    "dot_product_implementation",
    "dot_product_scores",
    "chunked_dot_product_attention",
    "init_multi_head_params",
    "merge_heads",
    "multi_head_attention",
    "split_heads",
    # masks
    "combine_masks",
    "from_torch_attn_mask",
    "from_torch_key_padding_mask",
    "key_padding_mask",
    "make_attention_mask",
    "make_causal_mask",
    "make_padding_mask",
    "make_segment_mask",
    "padding_lengths",
    "padding_mask_from_tokens",
    "segment_positions",
    "sliding_window_mask",
    # padding that cannot leak
    "zero_masked_keys",
    "zero_masked_queries",
    # positions
    "init_learned_positions",
    "learned_positions",
    "rotary_embedding",
    "sinusoidal_positions",
    # relative positions (Shaw et al.) and ALiBi (Press et al.)
    "alibi_bias",
    "alibi_slopes",
    "init_relative_embeddings",
    "relative_attention",
    "relative_position_index",
    # copying source words (See et al. 2017 pointer-generator)
    "copy_mass",
    "pointer_generator_log_probs",
    # softmax and the source-axis check
    "assert_valid_attention_weights",
    "attend",
    "masked_softmax",
    "weighted_context",
    # sparse normalisers (sparsemax, 1.5-entmax)
    "NORMALIZERS",
    "check_normalizer",
    "entmax15",
    "masked_normalize",
    "sparsemax",
]
