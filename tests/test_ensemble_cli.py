"""Ensembles on the command line: ``translate``, ``score`` and ``evaluate`` take ``--workdir`` more than once and
average the runs' log-probabilities; runs with different vocabularies are refused in one line."""

import json
import os
import shutil

import numpy as np
import pytest

from attn_jax.cli import main
from attn_jax.pipeline import load_ensemble, load_model, score_pairs, translate_sentences
from tests.test_cli_translate import make_run
from tests.tolerance import assert_close_f32

# Short sentences: one padded width, so each program compiles once for the whole file.
SENTENCES = ["the dog slept .", "every monk stood , because the torch bit fragile lazy bananas .", "zzzqx ."]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run ``a`` (its test split: :data:`SENTENCES`), run ``b`` (the same vocabularies, other weights),
    ``other`` (``a`` with two target words swapped in its vocabulary: the same size, other contents) and an
    input file."""
    corpus = tmp_path_factory.mktemp("corpus")  # evaluate's test split: the short sentences, as themselves
    for side in ("en", "fr"):
        (corpus / f"test.{side}").write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    plain = (
        "data.corpus=plain",
        f"data.source_path={corpus}/{{split}}.en",
        f"data.target_path={corpus}/{{split}}.fr",
    )
    a = make_run(tmp_path_factory.mktemp("a"), overrides=plain)
    b = make_run(tmp_path_factory.mktemp("b"), scale=0.7)
    other = str(tmp_path_factory.mktemp("other") / "run")
    shutil.copytree(a, other)
    path = os.path.join(other, "vocab", "target", "vocab.json")
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)
    meta["tokens"][4], meta["tokens"][5] = meta["tokens"][5], meta["tokens"][4]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(meta, f)
    source = tmp_path_factory.mktemp("input") / "in.txt"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return a, b, other, str(source)


def _run(argv, capsys):
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def _best(text: str):
    """``--alignment json`` lines as the best translations and their ``[score, log_prob]`` and attention."""
    best = [json.loads(line)["hypotheses"][0] for line in text.splitlines()]
    numbers = np.asarray([[h["score"], h["log_prob"]] for h in best])
    return [h["translation"] for h in best], numbers, [np.asarray(h["attention"]) for h in best]


def test_an_ensemble_of_a_run_with_itself_translates_and_scores_as_that_run(runs, tmp_path, capsys):
    a, _, _, source = runs
    flags = ["--input", source, "--beam", "2", "--alignment", "json"]
    status, single, err = _run(["translate", "--workdir", a, *flags], capsys)
    assert status == 0, err
    status, double, err = _run(["translate", "--workdir", a, "--workdir", a, *flags], capsys)
    assert status == 0, err
    (texts, numbers, attention), (texts2, numbers2, attention2) = _best(single), _best(double)
    assert texts2 == texts and len(texts) == len(SENTENCES)
    # One float32 log-softmax over the target vocabulary is the longest sum in either program.
    assert_close_f32(numbers2, numbers, reduction=load_model(a).tgt_vocab.size)
    assert_close_f32(attention2, attention, reduction=16)  # a softmax over the padded source

    target = tmp_path / "tgt.txt"
    target.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    score = ["--src", source, "--tgt", str(target)]
    status, one, err = _run(["score", "--workdir", a, *score], capsys)
    assert status == 0, err
    status, two, err = _run(["score", "--workdir", a, "--workdir", a, *score], capsys)
    assert status == 0, err
    assert two == one and len(one.splitlines()) == len(SENTENCES)


@pytest.mark.numerics
def test_an_ensembles_log_probability_is_the_mean_of_its_runs_teacher_forced_scores(runs):
    """Beam search over two runs averages their log-softmax at each step, so a hypothesis' ``log_prob`` is the
    mean of what each run gives it by teacher forcing alone (``score_pairs``, one run at a time)."""
    a, b, _, _ = runs
    ensemble = load_ensemble([a, b])
    assert [m.workdir for m in ensemble.members] == [a, b] and len(ensemble.model) == 2
    hyps = [hs[0] for hs in translate_sentences(ensemble, SENTENCES, beam_size=2)]
    sources = SENTENCES
    targets = [h.text for h in hyps]
    each = [[p.total for p in score_pairs(load_model(w), sources, targets)] for w in (a, b)]
    mean = [(x + y) / 2 for x, y in zip(*each, strict=True)]
    assert each[0] != each[1]  # two different models, so the mean is not either one
    assert [p.total for p in score_pairs(ensemble, sources, targets)] == pytest.approx(mean, rel=1e-12)
    vocab = ensemble.tgt_vocab.size
    assert_close_f32(np.asarray([h.log_prob for h in hyps]), np.asarray(mean), reduction=vocab)


def test_runs_with_different_vocabularies_are_refused_in_one_line(runs, tmp_path, capsys):
    a, _, other, source = runs
    for command, extra in (
        ("translate", ["--input", source]),
        ("score", ["--src", source, "--tgt", source]),
        ("evaluate", ["--out", str(tmp_path / "eval")]),
    ):
        status, out, err = _run([command, "--workdir", a, "--workdir", other, *extra], capsys)
        assert status == 1 and out == "" and err.count("\n") == 1, err
        assert err == (
            f"attn-jax {command}: error: {a} and {other} have different target vocabularies (vocab/target): "
            "an ensemble needs the same vocabularies\n"
        )
    assert not (tmp_path / "eval").exists()


def test_evaluate_records_the_members_and_decodes_as_the_run(runs, tmp_path, capsys):
    a, _, _, _ = runs
    out = tmp_path / "eval"
    argv = [
        "evaluate",
        "--workdir",
        a,
        "--workdir",
        a,
        "--max-examples",
        "3",
        "--heatmaps",
        "0",
        "--beam",
        "2",
    ]
    status, printed, err = _run([*argv, "--out", str(out)], capsys)
    assert status == 0, err
    members = [{"workdir": a, "step": 1, "checkpoint_note": None}] * 2
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert (
        list(summary) == ["RNNsearch ensemble of 2"]
        and summary["RNNsearch ensemble of 2"]["ensemble"] == members
    )
    result = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    assert result["ensemble"] == members and result["tensorboard"] is None
    assert "not added to a run's TensorBoard log" in err
    assert f"Ensemble of 2 runs, their log-probabilities averaged: `{a}` (step 1)" in (
        (out / "evaluation.md").read_text(encoding="utf-8")
    )
    assert "checkpoint steps 1, 1, beam 2" in printed
    sources = (out / "sources.txt").read_text(encoding="utf-8").splitlines()
    want = [h[0].text for h in translate_sentences(load_model(a), sources, beam_size=2)]
    assert (out / "hypotheses.txt").read_text(encoding="utf-8").splitlines() == want


def test_an_ensemble_produces_what_its_most_bounded_member_can():
    from types import SimpleNamespace

    from attn_jax.decoding import model_length_cap

    def transformer(n):
        return SimpleNamespace(config=SimpleNamespace(max_length=n))

    rnn = SimpleNamespace(config=SimpleNamespace())
    assert model_length_cap([transformer(9), rnn, transformer(5)]) == 5
    assert model_length_cap((rnn, rnn)) is None and model_length_cap(transformer(9)) == 9
