"""``attn-jax translate``: file and stdin input, n-best and alignment formats, equality with unbatched decoding,
``<unk>`` replacement, one-line errors."""

import io
import json
import os

import numpy as np
import pytest

from attn_jax.cli import main
from attn_jax.pipeline import load_model, translate_sentences
from tests.tolerance import assert_close_f32

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Distinct lengths (5, 1, 9, 15 tokens) over two padded widths; one out-of-vocabulary word; a blank line.
SENTENCES = [
    "the dog slept .",
    ".",
    "",
    "the museum buried those round orange waiters zzzqx .",
    "every monk stood , because the torch bit fragile lazy bananas which knelt quietly .",
]


def make_run(
    workdir,
    *,
    arch: str = "rnnsearch",
    step: int = 1,
    scale: float = 0.5,
    overrides: tuple[str, ...] = (),
    config_file: str = "rnnsearch_cpu",
    model: dict | None = None,
) -> str:
    """A run directory with vocabularies, config and one untrained checkpoint at a tiny size, written with the
    trainer's own API (seconds instead of a training run).

    The checkpoint's state has the trainer's structure and dtypes (``init_train_state`` traced with
    ``jax.eval_shape``; compiling its initialiser would cost ~10 s) with parameters drawn from N(0, scale²) with
    NumPy: at that spread the attention is peaked, so argmax alignments compare without near-ties. The optimiser
    state and the step are zero, as in a fresh state (Adam's count and moments). ``overrides`` (``key=value``)
    change the saved config after that (e.g. the corpus that ``evaluate`` reads), not the model or vocabularies.
    ``config_file`` and ``model`` (its ``model`` fields) give another architecture: ``transformer_cpu`` with
    ``dict(d_model=16, ...)``; ``arch`` sizes only the default RNN.
    """
    import json as _json

    import jax

    from attn_jax import data
    from attn_jax.train import (
        CheckpointManager,
        StepConfig,
        apply_overrides,
        init_train_state,
        load_config,
        model_config,
        optimizer_config,
    )

    config = load_config(os.path.join(_ROOT, "configs", f"{config_file}.py:smoke"))
    config.model.update(**(model or dict(arch=arch, embed=8, hidden=10, maxout=6, align=7)))
    s = config.data.synthetic_spec
    spec = data.SyntheticSpec(
        train_size=s.train_size,
        validation_size=s.validation_size,
        test_per_bucket=0,
        seed=s.seed,
        min_length=s.min_length,
        max_length=s.max_length,
    )
    train = data.generate_synthetic(spec)["train"]
    src_vocab = data.WordVocabulary.build([p.source for p in train])
    tgt_vocab = data.WordVocabulary.build([p.target for p in train])
    data.save_vocabularies(os.path.join(workdir, "vocab"), src_vocab, tgt_vocab)
    step_cfg = StepConfig(
        model=model_config(config, src_vocab.size, tgt_vocab.size),
        optimizer=optimizer_config(config),
        label_smoothing=0.0,
    )
    abstract = jax.eval_shape(lambda: init_train_state(step_cfg, 0))
    rng = np.random.default_rng(0)
    zeros = lambda s: np.zeros(s.shape, s.dtype)  # noqa: E731
    state = abstract.replace(
        step=zeros(abstract.step),
        params=jax.tree.map(lambda s: rng.normal(0.0, scale, s.shape).astype(s.dtype), abstract.params),
        opt_state=jax.tree.map(zeros, abstract.opt_state),
        rng=zeros(abstract.rng),
    )
    manager = CheckpointManager(os.path.join(workdir, "checkpoints"), async_save=False)
    saved = apply_overrides(config, overrides)
    manager.save(step, state, {}, _json.loads(saved.to_json()), {"nll_per_token": 1.0})
    manager.close()
    return str(workdir)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run"))


