"""Standard BLEU on real text (issue 15 item 6): Moses-tokenised hypotheses and references scored detokenised
equal sacreBLEU on the raw text, ``tokenize="none"`` equals sacreBLEU's ``tok:none``, the signature says which,
and ``attn-jax evaluate`` takes the flags, records them and warns once about tokenised text nobody chose a
setting for, while the built-in corpus scores exactly as before.

sacreBLEU scores the raw text and sacremoses tokenises it: both are independent of the code under test."""

import doctest
import json
import logging

import pytest
import sacrebleu
from sacremoses import MosesDetokenizer, MosesTokenizer

from attn_jax import eval as ev
from attn_jax.cli import build_parser, main
from attn_jax.eval import _bleu, _detok
from attn_jax.pipeline import _bleu as _pipeline_bleu
from attn_jax.pipeline import bleu_options
from attn_jax.pipeline._bleu import _without_sacrebleu_tokenized_warning
from tests.test_cli_translate import make_run

# Apostrophes, quotes, clitics, brackets, a decimal, a percent sign: what Moses tokenises apart.
RAW_REFS = [
    "The cat's toy, it seems, is lost.",
    'She said "no" twice -- then left!',
    "Don't worry: it's only 3.5 km (about 2 miles).",
    "Is this the 'right' one?",
    "We'll meet at Bob's place on Monday.",
    "Prices rose 5% in 2023; analysts weren't surprised.",
]
RAW_HYPS = [
    "The cat's toy, it seems, was lost.",
    'She said "no" once -- then left!',
    "Don't worry: it's just 3.5 km (about two miles).",
    "Is that the 'right' one?",
    "We will meet at Bob's house on Monday.",
    "Prices rose 5% in 2023; analysts weren't surprised at all.",
]
RAW_FR_REFS = ["L'ordinateur, dit-il, est en panne.", "Qu'est-ce que c'est ?", "Il a dit : « non »."]
RAW_FR_HYPS = ["L'ordinateur, dit-elle, est en panne.", "Qu'est-ce que c'est ?", "Il a dit : « oui »."]


def _signature(hyps, refs, **kwargs):
    """sacreBLEU's own signature for scoring these sentences (it knows ``nrefs`` only after scoring)."""
    metric = sacrebleu.BLEU(**kwargs)
    metric.corpus_score(hyps, [refs])
    return str(metric.get_signature())


def _tok(sentences, lang="en"):
    tokenizer = MosesTokenizer(lang)
    return [tokenizer.tokenize(s, return_str=True, escape=True) for s in sentences]


def test_moses_round_trip_precondition():
    # The premise of every comparison below: Moses' detokeniser undoes its tokeniser on these sentences.
    for raw, lang in ((RAW_REFS + RAW_HYPS, "en"), (RAW_FR_REFS + RAW_FR_HYPS, "fr")):
        tokenised = _tok(raw, lang)
        assert all(t != r for t, r in zip(tokenised, raw, strict=True))  # tokenising changed every one
        detok = MosesDetokenizer(lang)
        assert [detok.detokenize(t.split()) for t in tokenised] == raw


@pytest.mark.parametrize(
    ("hyps", "refs", "lang"), [(RAW_HYPS, RAW_REFS, "en"), (RAW_FR_HYPS, RAW_FR_REFS, "fr")]
)
def test_detokenised_bleu_equals_sacrebleu_on_raw_text(hyps, refs, lang):
    tok_hyps, tok_refs = _tok(hyps, lang), _tok(refs, lang)
    want = sacrebleu.corpus_bleu(hyps, [refs])
    assert 0 < want.score < 100  # not trivially equal

    got = ev.corpus_bleu(tok_hyps, tok_refs, detokenize="moses", detokenize_lang=lang)
    assert got.score == want.score
    assert (got.hyp_len, got.ref_len) == (want.sys_len, want.ref_len)
    assert got.signature == f"{_signature(hyps, refs)}|detok:moses-{lang}"
    assert got.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")

    # Without detokenising, 13a on the tokenised text is another number, and the signature does not claim more.
    plain = ev.corpus_bleu(tok_hyps, tok_refs)
    assert plain.score != want.score and "detok" not in plain.signature

    # The same holds for the functions evaluate calls: by length, each bucket, and No UNK.
    by_len = ev.bleu_by_length(
        tok_hyps,
        tok_refs,
        lengths=[3, 15, 3, 15, 3, 15][: len(hyps)],
        detokenize="moses",
        detokenize_lang=lang,
    )
    assert by_len.overall.score == want.score and by_len.signature.endswith(f"|detok:moses-{lang}")
    short = [k for k in range(len(hyps)) if k % 2 == 0]
    assert (
        by_len.buckets[0].bleu.score
        == sacrebleu.corpus_bleu([hyps[k] for k in short], [[refs[k] for k in short]]).score
    )
    assert all(b.bleu.signature.endswith(f"|detok:moses-{lang}") for b in by_len.buckets)
    flags = [k == 1 for k in range(len(hyps))]
    no_unk = ev.bleu_no_unk(
        tok_hyps,
        tok_refs,
        source_has_unk=flags,
        reference_has_unk=[False] * len(hyps),
        detokenize="moses",
        detokenize_lang=lang,
    )
    keep = [k for k in range(len(hyps)) if not flags[k]]
    assert no_unk.score == sacrebleu.corpus_bleu([hyps[k] for k in keep], [[refs[k] for k in keep]]).score


