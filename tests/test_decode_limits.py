"""Decoding length limits are never silent (issue 15, items 1, 2 and 7): ``translate`` and ``evaluate`` derive the
limit from one rule with the same flags, beam search flags exactly the hypotheses cut at the limit, the count
reaches stderr, ``summary.json`` and the reports, and ``evaluate`` shows its progress with an ETA.

The run is ``tests/test_cli_translate.make_run``'s (the smoke config's data and vocabularies, one untrained
checkpoint, seconds to make): its model never chooses ``</s>``, so every translation runs into its limit."""

import doctest
import io
import json

import pytest

from attn_jax.cli import build_parser, main
from attn_jax.decoding import (
    DEFAULT_MAX_LENGTH_OFFSET,
    DEFAULT_MAX_LENGTH_RATIO,
    LengthLimit,
    _limits,
    beam_search,
)
from attn_jax.pipeline import (
    LoadedModel,
    TranslateError,
    Translation,
    decode_progress,
    length_limit,
    length_limit_report,
    load_model,
    model_length_cap,
)
from attn_jax.train import ProgressLine, _metrics
from tests.test_cli_translate import make_run

SOURCES = ["the dog slept .", "", "every monk stood , because the torch bit fragile lazy bananas ."]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run"))


def _main(argv, capsys):
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def test_default_limit_is_the_runs_max_target_length_or_more_and_flags_change_it(run, capsys):
    config = load_model(run).config
    trained = config.data.max_target_length  # 14 in the smoke config
    rule = length_limit(config)
    assert rule == LengthLimit(trained, DEFAULT_MAX_LENGTH_RATIO, DEFAULT_MAX_LENGTH_OFFSET)
    assert all(rule.tokens(n) >= trained for n in range(0, 80))  # never below the training targets
    assert rule.tokens(2) == trained and rule.tokens(30) == 2 * 30 + 10
    assert length_limit(config, max_length_ratio=6, max_length_offset=0).tokens(4) == max(trained, 24)
    assert length_limit(config, max_length=7) == LengthLimit.fixed(7) and LengthLimit.fixed(7).tokens(99) == 7
    assert length_limit(None).minimum == 0  # a model without a run config: the ratio rule alone
    with pytest.raises(TranslateError, match="not both"):
        length_limit(config, max_length=7, max_length_ratio=3)
    # The help states the defaults the rule uses (argparse keeps None so that conflicting flags can be refused).
    sub = build_parser()._subparsers._group_actions[0].choices
    for command in ("translate", "evaluate"):
        text = sub[command].format_help()
        assert f"(default: {DEFAULT_MAX_LENGTH_RATIO:g})" in text
        assert f"(default: {DEFAULT_MAX_LENGTH_OFFSET})" in text
        assert "max(T, floor(ratio*n) + offset)" in " ".join(text.split())
    # Both commands refuse the same bad flags in one line, before loading anything (exit 2).
    for command in ("translate", "evaluate"):
        for flags, fragment in (
            (["--max-length", "5", "--max-length-ratio", "3"], "not both"),
            (["--max-length", "0"], "--max-length must be >= 1"),
            (["--max-length-offset", "-1"], "--max-length-offset must be >= 0"),
        ):
            status, _, err = _main([command, "--workdir", run, *flags], capsys)
            assert status == 2 and err.count("\n") == 1 and fragment in err, err
    for module in (_limits, _metrics):  # LengthLimit's and ProgressLine's examples
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0


