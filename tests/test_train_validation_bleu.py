"""Validation by translation (BLEU, chrF), the best checkpoint by a chosen metric, and early stopping.

The rules are checked by hand (early stopping on a written-out sequence; checkpoint ranking on saved metrics
where NLL and BLEU disagree). One smoke run translates its validation split for real: its logged BLEU and chrF
equal sacreBLEU's on the hypotheses it wrote, the hypotheses equal ``attn_jax.pipeline.translate_sentences``'
on the same checkpoint, and the search is traced at the first validation only. Early stopping and its resume
run on scripted BLEU values (the seam ``_loop._translate_validation``): a BLEU that peaks while the NLL still
falls.
"""

import io
import json
import pathlib

import jax
import numpy as np
import pytest

from attn_jax.decoding import _beam
from attn_jax.train import (
    CheckpointManager,
    ConfigError,
    EarlyStopping,
    _loop,
    apply_overrides,
    check_config,
    default_config,
    early_stopping_update,
    load_checkpoint,
    load_config,
    read_metrics,
    train_and_evaluate,
)

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
SMOKE = f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke"


def _validation_records(workdir):
    return [r for r in read_metrics(pathlib.Path(workdir) / "metrics.jsonl") if r["split"] == "validation"]


# ------------------------------------------------------------------------------------------ the rules by hand


def test_early_stopping_counts_validations_without_improvement():
    s = EarlyStopping("bleu")
    seen = []
    for step, bleu in ((10, 5.0), (20, 9.0), (30, 9.0), (40, 9.3), (50, 12.0), (60, 11.0)):
        s = early_stopping_update(s, bleu, step, min_delta=0.5)
        seen.append((s.best, s.best_step, s.bad))
    # 9.0 -> 9.0 and 9.3 do not beat 9.0 by more than 0.5; 12.0 does; 11.0 does not.
    assert seen == [(5.0, 10, 0), (9.0, 20, 0), (9.0, 20, 1), (9.0, 20, 2), (12.0, 50, 0), (12.0, 50, 1)]
    s = EarlyStopping("nll")
    for step, nll in ((1, 3.0), (2, 2.0), (3, 2.0), (4, 2.5)):
        s = early_stopping_update(s, nll, step)
    assert (s.best, s.best_step, s.bad) == (2.0, 2, 2)  # lower is better; a tie is no improvement
    assert EarlyStopping.from_json(s.to_json(), "nll") == s
    assert EarlyStopping.from_json(s.to_json(), "bleu") is None  # saved for another metric: not reused


def _save_run(directory, best_metric, keep, metrics_by_step):
    manager = CheckpointManager(directory, keep=keep, best_metric=best_metric, async_save=False)
    for step, metrics in metrics_by_step.items():
        tree = {"w": np.full((3,), step, np.float32)}
        manager.save(step, tree, {"next_index": step}, {"seed": 0}, metrics)
    return manager


# NLL falls at every validation while BLEU peaks at step 2: the two criteria pick different checkpoints.
DISAGREE = {
    1: {"nll_per_token": 3.0, "bleu": 4.0, "chrf": 20.0},
    2: {"nll_per_token": 2.5, "bleu": 9.0, "chrf": 30.0},
    3: {"nll_per_token": 2.0, "bleu": 7.0, "chrf": 35.0},
    4: {"nll_per_token": 1.5, "bleu": 6.0, "chrf": 25.0},
}


@pytest.mark.parametrize("metric, best", [("nll", 4), ("bleu", 2), ("chrf", 3)])
def test_best_checkpoint_follows_the_chosen_metric(tmp_path, metric, best):
    manager = _save_run(tmp_path / "checkpoints", metric, 1, DISAGREE)
    assert manager.all_steps() == sorted({best, 4}) and manager.best_step() == best  # keep_best keeps it
    manager.close()
    restored = load_checkpoint(tmp_path, best=True)  # read back: ranked by the metric the run recorded
    assert restored.step == best and restored.note == ""
    assert float(restored.state["w"][0]) == best


