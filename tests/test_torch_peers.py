"""The benchmark's fused PyTorch RNNsearch peer (experiments/benchmarks/torch_peers.py) computes an RNNsearch.

It is a speed peer, not a numerical one (``nn.GRU`` differs from the paper's GRU), so it is checked by properties
an RNNsearch must have: padding never changes a sentence's logits (the packed encoder and the masked attention
ignore it), the attention reads the source (changing one source word changes the logits), and its size is the
paper model's plus the second per-gate biases of ``nn.GRU`` / ``nn.GRUCell`` (hand-counted: 9n).
"""

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the benchmark's PyTorch peers need the `bench` extra")
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "benchmarks")
)
import torch_peers  # noqa: E402

DIMS = dict(src_vocab=23, tgt_vocab=19, embed=5, hidden=7, maxout=3, align=6)


def _model():
    torch.manual_seed(0)
    return torch_peers.TorchRNNsearchFused(*DIMS.values()).eval()


def test_parameter_count_is_the_paper_models_plus_the_second_gru_biases():
    fused = torch_peers.param_count(_model())
    written = torch_peers.param_count(torch_peers.TorchRNNsearch(*DIMS.values()))
    assert fused == written + 9 * DIMS["hidden"]


def test_padding_changes_no_logit():
    model, rng = _model(), np.random.default_rng(1)
    lengths = [4, 7, 2]
    src = np.zeros((3, 9), np.int64)
    for b, n in enumerate(lengths):
        src[b, :n] = rng.integers(4, DIMS["src_vocab"], n)
    tgt = torch.from_numpy(rng.integers(4, DIMS["tgt_vocab"], (3, 5)))
    src_t = torch.from_numpy(src)
    with torch.no_grad():
        batched = model(src_t, src_t != 0, tgt)
        for b, n in enumerate(lengths):
            alone = model(src_t[b : b + 1, :n], src_t[b : b + 1, :n] != 0, tgt[b : b + 1])
            # Another padding width is another float32 program (packed vs unpacked GRU kernels): rounding only.
            np.testing.assert_allclose(batched[b].numpy(), alone[0].numpy(), rtol=1e-5, atol=1e-6)
        # Changing a padded token changes nothing; changing a real one changes the logits.
        src_pad = src_t.clone()
        src_pad[0, 6] = 9
        np.testing.assert_array_equal(model(src_pad, src_t != 0, tgt).numpy(), batched.numpy())
        src_word = src_t.clone()
        src_word[0, 1] = (src_word[0, 1] + 1 - 4) % (DIMS["src_vocab"] - 4) + 4
        assert not np.allclose(model(src_word, src_t != 0, tgt)[0].numpy(), batched[0].numpy(), atol=1e-6)