def test_beam_search_flags_exactly_the_hypotheses_cut_at_the_limit():
    """A hand-set Markov model (tests/test_decoding.py's table model) whose greedy sentence is ``a b </s>``: with
    limits 2, 3 and 5 only the first is cut (``a </s>``, the model wanted ``b``); at 3 its ``</s>`` falls exactly
    at the limit but is the model's own choice. Beam search keeps the flag on each n-best entry."""
    from tests.test_decoding import B_, BOS, EOS, TRAP, A, TableModel, table_probs, table_source

    chain = TableModel(table_probs({BOS: {A: 0.7, B_: 0.3}, A: {B_: 0.8, EOS: 0.2}, B_: {EOS: 0.9, A: 0.1}}))
    src, mask = table_source(batch=3)
    out = beam_search(chain, src, mask, beam_size=1, length_penalty_alpha=0.0, limits=[2, 3, 5])
    assert out.tokens[:, 0, :3].tolist() == [[A, EOS, 0], [A, B_, EOS], [A, B_, EOS]]
    assert out.truncated[:, 0].tolist() == [True, False, False] and out.limits.tolist() == [2, 3, 5]
    # tests/test_decoding.py's trap: greedy runs a a a until the limit forces </s>; beam 2 finds b </s> and
    # a b </s>, both ended by the model.
    src, mask = table_source()
    greedy = beam_search(TableModel(TRAP), src, mask, beam_size=1, max_length=4, max_length_ratio=None)
    beam = beam_search(
        TableModel(TRAP), src, mask, beam_size=2, num_return=2, max_length=4, max_length_ratio=None
    )
    assert greedy.tokens[0, 0].tolist() == [A, A, A, EOS] and greedy.truncated.tolist() == [[True]] * 2
    assert beam.lengths.tolist() == [[2, 3]] * 2 and beam.truncated.tolist() == [[False, False]] * 2


def test_translate_counts_cut_translations_on_stderr(run, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    status, out, err = _main(
        ["translate", "--workdir", run, "--input", str(path), "--max-length", "3"], capsys
    )
    assert status == 0
    assert err == (
        "attn-jax translate: warning: 2 of 2 translations stopped at the length limit (3 tokens) instead of "
        "ending with </s>: raise --max-length or --max-length-ratio\n"
    )  # the blank line is not a translation
    assert [len(line.split()) for line in out.splitlines()] == [3, 0, 3]
    status, out, err = _main(
        ["translate", "--workdir", run, "--input", str(path), "--beam", "1", "--alignment", "json"], capsys
    )
    records = [json.loads(line) for line in out.splitlines()]
    n = [len(s.split()) for s in SOURCES]
    limits = [max(14, 2 * k + 10) for k in n]  # the smoke run's max_target_length is 14
    assert [r["hypotheses"][0]["limit"] for r in records if r["source"]] == [limits[0], limits[2]]
    assert [len(r["hypotheses"][0]["tokens"]) for r in records if r["source"]] == [limits[0], limits[2]]
    assert all(r["hypotheses"][0]["stopped_at_limit"] for r in records if r["source"])
    assert "2 of 2 translations stopped at the length limit (max(14, ⌊2·n⌋ + 10) tokens" in err
    assert f"{limits[0]}-{limits[2]} here" in err


def test_evaluate_reports_cut_translations_and_progress_and_shares_translates_limit(run, tmp_path, capsys):
    out_dir = tmp_path / "eval"
    flags = ["--max-length-ratio", "1.5", "--max-length-offset", "3"]
    argv = ["evaluate", "--workdir", run, "--beam", "2", "--max-examples", "2", "--heatmaps", "0"]
    status, printed, err = _main([*argv, *flags, "--progress", "lines", "--out", str(out_dir)], capsys)
    assert status == 0, err
    sources = (out_dir / "sources.txt").read_text(encoding="utf-8").splitlines()
    lengths = [len(s.split()) for s in sources]
    limits = sorted(max(14, int(1.5 * k) + 3) for k in lengths)
    here = f"{limits[0]}" if limits[0] == limits[-1] else f"{limits[0]}-{limits[-1]}"
    warning = (
        "warning: 2 of 2 translations stopped at the length limit (max(14, ⌊1.5·n⌋ + 3) tokens for a source "
        f"of n tokens, {here} here) instead of ending with </s>: raise --max-length or --max-length-ratio"
    )
    assert warning in err.splitlines()
    # Progress in the lines mode: sentences done, rate, elapsed time and an ETA, the last line at 2/2.
    progress = [line for line in err.splitlines() if line.startswith("decoding ")]
    assert progress and progress[-1].startswith("decoding 2/2: ") and all("ETA " in p for p in progress)
    summary = json.loads((out_dir / "summary.json").read_text(encoding="utf-8"))
    (system,) = summary
    assert summary[system]["length_limit"] == {
        "stopped_at_limit": 2,
        "translations": 2,
        "fraction_stopped": 1.0,
        "rule": "max(14, ⌊1.5·n⌋ + 3) tokens for a source of n tokens",
        "minimum": 14,
        "ratio": 1.5,
        "offset": 3,
        "shortest_limit": limits[0],
        "longest_limit": limits[-1],
        "model_cap": None,
    }
    assert "2 of 2 translations stopped at it" in (out_dir / "summary.md").read_text(encoding="utf-8")
    assert "**Warning:** Length limit:" in (out_dir / "evaluation.md").read_text(encoding="utf-8")
    full = json.loads((out_dir / "evaluation.json").read_text(encoding="utf-8"))
    assert full["length_limit"]["stopped_at_limit"] == 2 and len(full["length_limit"]["stopped_indices"]) == 2
    assert full["options"]["max_length_ratio"] == 1.5 and full["options"]["max_length"] is None
    # translate, with the same flags, gives the same source the same limit, and the hypotheses agree.
    path = tmp_path / "src.txt"
    path.write_text("\n".join(sources) + "\n", encoding="utf-8")
    status, out, _ = _main(
        ["translate", "--workdir", run, "--input", str(path), "--beam", "2", "--alignment", "json", *flags],
        capsys,
    )
    records = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["hypotheses"][0]["limit"] for r in records) == limits
    hypotheses = (out_dir / "hypotheses.txt").read_text(encoding="utf-8").splitlines()
    assert [r["translation"] for r in records] == hypotheses