def test_run_without_a_recorded_metric_is_ranked_by_nll(tmp_path):
    """Checkpoints saved before the metric's name was recorded hold only ``nll_per_token``."""
    nll = {1: 3.0, 2: 1.0, 3: 2.0}
    manager = _save_run(tmp_path / "checkpoints", "nll", 3, {s: {"nll_per_token": v} for s, v in nll.items()})
    manager.close()
    for step in nll:
        path = tmp_path / "checkpoints" / str(step) / "metrics" / "metrics"
        saved = json.loads(path.read_text())
        assert saved.pop("best_metric") == "nll"
        path.write_text(json.dumps(saved))
    assert load_checkpoint(tmp_path, best=True).step == 2


def test_config_checks_the_new_keys():
    base = default_config()
    check_config(base)
    assert (base.checkpoint.best_metric, base.early_stopping.patience, base.validation.bleu) == (
        "nll",
        0,
        False,
    )
    bad = [
        (["checkpoint.best_metric=bleu"], "needs validation.bleu=True"),
        (["checkpoint.best_metric=ter"], "checkpoint.best_metric must be one of nll, bleu, chrf"),
        (["early_stopping.patience=-1"], "early_stopping.patience must be >= 0"),
        (["early_stopping.patience=3", "data.eval_split=none"], "early_stopping.patience needs a validation"),
        (["validation.bleu=true", "validation.beam_size=0"], "validation.beam_size must be >= 1"),
        (["validation.bleu=true", "validation.detokenize=spm"], "validation.detokenize must be one of"),
        (["validation.bleu=true", "validation.bleu_tokenize=moses"], "must be a sacreBLEU tokeniser"),
    ]
    for overrides, message in bad:
        with pytest.raises(ConfigError, match=message):
            check_config(apply_overrides(base, overrides))
    for path in sorted(CONFIGS.glob("*.py")):  # every preset starts from default_config: it has the keys
        check_config(load_config(str(path)))


# ---------------------------------------------------------------------------------- a run that translates


@pytest.fixture(scope="module")
def bleu_run(tmp_path_factory):
    """The smoke run translating its 33 validation pairs at steps 10, 20, 30 (greedy, 3 batches of 11: one
    batch shape), with the search's trace count taken after each validation."""
    workdir = tmp_path_factory.mktemp("bleu")
    config = apply_overrides(
        load_config(SMOKE),
        [
            "validation.bleu=true",
            "validation.batch_size=11",
            "checkpoint.best_metric=chrf",
            "tensorboard=false",
        ],
    )
    traces = []
    translate = _loop._translate_validation

    def counted(*args, **kwargs):
        out = translate(*args, **kwargs)
        traces.append(_beam._TRACE_COUNT[0])
        return out

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_loop, "_translate_validation", counted)
        result = train_and_evaluate(config, workdir, stream=out, tty=False)
    return config, workdir, result, out.getvalue(), traces