def test_bleu_tokenize_none_equals_sacrebleu_tok_none():
    tok_hyps, tok_refs = _tok(RAW_HYPS), _tok(RAW_REFS)
    want = sacrebleu.corpus_bleu(tok_hyps, [tok_refs], tokenize="none")
    got = ev.corpus_bleu(tok_hyps, tok_refs, tokenize="none")
    assert got.score == want.score and 0 < got.score < 100
    assert "|tok:none|" in got.signature and "detok" not in got.signature
    assert got.score != ev.corpus_bleu(tok_hyps, tok_refs).score


def test_detokenize_options_are_checked_and_documented():
    with pytest.raises(ValueError, match="detokenize must be one of"):
        ev.corpus_bleu(["a"], ["a"], detokenize="spm")
    with pytest.raises(ValueError, match="language code"):
        ev.corpus_bleu(["a"], ["a"], detokenize="moses", detokenize_lang="French")
    assert ev.detokenize(["a , b ."], "none") == ["a , b ."]
    assert ev.looks_tokenized(_tok(RAW_REFS)) and not ev.looks_tokenized(RAW_REFS)
    assert ev.looks_tokenized(_tok(RAW_FR_REFS, "fr")) and not ev.looks_tokenized(RAW_FR_REFS)
    assert not ev.looks_tokenized(["a b c", "d e"])  # no punctuation: nothing to tell
    for module in (_detok, _bleu, _pipeline_bleu):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0


def test_sacrebleu_tokenised_text_warning_is_replaced_while_evaluate_scores(caplog):
    # sacreBLEU warns (3 lines per scored set) from 100 hypotheses ending in " ."; evaluate says it once instead.
    hyps = ["the cat sat on the mat ."] * 120
    refs = ["the cat sat on a mat ."] * 120

    def sacrebleu_records():
        return [r for r in caplog.records if r.name == "sacrebleu"]

    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        ev.corpus_bleu(hyps, refs)
        assert len(sacrebleu_records()) == 3  # the precondition: the warning is there to be replaced
        caplog.clear()
        with _without_sacrebleu_tokenized_warning():
            score = ev.bleu_by_length(hyps, refs, lengths=[3] * 120).overall.score
        assert sacrebleu_records() == []
        assert score == sacrebleu.corpus_bleu(hyps, [refs]).score  # scores unchanged
        caplog.clear()
        ev.corpus_bleu(hyps, refs)
        assert len(sacrebleu_records()) == 3  # the filter is removed afterwards


# ---------------------------------------------------------------------------------------------- the CLI

# Sources in the tiny run's vocabulary (the smoke config's synthetic words); references: French, Moses-tokenised.
SOURCES = ["the dog slept .", "every monk stood , because the torch bit .", "the dog ate bananas ."]
REFS_TOK = _tok(
    ["L'enfant voit une tasse de thé, dit-il.", "Qu'est-ce que c'est ?", "Il a dit : « non »."], "fr"
)