def test_a_models_own_cap_is_reported_too(run):
    """A Transformer's decoder holds ``model.max_length`` positions: a rule asking for more is cut there and the
    report says that no flag raises it."""
    loaded = load_model(run)

    class Capped:
        class config:  # noqa: N801 - stands in for a TransformerConfig
            max_length = 9

    fake = LoadedModel(Capped(), loaded.src_vocab, loaded.tgt_vocab, loaded.config, 1, run)
    hyp = Translation("a b c d e f g h", [], [], 0.0, 0.0, None, [], truncated=True, limit=8)
    report = length_limit_report(fake, ["the dog slept ."], [[hyp]], length_limit(loaded.config))
    assert report.model_cap == 8 and report.to_dict()["model_cap"] == 8
    assert report.message() == (
        "1 of 1 translations stopped at the length limit (max(14, ⌊2·n⌋ + 10) tokens for a source of n tokens, "
        "8 here, at most 8 for this model (its decoder holds 9 positions)) instead of ending with </s>: raise "
        "--max-length or --max-length-ratio (the model stops at 8 tokens whatever the flags)"
    )
    assert model_length_cap(loaded.model) is None  # RNNsearch: no cap


def test_decode_progress_extrapolates_the_work_left():
    stream, clock = io.StringIO(), iter([0.0, 0.0, 10.0, 30.0]).__next__
    update = decode_progress(ProgressLine(stream, tty=False, label="decoding", every_s=0.0), clock=clock)
    update(0, 8, 0.0)  # starts the clock, draws nothing
    update(4, 8, 0.25)  # a quarter of the work (source tokens) in 10 s: 30 s left
    update(8, 8, 1.0)
    assert stream.getvalue().splitlines() == [
        "decoding 4/8: 0.4 sentences/s | elapsed 10s | ETA 30s",
        "decoding 8/8: 0.3 sentences/s | elapsed 30s | ETA 0s",
    ]
    bar = io.StringIO()  # on a terminal: the bar, redrawn in place
    update = decode_progress(ProgressLine(bar, tty=True, label="decoding"), clock=iter([0, 0, 5.0]).__next__)
    update(0, 4, 0.0)
    assert bar.getvalue() == ""  # nothing before the first batch
    update(2, 4, 0.5)
    assert bar.getvalue() == (
        "\r\033[Kdecoding 2/4 [############------------] 0.4 sentences/s | elapsed 5s | ETA 5s"
    )