def _translate(argv, capsys, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    status = main(["translate", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_file_and_stdin_give_one_line_per_input(run_dir, tmp_path, capsys, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    out_file = tmp_path / "out" / "hyp.txt"
    status, out, err = _translate(
        ["--workdir", run_dir, "--input", str(src), "--output", str(out_file), "--beam", "3"], capsys
    )
    assert status == 0, err
    assert out == ""
    from_file = out_file.read_text(encoding="utf-8").splitlines()
    status, out, err = _translate(
        ["--workdir", run_dir, "--beam", "3"], capsys, stdin="\n".join(SENTENCES), monkeypatch=monkeypatch
    )
    assert status == 0, err
    from_stdin = out.splitlines()
    assert len(from_file) == len(SENTENCES) and from_file == from_stdin
    assert from_file[2] == ""  # blank line in, blank line out
    # The CLI's text is the library's best hypothesis, decoded with the run's target vocabulary.
    loaded = load_model(run_dir)
    best = [h[0] for h in translate_sentences(loaded, SENTENCES, beam_size=3)]
    assert from_file == [h.text for h in best]
    assert all(h.text == loaded.tgt_vocab.decode(h.ids) for h in best)


def test_batched_translation_equals_one_sentence_at_a_time(run_dir):
    """Sorting, bucketing and padding rows/columns must not change any translation (beam 1 = greedy)."""
    from attn_jax.decoding import greedy_decode

    loaded = load_model(run_dir)
    sv = loaded.src_vocab
    batched = translate_sentences(loaded, SENTENCES, beam_size=1, alpha=0.0, batch_size=4)
    assert batched[2][0].text == "" and batched[2][0].ids == []
    for k in (0, 4):  # one sentence per padded width (each unpadded width compiles its own search)
        sentence, hyps = SENTENCES[k], batched[k]
        ids = np.asarray([[*sv.encode(sentence), sv.eos_id]], np.int32)  # unpadded, alone
        # The same length limit (tokens with </s>) as the batch gave this sentence.
        out = greedy_decode(loaded.model, ids, np.ones_like(ids, bool), limits=[hyps[0].limit + 1])
        n = int(out.lengths[0, 0])
        assert hyps[0].ids == [int(t) for t in out.tokens[0, 0, : n - 1]]
        # Two programs (padded batch vs alone): float32 rounding over make_run's RNNsearch (m=8, n=10, n'=7) through
        # S <= 16 source and T <= 32 target steps (tests/test_models_rnn.py's chain) and the sum of the log-probs.
        chain = 16 * (8 + 10) + 32 * ((8 + 30) + (20 + 7) + 2 * 16 + (8 + 30)) + 32
        assert_close_f32(hyps[0].log_prob, float(out.log_probs[0, 0]), reduction=chain)
        # Attention of the padded batch, cut to the real tokens, equals the unpadded one (masked columns are 0).
        assert_close_f32(hyps[0].attention, np.asarray(out.attention[0, 0, :n]), reduction=chain)


def test_pharaoh_alignment_is_in_range(run_dir, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES), encoding="utf-8")
    # Beam 3 as in test_file_and_stdin_give_one_line_per_input: the same compiled search.
    status, out, err = _translate(
        ["--workdir", run_dir, "--input", str(src), "--beam", "3", "--alignment", "pharaoh"], capsys
    )
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) == len(SENTENCES)
    for sentence, line in zip(SENTENCES, lines, strict=True):
        text, sep, links = line.partition(" ||| ")
        assert sep, line
        n_src, n_tgt = len(sentence.split()), len(text.split())
        pairs = [tuple(map(int, link.split("-"))) for link in links.split()]
        assert all(0 <= i < n_src and 0 <= j < n_tgt for i, j in pairs), line
        assert sorted(j for _, j in pairs) == list(range(n_tgt))  # one link per target word (argmax)


def test_json_alignment_and_nbest(run_dir, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES), encoding="utf-8")
    # --nbest 3 here and in the plain n-best format below: one compiled search for both.
    status, out, err = _translate(
        ["--workdir", run_dir, "--input", str(src), "--beam", "3", "--nbest", "3", "--alignment", "json"],
        capsys,
    )
    assert status == 0, err
    objs = [json.loads(line) for line in out.splitlines()]
    assert [o["index"] for o in objs] == list(range(len(SENTENCES)))
    sv = load_model(run_dir).src_vocab
    for sentence, o in zip(SENTENCES, objs, strict=True):
        assert o["source"] == sentence
        if not sentence:
            assert o["source_tokens"] == [] and o["source_unk"] == []
            continue
        # which source words the model never saw: each word looked up alone in the source vocabulary
        words = sentence.split()
        assert o["source_tokens"] == words
        assert o["source_unk"] == [i for i, w in enumerate(words) if sv.encode(w) == [sv.unk_id]]
        if "zzzqx" in words:  # a made-up word is always among them
            assert words.index("zzzqx") in o["source_unk"]
        hyps = o["hypotheses"]
        assert len(hyps) == 3 and hyps[0]["score"] >= hyps[1]["score"] >= hyps[2]["score"]
        assert o["translation"] == hyps[0]["translation"]
        for h in hyps:
            w = np.asarray(h["attention"])
            assert w.shape == (len(h["tokens"]) + 1, len(sentence.split()) + 1)
            np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-5)  # rows: softmax over the source
            argmax = " ".join(f"{int(np.argmax(w[j, :-1]))}-{j}" for j in range(len(h["tokens"])))
            assert h["alignment"] == argmax

    status, out, err = _translate(
        ["--workdir", run_dir, "--input", str(src), "--beam", "3", "--nbest", "3"], capsys
    )
    assert status == 0, err
    rows = [line.split(" ||| ") for line in out.splitlines()]
    indices = [int(r[0]) for r in rows]
    assert indices == sorted(indices) and set(indices) == set(range(len(SENTENCES)))
    for i in set(indices):
        scores = [float(r[2]) for r in rows if int(r[0]) == i]
        assert scores == sorted(scores, reverse=True)