def _evaluate(run, out, capsys, *flags):
    argv = ["evaluate", "--workdir", run, "--beam", "1", "--heatmaps", "0", "--out", str(out), *flags]
    status = main(argv)
    printed, err = capsys.readouterr()
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    (system,) = summary
    lines = lambda name: (out / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    return printed, err, summary[system], lines


def _bleu_warnings(err):
    return [line for line in err.splitlines() if "text that looks tokenised" in line]


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    (corpus / "test.en").write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
    overrides = (
        "data.corpus=plain",
        f"data.source_path={corpus}/{{split}}.en",
        f"data.target_path={corpus}/{{split}}.fr",
    )
    return make_run(tmp_path_factory.mktemp("run"), overrides=overrides), corpus


def test_evaluate_flags_reach_bleu_and_summary_and_warn_once(plain_run, tmp_path, capsys):
    run, corpus = plain_run
    (corpus / "test.fr").write_text("".join(r + "\n" for r in REFS_TOK), encoding="utf-8")

    # No flag on tokenised references: one stderr line naming both flags, the choice recorded everywhere.
    printed, err, scores, lines = _evaluate(run, tmp_path / "default", capsys)
    (warning,) = _bleu_warnings(err)
    assert warning.startswith("warning: BLEU is scored with tok:13a on text that looks tokenised")
    assert "--detokenize moses --detokenize-lang LANG" in warning and "--bleu-tokenize none" in warning
    assert scores["bleu_options"] == {
        "tokenize": "13a",
        "detokenize": "none",
        "detokenize_lang": None,
        "looks_tokenized": True,
        "warning": warning.removeprefix("warning: "),
    }
    hyps = lines("hypotheses.txt")
    assert lines("references.txt") == REFS_TOK and len(hyps) == 3
    assert scores["bleu"]["bleu"] == sacrebleu.corpus_bleu(hyps, [REFS_TOK]).score
    assert "**Warning:** BLEU is scored with tok:13a" in (tmp_path / "default" / "summary.md").read_text()

    # References made of the (deterministic) hypotheses' words, Moses-tokenised with punctuation, so that the
    # BLEU is neither 0 nor 100 and detokenising changes it.
    refs = [f"{' '.join(h.split()[:5])} , l&apos; {' '.join(h.split()[5:9])} ." for h in hyps]
    (corpus / "test.fr").write_text("".join(r + "\n" for r in refs), encoding="utf-8")

    printed, err, scores, lines = _evaluate(
        run, tmp_path / "detok", capsys, "--detokenize", "moses", "--detokenize-lang", "fr"
    )
    assert _bleu_warnings(err) == [] and lines("hypotheses.txt") == hyps and lines("references.txt") == refs
    detok = MosesDetokenizer("fr")
    raw_hyps = [detok.detokenize(h.split()) for h in hyps]
    raw_refs = [detok.detokenize(r.split()) for r in refs]
    want = sacrebleu.corpus_bleu(raw_hyps, [raw_refs])
    assert 0 < want.score < 100
    assert scores["bleu"]["bleu"] == want.score
    assert scores["bleu"]["bleu"] != sacrebleu.corpus_bleu(hyps, [refs]).score
    assert scores["bleu"]["signature"] == f"{_signature(raw_hyps, raw_refs)}|detok:moses-fr"
    assert scores["bleu_options"] == {
        "tokenize": "13a",
        "detokenize": "moses",
        "detokenize_lang": "fr",
        "looks_tokenized": True,
        "warning": None,
    }
    assert lines("hypotheses.detok.txt") == raw_hyps and lines("references.detok.txt") == raw_refs
    assert f"BLEU = {want.score:.2f} (3 sentences; nrefs:1|" in printed and "|detok:moses-fr)" in printed
    full = json.loads((tmp_path / "detok" / "evaluation.json").read_text(encoding="utf-8"))
    assert full["options"]["detokenize"] == "moses" and full["options"]["detokenize_lang"] == "fr"

    printed, err, scores, lines = _evaluate(run, tmp_path / "none", capsys, "--bleu-tokenize", "none")
    assert _bleu_warnings(err) == []
    assert scores["bleu"]["bleu"] == sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score
    assert "|tok:none|" in scores["bleu"]["signature"] and "|tok:none|" in printed
    assert scores["bleu_options"]["tokenize"] == "none" and scores["bleu_options"]["warning"] is None

    # Bad values are one error line and exit status 2, before anything is loaded.
    for flags, fragment in (
        (["--bleu-tokenize", "moses"], "--bleu-tokenize must be a sacreBLEU tokeniser"),
        (["--detokenize-lang", "French"], "--detokenize-lang must be a Moses language code"),
    ):
        status = main(["evaluate", "--workdir", run, *flags])
        _, err = capsys.readouterr()
        assert status == 2 and err.count("\n") == 1 and fragment in err, err
    text = " ".join(build_parser()._subparsers._group_actions[0].choices["evaluate"].format_help().split())
    assert (
        "--detokenize {none,moses}" in text
        and "--detokenize-lang LANG" in text
        and "--bleu-tokenize TOK" in text
    )


def test_built_in_corpus_scores_as_before(tmp_path, capsys):
    # The synthetic corpus (make demo): 13a on its tokens, no detokenising, no warning, sacreBLEU's own signature.
    run = make_run(tmp_path / "run")
    printed, err, scores, lines = _evaluate(run, tmp_path / "eval", capsys, "--max-examples", "4")
    hyps, refs = lines("hypotheses.txt"), lines("references.txt")
    assert scores["bleu"]["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert scores["bleu"]["signature"] == _signature(hyps, refs)
    assert _bleu_warnings(err) == []
    assert scores["bleu_options"] == {
        "tokenize": "13a",
        "detokenize": "none",
        "detokenize_lang": None,
        "looks_tokenized": True,
        "warning": None,
    }
    assert bleu_options(refs, built_in=False)["warning"] is not None  # only the built-in corpus is exempt
