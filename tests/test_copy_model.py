"""The pointer-generator wired into RNNsearch (``model.copy``): extended ids in the batches, the model's
teacher-forced log-probabilities against the float64 loop reference (tests/reference/rnn.py with
``copy_src_ext``), the train step's loss on copied target words, config errors, and the default left alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_jax import data
from attn_jax.models import RNNConfig, build_model
from attn_jax.train import (
    ConfigError,
    OptimizerConfig,
    StepConfig,
    apply_overrides,
    check_config,
    default_config,
    describe_copy,
    eval_step,
    init_train_state,
    loss_sums,
    model_config,
    train_step,
)
from tests.reference.rnn import rnnsearch_ref
from tests.reference.scorers import rel_err
from tests.test_models_rnn import KY, LENGTHS, MODEL_REDUCTION, S, T, make_batch, make_model, pure_params
from tests.tolerance import assert_close_f32

PAIRS = [
    ("le chat Zorg mange Zorg", "the cat Zorg eats"),
    ("Ada voit le chien", "Ada sees the dog Bob"),
    ("le chat", "the cat"),
]


def _encoded():
    corpus = data.corpus_from_pairs(PAIRS)
    src_vocab = data.WordVocabulary.build(corpus.sources)
    tgt_vocab = data.WordVocabulary.build(["the cat eats sees"])  # Zorg, Ada, dog, Bob are out of vocabulary
    return data.encode_corpus(corpus, src_vocab, tgt_vocab, copy=True), tgt_vocab


def test_batches_carry_source_and_targets_in_the_extended_vocabulary():
    encoded, tgt_vocab = _encoded()
    v = tgt_vocab.size
    batch = data.assemble_batch(encoded, np.array([0, 1, -1]), 8)
    # sentence 0: le chat Zorg mange Zorg </s> -> every source word is outside the target vocabulary: ids v, v+1,
    # v+2, v+3 in order of first occurrence, Zorg's two occurrences sharing v+2; the target copies Zorg.
    np.testing.assert_array_equal(batch.src_ext[0, :6], [v, v + 1, v + 2, v + 3, v + 2, data.EOS_ID])
    the, cat, eats = tgt_vocab.encode("the cat eats")
    np.testing.assert_array_equal(batch.tgt_out_ext[0, :5], [the, cat, v + 2, eats, data.EOS_ID])
    np.testing.assert_array_equal(batch.tgt_out[0, :5], [the, cat, data.UNK_ID, eats, data.EOS_ID])
    # sentence 1: Ada is copied; dog and Bob are in neither vocabulary nor source: <unk>.
    ada = v  # its sentence's first out-of-vocabulary word: ids restart per sentence
    np.testing.assert_array_equal(batch.src_ext[1, :5], [ada, v + 1, v + 2, v + 3, data.EOS_ID])
    sees = tgt_vocab.encode("sees")[0]
    np.testing.assert_array_equal(
        batch.tgt_out_ext[1, :6], [ada, sees, the, data.UNK_ID, data.UNK_ID, data.EOS_ID]
    )
    # Padding and the padding row stay <pad>; the ordinary fields are those of a batch without copying.
    assert not batch.src_ext[1, 5:].any() and not batch.src_ext[2].any() and not batch.tgt_out_ext[2].any()
    plain = data.assemble_batch(
        data.encode_corpus(
            data.corpus_from_pairs(PAIRS),
            data.WordVocabulary.build(data.corpus_from_pairs(PAIRS).sources),
            tgt_vocab,
        ),
        np.array([0, 1, -1]),
        8,
    )
    for name in ("src", "src_len", "tgt_in", "tgt_out", "tgt_len", "example_id"):
        np.testing.assert_array_equal(getattr(batch, name), getattr(plain, name))
    assert plain.src_ext is None and plain.tgt_out_ext is None
    with pytest.raises(ValueError, match="packed batches carry no extended ids"):
        data.make_batch_iterator(encoded, data.BatchConfig(batch_size=2), pack=True)


def _copy_case():
    model = make_model(copy=True, seed=3)
    src, mask, tgt_in = make_batch(seed=3)
    rng = np.random.default_rng(4)
    src_ext = np.where(mask, rng.integers(0, KY + 3, (len(LENGTHS), S)), 0).astype(np.int32)
    src_ext[0, :3] = [KY, 5, KY]  # an OOV word twice and a vocabulary word
    return model, src, mask, tgt_in, jnp.asarray(src_ext)


def test_copy_model_matches_float64_reference():
    model, src, mask, tgt_in, src_ext = _copy_case()
    log_probs, attn = jax.jit(lambda m, *a: m(*a))(model, src, mask, tgt_in, src_ext)
    assert log_probs.shape == (len(LENGTHS), T, KY + S)
    ref, ref_attn = rnnsearch_ref(pure_params(model), src, mask, tgt_in, copy_src_ext=src_ext)
    possible = np.isfinite(ref)
    assert rel_err(np.asarray(log_probs)[possible], ref[possible]) < 1e-5
    assert rel_err(attn, ref_attn) < 1e-5
    np.testing.assert_array_equal(np.asarray(log_probs)[~possible], np.finfo(np.float32).min)
    np.testing.assert_allclose(np.exp(np.asarray(log_probs, np.float64)).sum(-1), 1.0, rtol=1e-5)
    # Without src_ext a copy model refuses.
    with pytest.raises(ValueError, match="src_ext"):
        model(src, mask, tgt_in)


def test_copy_gate_gradient_and_copied_target_loss():
    model, src, mask, tgt_in, src_ext = _copy_case()
    graphdef, state = nnx.split(model)
    tgt_mask = jnp.ones(tgt_in.shape, bool)
    labels = jnp.full(tgt_in.shape, KY, jnp.int32)  # every target word is the copied OOV word of sentence 0

    def loss(st):
        lp, _ = nnx.merge(graphdef, st)(src, mask, tgt_in, src_ext)
        return loss_sums(lp[:1], labels[:1], tgt_mask[:1]).loss

    value, grads = jax.jit(jax.value_and_grad(loss))(state)
    ref, _ = rnnsearch_ref(pure_params(model), src, mask, tgt_in, copy_src_ext=src_ext)
    np.testing.assert_allclose(float(value), -ref[0, :, KY].sum(), rtol=1e-5)
    gate = nnx.to_pure_dict(grads)["copy_gate"]
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(gate))


def test_train_step_uses_the_extended_labels():
    encoded, tgt_vocab = _encoded()
    batch = data.assemble_batch(encoded, np.array([0, 1, 2]), 8)
    sizes = ["model.embed=5", "model.hidden=8", "model.maxout=6", "model.align=12", "model.copy=true"]
    config = apply_overrides(default_config(), sizes)
    check_config(config)
    model = model_config(config, src_vocab=int(batch.src.max()) + 1, tgt_vocab=tgt_vocab.size)
    assert model.copy
    cfg = StepConfig(model=model, optimizer=OptimizerConfig(name="adam", learning_rate=0.01))
    state = init_train_state(cfg, jnp.int32(0))
    metrics = eval_step(state.params, batch, cfg)
    module = build_model(model, rngs=nnx.Rngs(0))
    nnx.update(module, nnx.State(jax.tree.map(jnp.asarray, state.params)))
    lp, _ = module(batch.src, jnp.asarray(batch.src_mask), batch.tgt_in, batch.src_ext)
    want = loss_sums(lp, batch.tgt_out_ext, batch.tgt_mask)
    np.testing.assert_allclose(float(metrics.loss.nll), float(want.nll), rtol=1e-5)
    new_state, train_metrics = train_step(state, batch, cfg)
    assert np.isfinite(float(train_metrics.loss.loss)) and int(new_state.step) == 1
    with pytest.raises(ValueError, match="src_ext and tgt_out_ext"):
        eval_step(state.params, batch._replace(src_ext=None, tgt_out_ext=None), cfg)


def test_config_errors_name_the_key():
    base = ["model.embed=5", "model.hidden=8", "model.maxout=6", "model.align=12"]
    cases = [
        (["model.copy=true", "model.arch=rnnenc"], "copy copies source words by attention"),
        (["model.copy=true", "data.vocab=sentencepiece"], "model.copy .* needs data.vocab=word"),
        (["model.copy=true", "label_smoothing=0.1"], "model.copy needs label_smoothing=0"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            check_config(apply_overrides(default_config(), base + overrides))
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="copy must be a bool"):
        RNNConfig(copy=1)
    assert default_config().model.copy is False


def test_default_model_has_no_copy_parameters():
    model = make_model()
    assert "copy_gate" not in pure_params(model)
    assert "copy_gate" in pure_params(make_model(copy=True))


# ------------------------------------------------------------------------------------------------ decoding


@pytest.mark.numerics
def test_step_by_step_equals_teacher_forcing_and_copied_words_feed_back_as_unk():
    model, src, mask, tgt_in, src_ext = _copy_case()
    # Feed back extended ids (copied words) where teacher forcing reads <unk>: the same distribution.
    fed = np.asarray(tgt_in).copy()
    fed[:, 2] = KY + 1
    teacher = np.where(fed >= KY, data.UNK_ID, fed)
    tf, tf_attn = jax.jit(lambda m, *a: m(*a))(model, src, mask, jnp.asarray(teacher), src_ext)

    @jax.jit
    def loop(m, src, mask, src_ext, fed):
        enc = m.encode(src, mask, src_ext)
        dec = m.init_decoder_state(enc)
        out, attn = [], []
        for i in range(fed.shape[1]):
            lp, dec, a = m.decode_step(enc, dec, fed[:, i])
            out.append(lp)
            attn.append(a)
        return jnp.stack(out, 1), jnp.stack(attn, 1)

    steps, step_attn = loop(model, src, mask, src_ext, jnp.asarray(fed))
    assert steps.shape == tf.shape == (len(LENGTHS), T, KY + S)
    assert_close_f32(steps, tf, reduction=MODEL_REDUCTION)
    assert_close_f32(step_attn, tf_attn, reduction=MODEL_REDUCTION)
    with pytest.raises(ValueError, match="src_ext"):  # without src_ext a copy model refuses to encode
        model.encode(src, mask)


def test_beam_search_copies_source_words_when_the_gate_says_copy():
    from attn_jax.decoding import beam_search, greedy_decode

    model, src, mask, tgt_in, src_ext = _copy_case()
    model.copy_gate["b"][...] = jnp.asarray(-30.0)  # p_gen ≈ 1e-13: the output is (almost) all copying
    out = beam_search(model, src, mask, src_ext=src_ext, beam_size=3, max_length=6, length_penalty_alpha=0.0)
    tokens = np.asarray(out.tokens)
    assert tokens.max() >= KY  # an out-of-vocabulary source word was copied
    for b in range(len(LENGTHS)):
        allowed = set(np.asarray(src_ext)[b, : LENGTHS[b]].tolist()) | {data.EOS_ID, data.PAD_ID}
        assert set(tokens[b, 0].tolist()) <= allowed, (b, tokens[b, 0], allowed)
    greedy = greedy_decode(model, src, mask, src_ext=src_ext, max_length=6)
    assert greedy.tokens.shape == (len(LENGTHS), 1, 6)
    with pytest.raises(ValueError, match="src_ext"):
        beam_search(model, src, mask, beam_size=2, max_length=4)


def test_translate_writes_copied_words_out():
    from attn_jax.pipeline import LoadedModel, reference_attention, translate_sentences

    sources = ["le Zorg chat Ada", "Ada voit Zorg"]
    src_vocab = data.WordVocabulary.build(sources)
    tgt_vocab = data.WordVocabulary.build(["the cat eats chat"])  # "chat" is in both vocabularies
    model = make_model(copy=True, seed=5, src_vocab=src_vocab.size, tgt_vocab=tgt_vocab.size)
    model.copy_gate["b"][...] = jnp.asarray(-30.0)  # p_gen ≈ 1e-13: every word is copied
    loaded = LoadedModel(model, src_vocab, tgt_vocab, default_config(), 0, "")
    out = translate_sentences(loaded, sources, beam_size=2)
    for source, (best,) in zip(sources, out, strict=True):
        assert best.tokens and set(best.tokens) <= set(source.split()), (source, best.tokens)
        assert best.text == " ".join(best.tokens)
    assert any(t >= tgt_vocab.size for (best,) in out for t in best.ids)  # some word came from the extension
    # Teacher-forced attention on references works for a copy model too (it needs the extended source).
    attn = reference_attention(loaded, sources, ["the Zorg cat", "Ada"])
    assert [a.shape for a in attn] == [(4, 5), (2, 4)]


def test_trainer_inputs_carry_extended_ids(tmp_path):
    import pathlib

    from attn_jax.train import load_config, make_inputs

    smoke = f"{pathlib.Path(__file__).resolve().parents[1] / 'configs' / 'rnnsearch_cpu.py'}:smoke"
    config = apply_overrides(load_config(smoke), ["model.copy=true", "data.tgt_vocab_size=12"])
    check_config(config)
    inputs = make_inputs(config, str(tmp_path / "vocab"), reuse_vocab=False)
    batch = next(inputs.train)
    v = inputs.tgt_vocab.size
    assert batch.src_ext.shape == batch.src.shape and batch.tgt_out_ext.shape == batch.tgt_out.shape
    # Labels differ from the plain ones only where the plain label is <unk>, and then by a copy id < V + S.
    changed = batch.tgt_out_ext != batch.tgt_out
    assert changed.any() and (batch.tgt_out[changed] == data.UNK_ID).all()
    assert (batch.tgt_out_ext[changed] >= v).all() and (batch.tgt_out_ext < v + batch.src.shape[1]).all()
    # Each copy label is the extended id of a source word of its own sentence.
    for b, t in zip(*np.nonzero(changed), strict=True):
        assert batch.tgt_out_ext[b, t] in batch.src_ext[b, : batch.src_len[b]]
    assert all(b.src_ext is not None for b in inputs.validation)
    # The start-up line counts them, checked against a count over the training pairs' words themselves.
    from attn_jax.train._inputs import _read_split, resolve_corpus_split

    corpus, _ = _read_split(config.data, resolve_corpus_split(config.data, config.data.train_split), 0)
    vocab = inputs.tgt_vocab
    fold = str.lower if vocab.lowercase else (lambda w: w)
    known = set(vocab.tokens)
    unknown = copies = 0
    for source, target in zip(corpus.sources, corpus.targets, strict=True):
        in_source = {fold(w) for w in source.split()}
        for word in map(fold, target.split()):
            if word not in known:
                unknown += 1
                copies += word in in_source
    assert copies > 0 and unknown > copies
    assert (
        f"{unknown:,} training target words are outside the target vocabulary; {copies:,} of them occur in "
        f"their source and are learnt as copies, {unknown - copies:,} stay <unk>"
    ) in describe_copy(inputs.copy_counts)
    assert inputs.copy_counts[1:3] == (unknown, copies)
    model = model_config(config, inputs.src_vocab.size, v)
    cfg = StepConfig(model=model, optimizer=OptimizerConfig(name="adam", learning_rate=0.01))
    state = init_train_state(cfg, jnp.int32(0))
    _, metrics = train_step(state, jax.tree.map(jnp.asarray, batch), cfg)
    assert np.isfinite(float(metrics.loss.loss))
