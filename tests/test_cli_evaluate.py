"""``attn-jax evaluate`` / ``evaluate_workdir``: files and tables agree with sacreBLEU on the written sentences,
AER with the teacher-forced attention, PNG heatmaps are valid, errors are one line."""

import json
import math
import os
import struct

import numpy as np
import pytest
import sacrebleu

from attn_jax.cli import main
from attn_jax.pipeline import DecodeOptions, evaluate_workdir, load_model, load_split, select_examples
from tests.test_cli_translate import make_run


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("run"))
    out = tmp_path_factory.mktemp("eval")
    result = evaluate_workdir(
        run, split="test", decode=DecodeOptions(beam_size=2), max_examples=9, out_dir=out, num_heatmaps=2
    )
    return run, str(out), result


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def test_select_examples_spreads_over_length_buckets():
    sources = ["w " * n for n in (3, 4, 12, 13, 25, 70, 71, 5)]
    assert select_examples(sources, None) == list(range(8))
    assert select_examples(sources, 4) == [0, 2, 4, 5]  # one from each non-empty bucket, corpus order
    assert select_examples(sources, 6) == [0, 1, 2, 3, 4, 5]


def test_bleu_files_and_tables_agree_with_sacrebleu(evaluated):
    run, out, r = evaluated
    hyps = _lines(os.path.join(out, "hypotheses.txt"))
    refs = _lines(os.path.join(out, "references.txt"))
    srcs = _lines(os.path.join(out, "sources.txt"))
    assert len(hyps) == len(refs) == len(srcs) == r["num_sentences"] == 9
    # The sentences are the generated test split's, and the hypotheses are the model's beam-2 translations.
    corpus = load_split(load_model(run).config, "test")
    assert all(s in corpus.sources for s in srcs)
    assert {len(s.split()) // 10 for s in srcs} >= {0, 1, 2, 3, 4, 5}  # spread over the buckets
    expected = sacrebleu.corpus_bleu(hyps, [refs])
    assert r["bleu"] == pytest.approx(expected.score, rel=1e-9, abs=1e-9)
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary[r["system"]]["bleu"]["bleu"] == pytest.approx(expected.score, rel=1e-9, abs=1e-9)
    assert r["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    by_len = json.load(open(os.path.join(out, "bleu_by_length.json")))
    for row in by_len["rows"][:-1]:
        lo, _, hi = row["bucket"].partition("-")
        lo, hi = int(lo.rstrip("+")), (int(hi) if hi else math.inf)
        keep = [i for i, s in enumerate(srcs) if lo <= len(s.split()) <= hi]
        assert row["sentences"][r["system"]] == len(keep)
        if keep:
            want = sacrebleu.corpus_bleu([hyps[i] for i in keep], [[refs[i] for i in keep]]).score
            assert row["bleu"][r["system"]] == pytest.approx(want, rel=1e-9, abs=1e-9)
        else:
            assert row["bleu"][r["system"]] is None
    md = open(os.path.join(out, "bleu_by_length.md")).read()
    assert f"| all | 9 | {expected.score:.2f} |" in md and "sacreBLEU: nrefs:1" in md
    assert "BLEU (No UNK)" in open(os.path.join(out, "summary.md")).read()
    full = json.load(open(os.path.join(out, "evaluation.json")))
    assert full["bleu"] == r["bleu"] and full["step"] == 1 and full["options"]["beam_size"] == 2
    # No UNK: the sentences whose source and reference map to no <unk> in the run's vocabularies.
    loaded = load_model(run)
    keep = [
        i
        for i in range(9)
        if 3 not in loaded.src_vocab.encode(srcs[i]) and 3 not in loaded.tgt_vocab.encode(refs[i])
    ]
    assert r["no_unk"]["sentences"] == len(keep)


def test_aer_uses_teacher_forced_attention_on_the_reference(evaluated):
    """alignments.txt = argmax of the model's attention reading the reference (recomputed unbatched here);
    AER = the hand count against the corpus' gold links."""
    run, out, r = evaluated
    loaded = load_model(run)
    srcs = _lines(os.path.join(out, "sources.txt"))
    refs = _lines(os.path.join(out, "references.txt"))
    links = _lines(os.path.join(out, "alignments.txt"))
    corpus = load_split(loaded.config, "test")
    gold = {s: a for s, a in zip(corpus.sources, corpus.alignments, strict=True)}
    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    k = max(range(9), key=lambda i: len(srcs[i].split()))  # the longest: the widest padding in the batch
    src = np.asarray([[*sv.encode(srcs[k]), sv.eos_id]], np.int32)
    tgt_in = np.asarray([[tv.bos_id, *tv.encode(refs[k])]], np.int32)
    _, w = loaded.model(src, np.ones_like(src, bool), tgt_in)
    w = np.asarray(w[0])[: len(refs[k].split()), : len(srcs[k].split())]
    want = " ".join(f"{i}-{j}" for i, j in sorted((int(np.argmax(w[j])), j) for j in range(w.shape[0])))
    assert links[k] == want
    hits = hyp = ref = 0
    for s, a in zip(srcs, links, strict=True):
        h = {tuple(map(int, x.split("-"))) for x in a.split()}
        g = {tuple(map(int, x.split("-"))) for x in gold[s].split()}
        hits, hyp, ref = hits + len(h & g), hyp + len(h), ref + len(g)
    assert r["aer"]["aer"] == pytest.approx(1 - 2 * hits / (hyp + ref), abs=1e-12)


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_heatmaps_are_valid_pngs_of_the_right_size(evaluated):
    from attn_jax.eval import attention_figsize

    _, out, r = evaluated
    srcs = _lines(os.path.join(out, "sources.txt"))
    refs = _lines(os.path.join(out, "references.txt"))
    hyps = _lines(os.path.join(out, "hypotheses.txt"))
    # Heatmap 0 (Figure 3's rule): the longest sentence within the training lengths translated exactly, or, if
    # none is, the longest within them; the last heatmap: the longest beyond them with at most 40 words.
    limit = r["training_max_source_length"]
    within = [k for k, s in enumerate(srcs) if len(s.split()) <= limit]
    exact = [k for k in within if hyps[k].split() == refs[k].split()]
    k = max(exact or within, key=lambda k: (len(srcs[k].split()), -k))
    longest = srcs[k]
    assert r["heatmaps"][0]["kind"] == ("correct" if exact else "within")
    assert r["heatmaps"][0]["words"] == len(longest.split())
    beyond = [k for k, s in enumerate(srcs) if limit < len(s.split()) <= 40]
    if beyond:
        last = max(beyond, key=lambda k: (len(srcs[k].split()), -k))
        assert r["heatmaps"][-1] == {
            "file": f"attention_{len(r['heatmaps']) - 1}.png",
            "index": r["heatmaps"][-1]["index"],
            "words": len(srcs[last].split()),
            "kind": "beyond",
        }
    w, h = _png_size(os.path.join(out, "attention_0_reference.png"))
    fw, fh = attention_figsize(len(longest.split()) + 1, len(refs[k].split()) + 1)
    assert (w, h) == (round(fw * 100), round(fh * 100))
    hyp_words = _lines(os.path.join(out, "hypotheses.txt"))[k].split()
    w, h = _png_size(os.path.join(out, "attention_0.png"))
    fw, fh = attention_figsize(len(longest.split()) + 1, len(hyp_words) + 1)
    assert (w, h) == (round(fw * 100), round(fh * 100))
    for name in ("attention_1.png", "attention_1_reference.png", "bleu_by_length.png"):
        assert _png_size(os.path.join(out, name)) > (0, 0)
    assert "![attention_0.png](attention_0.png)" in open(os.path.join(out, "evaluation.md")).read()


def test_pngs_are_images_in_the_runs_tensorboard_log(evaluated):
    """TensorBoard's own reader finds every PNG of the evaluation as an image at the checkpoint's step, at the
    PNG's size and with its pixels."""
    import io

    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, out, r = evaluated
    logdir = os.path.join(run, "tensorboard", "eval")
    assert r["tensorboard"]["logdir"] == logdir and r["tensorboard"]["step"] == r["step"] == 1
    pngs = sorted(f for f in os.listdir(out) if f.endswith(".png"))
    assert "bleu_by_length.png" in pngs and "attention_0.png" in pngs
    acc = EventAccumulator(logdir, size_guidance={"images": 0})
    acc.Reload()
    assert (
        sorted(acc.Tags()["images"])
        == sorted(f"eval/test/{f[:-4]}" for f in pngs)
        == r["tensorboard"]["tags"]
    )
    for f in pngs:
        (event,) = acc.Images(f"eval/test/{f[:-4]}")
        assert event.step == r["step"]
        assert (event.width, event.height) == _png_size(os.path.join(out, f))
        with (
            Image.open(io.BytesIO(event.encoded_image_string)) as got,
            Image.open(os.path.join(out, f)) as want,
        ):
            assert np.array_equal(np.asarray(got), np.asarray(want)), f


def test_cli_prints_tables_and_fails_in_one_line(evaluated, tmp_path, capsys):
    run, _, r = evaluated
    out = tmp_path / "cli"
    status = main(["evaluate", "--workdir", run, "--beam", "2", "--max-examples", "9", "--out", str(out)])
    printed, err = capsys.readouterr()
    assert status == 0, err
    assert "| source length | sentences | RNNsearch |" in printed and "| 60+ |" in printed
    assert f"BLEU = {r['bleu']:.2f} (9 sentences; nrefs:1|" in printed
    assert "AER = " in printed and "BLEU (No UNK)" in printed
    assert f"chrF = {r['chrf']:.2f} (9 sentences; nrefs:1|" in printed
    assert f"TER = {r['ter']:.2f} (9 sentences; nrefs:1|" in printed
    assert _lines(out / "hypotheses.txt") == _lines(os.path.join(evaluated[1], "hypotheses.txt"))

    # --heatmap-sentences draws the sentences named (split indices), in that order, instead of the Figure 3 rule
    chosen = [h["index"] for h in r["heatmaps"]][::-1]
    argv = [
        "evaluate",
        "--workdir",
        run,
        "--beam",
        "2",
        "--max-examples",
        "9",
        "--out",
        str(tmp_path / "chosen"),
    ]
    assert main([*argv, "--heatmap-sentences", ",".join(map(str, chosen))]) == 0, capsys.readouterr()[1]
    capsys.readouterr()
    drawn = json.loads((tmp_path / "chosen" / "evaluation.json").read_text())["heatmaps"]
    assert [h["index"] for h in drawn] == chosen and {h["kind"] for h in drawn} == {"chosen"}
    assert all((tmp_path / "chosen" / h["file"]).exists() for h in drawn)

    for argv, fragment in (
        (
            ["--workdir", run, "--max-examples", "9", "--heatmap-sentences", "99999"],
            "99999 are not among the 9",
        ),
        (["--workdir", str(tmp_path / "missing")], "no such run directory"),
        (["--workdir", str(tmp_path)], "no checkpoint"),
        (["--workdir", run, "--split", "nosuchsplit"], "nosuchsplit"),
    ):
        status = main(["evaluate", *argv])
        _, err = capsys.readouterr()
        lines = [line for line in err.splitlines() if line.strip()]
        assert status == 1 and len(lines) == 1 and lines[0].startswith("attn-jax evaluate: error: "), err
        assert fragment in lines[0]
    assert main(["evaluate", "--workdir", run, "--max-examples", "0"]) == 2


def test_chrf_and_ter_agree_with_sacrebleu_overall_and_by_length(evaluated):
    """summary.json, evaluation.json, the Markdown and the TensorBoard scalars hold sacreBLEU's own corpus chrF
    and TER of the written hypotheses and references, overall and per source-length bucket."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, out, r = evaluated
    hyps = _lines(os.path.join(out, "hypotheses.txt"))
    refs = _lines(os.path.join(out, "references.txt"))
    srcs = _lines(os.path.join(out, "sources.txt"))
    metrics = {"chrf": sacrebleu.metrics.CHRF(), "ter": sacrebleu.metrics.TER()}
    summary = json.load(open(os.path.join(out, "summary.json")))[r["system"]]
    full = json.load(open(os.path.join(out, "evaluation.json")))
    md = open(os.path.join(out, "evaluation.md")).read()
    for name, metric in metrics.items():
        want = metric.corpus_score(hyps, [refs]).score
        assert r[name] == full[name] == pytest.approx(want, rel=1e-9, abs=1e-9)
        assert summary[name]["score"] == pytest.approx(want, rel=1e-9, abs=1e-9)
        assert summary[name]["signature"] == str(metric.get_signature())
        for row in summary[name]["buckets"]:
            hi = math.inf if row["high"] is None else row["high"]
            keep = [i for i, s in enumerate(srcs) if row["low"] <= len(s.split()) < hi]
            assert row["sentences"] == len(keep)
            if keep:
                sub = metric.corpus_score([hyps[i] for i in keep], [[refs[i] for i in keep]]).score
                assert row["score"] == pytest.approx(sub, rel=1e-9, abs=1e-9), (name, row["bucket"])
            else:
                assert row["score"] is None
        assert full[f"{name}_by_length"] == summary[name]
    chrf, ter = r["chrf"], r["ter"]
    assert f"| all | 9 | {chrf:.2f} | {ter:.2f} |" in md
    assert f"| all | 9 | {chrf:.2f} | {ter:.2f} |" in open(os.path.join(out, "summary.md")).read()
    acc = EventAccumulator(os.path.join(run, "tensorboard", "eval"), size_guidance={"scalars": 0})
    acc.Reload()
    for name, want in (("bleu", r["bleu"]), ("chrf", chrf), ("ter", ter)):
        event = acc.Scalars(f"eval/test/{name}")[0]  # the fixture's; the CLI test evaluates again later
        assert event.step == r["step"] and event.value == pytest.approx(want, rel=1e-6)
