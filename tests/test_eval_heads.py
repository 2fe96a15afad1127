"""The Transformer's per-head heatmaps of ``attn-jax evaluate``: every head of the last decoder layer on the model's
own translation (teacher-forced), whose mean must equal the attention the cached decoder reported while beam
search produced that translation, and the sharpest head picked by mean row entropy."""

import doctest

import numpy as np
import pytest

from attn_jax import data
from attn_jax.decoding import LengthLimit
from attn_jax.pipeline import (
    LoadedModel,
    _attention,
    hypothesis_cross_attention,
    sharpest_head,
    translate_sentences,
)
from tests.test_transformer import make_model
from tests.tolerance import assert_close_f32

WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis"]


@pytest.fixture(scope="module")
def loaded():
    from attn_jax.models.transformer import TransformerConfig

    src = data.WordVocabulary.build([" ".join(WORDS)], max_size=100)
    tgt = data.WordVocabulary.build([" ".join(w.upper() for w in WORDS)], max_size=100)
    cfg = TransformerConfig(
        src_vocab=src.size,
        tgt_vocab=tgt.size,
        d_model=16,
        heads=4,
        d_ff=24,
        encoder_layers=1,
        decoder_layers=2,
        max_length=24,
        dropout=0.0,
        norm="pre",
    )
    return LoadedModel(make_model(cfg, seed=3), src, tgt, config=None, step=0, workdir="")


def test_mean_of_heads_equals_the_cached_decoders_attention(loaded):
    sources = ["cat dog eel fox", "ibis ant bee cat dog eel fox gnu hen"]
    translations = translate_sentences(loaded, sources, beam_size=3, limit=LengthLimit(0, 2.0, 4))
    for source, (hyp, *_) in zip(sources, translations, strict=True):
        heads = hypothesis_cross_attention(loaded, source, hyp)
        n, m = len(source.split()), len(hyp.ids)
        assert heads.shape == (4, m + 1, n + 1)
        # Two code paths: the KV-cached decode_step during beam search vs the full teacher-forced pass. Float32
        # rounding over the model's longest chain (tests/test_transformer.py's count: an attention sub-layer is
        # D + K + 2S + D with D=16, K=4, S <= 10; a layer adds D + d_ff and two norms 4D; 1 + 2 layers, decoder
        # layers with cross-attention and a third norm; the output over D; the mean over 4 heads).
        att = 16 + 4 + 2 * (n + 1) + 16
        layer = att + 16 + 24 + 4 * 16
        assert_close_f32(heads.mean(axis=0), hyp.attention, reduction=layer + 2 * (layer + att + 32) + 16 + 4)
        np.testing.assert_allclose(heads.sum(axis=-1), 1.0, rtol=1e-5)
        # The heads differ (random weights): picking one is not the same as showing the mean.
        assert np.max(np.abs(heads - heads.mean(axis=0))) > 1e-3


def test_no_heads_for_a_model_without_them(loaded):
    hyp = translate_sentences(loaded, ["cat dog"], beam_size=1, limit=LengthLimit(0, 2.0, 2))[0][0]
    rnn_like = loaded._replace(model=object())
    assert hypothesis_cross_attention(rnn_like, "cat dog", hyp) is None


def test_sharpest_head_is_the_lowest_mean_entropy():
    uniform = np.full((3, 4), 0.25)
    one_hot = np.eye(4)[[0, 2, 1]]
    half = np.tile([0.5, 0.5, 0.0, 0.0], (3, 1))  # entropy log 2, between the two
    assert sharpest_head(np.stack([uniform, half, one_hot])) == 2
    assert sharpest_head(np.stack([half, uniform])) == 0
    # Mean over rows, not the sharpest single row: head 0 has one one-hot row but is uniform elsewhere.
    mixed = np.concatenate([one_hot[:1], uniform[:2]])
    assert sharpest_head(np.stack([mixed, half])) == 1
    failures = doctest.DocTestRunner().run(
        doctest.DocTestFinder().find(sharpest_head, globs=vars(_attention))[0]
    )
    assert failures.failed == 0 and failures.attempted == 1