@pytest.mark.slow
def test_logged_bleu_and_chrf_are_sacrebleus_on_the_written_hypotheses(bleu_run):
    import sacrebleu

    _, workdir, result, log, _ = bleu_run
    records = _validation_records(workdir)
    assert [r["step"] for r in records] == [10, 20, 30]
    validation = pathlib.Path(workdir) / "validation"
    references = (validation / "references.txt").read_text(encoding="utf-8").splitlines()
    assert len(references) == 33
    for r in records:
        hyps = (validation / f"hypotheses-{r['step']}.txt").read_text(encoding="utf-8").split("\n")[:-1]
        assert len(hyps) == 33
        assert r["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [references]).score, abs=1e-9)
        assert r["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [references]).score, abs=1e-9)
        assert r["translations"] == 33 and 0 <= r["stopped_at_limit"] <= 33
    assert records[-1]["chrf"] > 0  # the trained model's output shares characters with the references
    assert f"chrF {records[-1]['chrf']:.2f} (33 translations, " in log
    chrf = {r["step"]: r["chrf"] for r in records}
    assert result.best_step == max(chrf, key=lambda s: (chrf[s], -s))  # ranked by chrF, as configured
    assert load_checkpoint(workdir, best=True).step == result.best_step


@pytest.mark.slow
def test_validation_translations_are_translate_sentences_and_compile_once(bleu_run):
    from attn_jax import pipeline

    _, workdir, _, _, traces = bleu_run
    # Traced at the first validation at most (another test may have compiled this shape already), never again.
    assert len(traces) == 3 and traces[0] == traces[1] == traces[2]
    validation = pathlib.Path(workdir) / "validation"
    sources = (validation / "sources.txt").read_text(encoding="utf-8").splitlines()
    written = (validation / "hypotheses-30.txt").read_text(encoding="utf-8").split("\n")[:-1]
    loaded = pipeline.load_model(workdir, 30)
    got = pipeline.translate_sentences(loaded, sources, beam_size=1, alpha=0.0, batch_size=11)
    assert [t[0].text for t in got] == written
    stopped = _validation_records(workdir)[-1]["stopped_at_limit"]
    assert stopped == sum(t[0].truncated for t in got)  # evaluate's count of length-limit cuts
    assert _beam._TRACE_COUNT[0] == traces[-1]  # the same compiled search


# ----------------------------------------------------------------------------- early stopping and resume

# Scripted BLEU per validation step: best at 10, then two validations without improvement stop the run at 20.
SCRIPT = {5: 1.0, 10: 4.0, 15: 3.0, 20: 2.0, 25: 9.0, 30: 9.5}


def _scripted(validator, params, step, directory, logger):
    del validator, params, directory, logger
    return {"bleu": SCRIPT[step], "chrf": 10 * SCRIPT[step], "translations": 33, "stopped_at_limit": 0}


def _early_config(steps):
    return apply_overrides(
        load_config(SMOKE),
        [
            f"num_train_steps={steps}",
            "eval_every=5",
            "checkpoint_every=5",
            "log_every=5",
            "keep_checkpoints=1",
            "tensorboard=false",
            "validation.bleu=true",
            "checkpoint.best_metric=bleu",
            "early_stopping.patience=2",
        ],
    )


@pytest.mark.slow
def test_early_stopping_by_bleu_and_resume_keeps_the_count(tmp_path, monkeypatch):
    monkeypatch.setattr(_loop, "_translate_validation", _scripted)
    out = io.StringIO()
    straight = train_and_evaluate(_early_config(30), tmp_path / "straight", stream=out, tty=False)
    assert straight.step == 20 and straight.stopped_early
    assert straight.best_step == 10 and straight.early_stopping == EarlyStopping("bleu", 4.0, 10, 2)
    nll = {r["step"]: r["nll_per_token"] for r in _validation_records(tmp_path / "straight")}
    assert list(nll) == [5, 10, 15, 20] and nll[20] < nll[10]  # NLL would have picked step 20
    steps = sorted(int(p.name) for p in (tmp_path / "straight" / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [10, 20]  # the stopping step saved, and the best kept beside it (keep_checkpoints=1)
    assert load_checkpoint(tmp_path / "straight", best=True).step == 10
    assert (
        "checkpoints: the best is the best by validation bleu (checkpoint.best_metric); early stopping after 2 "
        "validations without improvement (early_stopping.patience)" in out.getvalue()
    )
    stop = [line for line in out.getvalue().splitlines() if line.startswith("early stopping")]
    assert stop == [
        "early stopping at step 20 of 30: validation bleu has not improved (higher is better) in 2 validations "
        "(early_stopping.patience=2); the best, 4.0000, was at step 10"
    ]

    # Interrupted after one validation without improvement, then resumed: the count goes on from 1.
    first = train_and_evaluate(_early_config(15), tmp_path / "resumed", stream=io.StringIO(), tty=False)
    assert first.step == 15 and not first.stopped_early and first.early_stopping.bad == 1
    resumed = train_and_evaluate(_early_config(30), tmp_path / "resumed", resume=True, stream=io.StringIO())
    assert resumed.step == 20 and resumed.stopped_early and resumed.best_step == 10
    assert all(
        np.array_equal(a, b)
        for a, b in zip(
            jax.tree.leaves(resumed.state.params), jax.tree.leaves(straight.state.params), strict=True
        )
    )
    # A stopped run resumed again has nothing to do.
    out = io.StringIO()
    again = train_and_evaluate(_early_config(30), tmp_path / "resumed", resume=True, stream=out)
    assert again.step == 20 and again.stopped_early
    assert "nothing to do: early stopping at step 20 of 30" in out.getvalue()