def test_replace_unk_copies_the_most_attended_source_word(run_dir):
    """With the output bias of ``<unk>`` raised, the model writes ``<unk>``; replacement copies a source word."""
    from flax import nnx

    loaded = load_model(run_dir)
    tv = loaded.tgt_vocab
    # Raise <unk>'s output bias (b_w of the deep output, [V]) so that the untrained model writes <unk>.
    graphdef, state = nnx.split(loaded.model)
    params = nnx.to_pure_dict(state)
    b_w = params["output"]["params"]["b_w"]
    assert b_w.shape == (tv.size,)
    params["output"]["params"]["b_w"] = b_w.at[tv.unk_id].add(8.0)
    nnx.replace_by_pure_dict(state, params)
    loaded = loaded._replace(model=nnx.merge(graphdef, state))
    sentence = SENTENCES[3]
    plain = translate_sentences(loaded, [sentence], beam_size=2)[0][0]
    replaced = translate_sentences(loaded, [sentence], beam_size=2, replace_unk=True)[0][0]
    assert tv.unk_id in plain.ids and "<unk>" in plain.text.split()
    words = sentence.split()
    for j, (t, w) in enumerate(zip(plain.ids, replaced.tokens, strict=True)):
        if t == tv.unk_id:
            assert w == words[int(np.argmax(plain.attention[j, : len(words)]))]
    assert "<unk>" not in replaced.text.split()


def _one_error_line(status: int, err: str, expected_status: int = 1) -> str:
    assert status == expected_status
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("attn-jax translate: error: "), err
    return lines[0]


def test_errors_are_one_line(run_dir, tmp_path, capsys, monkeypatch):
    missing = str(tmp_path / "nope")
    line = _one_error_line(
        *_translate(["--workdir", missing], capsys, stdin="a .\n", monkeypatch=monkeypatch)[::2]
    )
    assert "no such run directory" in line
    (tmp_path / "empty_run").mkdir()
    line = _one_error_line(
        *_translate(
            ["--workdir", str(tmp_path / "empty_run")], capsys, stdin="a .\n", monkeypatch=monkeypatch
        )[::2]
    )
    assert "no checkpoint" in line
    line = _one_error_line(
        *_translate(
            ["--workdir", run_dir, "--checkpoint", "7"], capsys, stdin="a .\n", monkeypatch=monkeypatch
        )[::2]
    )
    assert "step 7" in line
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n", encoding="utf-8")
    line = _one_error_line(*_translate(["--workdir", run_dir, "--input", str(empty)], capsys)[::2])
    assert "empty input" in line
    line = _one_error_line(
        *_translate(["--workdir", run_dir, "--input", str(tmp_path / "x.txt")], capsys)[::2]
    )
    assert "no such file" in line
    line = _one_error_line(
        *_translate(
            ["--workdir", run_dir, "--beam", "2", "--nbest", "3"],
            capsys,
            stdin="a .\n",
            monkeypatch=monkeypatch,
        )[::2],
        expected_status=2,
    )
    assert "--nbest" in line
    with pytest.raises(SystemExit) as e:  # argparse: bad --checkpoint value
        main(["translate", "--workdir", run_dir, "--checkpoint", "newest"])
    assert e.value.code == 2
