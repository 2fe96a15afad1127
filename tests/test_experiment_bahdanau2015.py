"""experiments/bahdanau2015/run.py: the smoke run trains all three systems and writes a report with every section filled."""

import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(REPO, "experiments", "bahdanau2015", "run.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SECTIONS = (
    "## BLEU by source sentence length",
    "## Overall BLEU, No-UNK BLEU, AER",
    "## The paper's findings, checked on this run",
    "## This run against the seed study",
    "## RNNsearch attention on test sentences (Figure 3)",
    "## Transformer cross-attention on test sentences",
    "## Sentence by sentence",
    "## Wall times",
    "## Seeds",
    "## Configs",
    "## Versions",
    "## Machine",
    "## Files",
)


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC


def test_paper_preset_prints_commands_without_training(tmp_path):
    p = subprocess.run(
        [sys.executable, RUN, "--preset", "paper", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert "configs/rnnenc50.py" in p.stdout and "configs/rnnsearch50.py" in p.stdout
    assert "accelerator" in p.stdout
    assert not os.path.exists(tmp_path / "report.md")


def _cores():
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The smoke demo as `make demo` runs it: with two or more cores, each system in a process on one core."""
    out = tmp_path_factory.mktemp("smoke") / "demo"
    p = subprocess.run(
        [sys.executable, RUN, "--smoke", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out, p


@pytest.mark.slow
def test_smoke_run_writes_a_complete_report(smoke_run):
    out, p = smoke_run
    report = out / "report.md"
    assert f"report written to {report}" in p.stdout
    text = report.read_text(encoding="utf-8")
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "[report.html](report.html)" in text and all(
        f'"name":"{s}"' in page for s in ("RNNenc", "RNNsearch", "Transformer")
    )

    positions = [text.find(s) for s in SECTIONS]
    assert all(i >= 0 for i in positions), [s for s, i in zip(SECTIONS, positions, strict=True) if i < 0]
    assert positions == sorted(positions)
    sections = dict(zip(SECTIONS, re.split(r"\n## ", text)[1:], strict=True))

    # Three systems' columns in the BLEU-by-length table, one row per paper bucket plus "all".
    by_length = sections["## BLEU by source sentence length"]
    assert re.search(
        r"^\| source length \| sentences \| RNNenc \| RNNsearch \| Transformer \|$", by_length, re.M
    )
    rows = re.findall(r"^\| (0-9|10-19|20-29|30-39|40-49|50-59|60\+|all) \|", by_length, re.M)
    assert rows == ["0-9", "10-19", "20-29", "30-39", "40-49", "50-59", "60+", "all"]
    all_row = re.search(r"^\| all \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", by_length, re.M)
    assert all_row and int(all_row.group(1)) == 7

    # Summary: all systems; RNNsearch and the Transformer have an AER number, RNNenc (no attention) does not.
    summary = sections["## Overall BLEU, No-UNK BLEU, AER"]
    enc = re.search(r"^\| RNNenc \| ([\d.]+) \|.*$", summary, re.M)
    search = re.search(
        r"^\| RNNsearch \| ([\d.]+) \|.*\| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", summary, re.M
    )
    transformer = re.search(
        r"^\| Transformer \| ([\d.]+) \|.*\| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", summary, re.M
    )
    assert enc and search and transformer
    assert 0.0 <= float(search.group(2)) <= 100.0 and 0.0 <= float(transformer.group(2)) <= 100.0

    # The three findings are checked (a smoke model need not hold them) and stated with their evidence; a smoke
    # run has no range check, and says why.
    found = sections["## The paper's findings, checked on this run"]
    rows = re.findall(r"^\| (RNNsearch[^|]*) \| (yes|\*\*no\*\*) \| (.+) \|$", found, re.M)
    assert [r[0] for r in rows] == [
        "RNNsearch beats RNNenc in every length bucket",
        "RNNsearch degrades less with length",
        "RNNsearch's attention is an alignment",
    ]
    assert "gold hit" in rows[2][2] and "AER within the training" in rows[2][2]
    assert "No range check: a smoke run" in sections["## This run against the seed study"]
    results = json.loads((out / "results.json").read_text())
    assert [f["name"] for f in results["findings"]] == [r[0] for r in rows]
    assert results["systems"]["RNNsearch"]["gold_hit"] is not None
    assert set(results["systems"]["RNNsearch"]["bleu_by_bucket"]) >= {"0-9", "60+"}

    # Every linked picture exists and is a PNG: the BLEU-by-length plot and the heatmaps evaluate picked by the
    # Figure 3 rule (smoke models translate nothing exactly: the longest within the training lengths, 14 words,
    # fill in, then one beyond them), each with its caption.
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert "bleu_by_length.png" in links
    picks = json.loads((out / "rnnsearch_cpu" / "eval" / "test" / "evaluation.json").read_text())["heatmaps"]
    assert [p["kind"] for p in picks][-1] == "beyond" and all(p["words"] > 14 for p in picks[-1:])
    assert (
        all(p["kind"] in ("correct", "within") and p["words"] <= 14 for p in picks[:-1]) and len(picks) >= 2
    )
    fig3 = sections["## RNNsearch attention on test sentences (Figure 3)"]
    heatmaps = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", fig3)
    assert len(heatmaps) == len(picks) and all("rnnsearch" in h and "attention_" in h for h in heatmaps)
    assert fig3.count("(the failure case)") == 1 and "at most 14 source words" in fig3
    # The Transformer's: per sentence, the head average and one head.
    tf_maps = re.findall(
        r"!\[[^\]]*\]\(([^)]+)\)", sections["## Transformer cross-attention on test sentences"]
    )
    assert all("transformer" in h for h in tf_maps) and len(tf_maps) >= 4
    assert sum(h.endswith("_head.png") for h in tf_maps) == len(tf_maps) // 2
    for link in links:
        assert _is_png(out / link), link

    # Wall times: a positive number of seconds for both systems' training and evaluation.
    times = sections["## Wall times"]
    for system in ("RNNenc", "RNNsearch", "Transformer"):
        m = re.search(rf"^\| {system} \| ([\d.]+) s .*\| ([\d.]+) s .*\| 30 \| 30 \|$", times, re.M)
        assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, system
    # How the systems ran: in parallel processes, one core each, wherever two or more cores are usable.
    parallel = len(_cores()) >= 2
    if parallel:
        assert "Each system ran in its own process on one core, 2 at a time (`--jobs`)" in times
        assert [line.split()[1] for line in p.stdout.splitlines() if "started on core" in line] == [
            "RNNsearch:",
            "Transformer:",
            "RNNenc:",
        ]
        assert (out / "rnnsearch_cpu.log").read_text().startswith("== RNNsearch: training")
    else:
        assert "The systems ran one after another in one process on 1 core(s)" in times
    assert json.loads((out / "results.json").read_text())["threads"] == {
        s: 1 for s in ("RNNenc", "RNNsearch", "Transformer")
    }
    # The phase table: train, evaluate and report phases, a compile count, and phases summing to at most the
    # total times the processes that ran at once (a phase's wall seconds are summed over the processes).
    phases = dict(
        re.findall(
            r"^\| (train|decode \+ evaluate|report|total(?: \(elapsed\))?) \| ([\d.]+) \|", times, re.M
        )
    )
    total = "total (elapsed)" if parallel else "total"
    assert set(phases) == {"train", "decode + evaluate", "report", total}, phases
    parts = sum(float(phases[k]) for k in ("train", "decode + evaluate", "report"))
    assert 0 < parts <= (2 if parallel else 1) * float(phases[total]) + 0.1  # rows are rounded to 0.1 s each
    compiles = re.search(r"^\| compile \((\d+) programs", times, re.M)
    assert compiles and int(compiles.group(1)) > 0

    # Seeds, configs (the smoke sizes), versions and machine.
    assert sections["## Seeds"].count("`seed=0`") == 3
    configs = sections["## Configs"]
    for arch in ("rnnenc", "rnnsearch", "transformer"):
        assert f'"model.arch": "{arch}"' in configs, arch
    assert configs.count('"num_train_steps": 30') == 3 and configs.count('"model.hidden": 24') == 2
    versions = sections["## Versions"]
    for package in ("python", "jax", "flax", "optax", "orbax-checkpoint", "sacrebleu"):
        m = re.search(rf"^\| {re.escape(package)} \| (\S+) \|$", versions, re.M)
        assert m and m.group(1) != "not" and m.group(1)[0].isdigit(), package
    machine = sections["## Machine"]
    assert re.search(rf"^\| cpu_count \| {os.cpu_count()} \|$", machine, re.M)
    assert re.search(r"^\| platform \| \S+", machine, re.M)
    assert "rnnenc_cpu/" in sections["## Files"] and "rnnsearch_cpu/eval/test/" in sections["## Files"]
    assert "transformer_cpu/eval/test/" in sections["## Files"]


def test_systems_flag_rejects_an_unknown_system(tmp_path):
    p = subprocess.run(
        [sys.executable, RUN, "--systems", "RNNsearch,GPT", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert "--systems" in p.stderr and "'GPT'" in p.stderr and "Transformer" in p.stderr
    assert not os.path.exists(tmp_path / "report.md")


@pytest.mark.slow
def test_parallel_jobs_give_the_numbers_of_one_process_on_one_core(smoke_run, tmp_path):
    """Each parallel job runs on one core, as the seed study's runs do (seeds.py --threads 1 runs run.py --jobs 1
    pinned to one core): the same XLA thread count, so the same numbers to the last bit."""
    cores = _cores()
    if len(cores) < 2:
        pytest.skip("one usable core: the demo runs in one process anyway")
    out, _ = smoke_run
    alone = tmp_path / "alone"
    argv = [RUN, "--smoke", "--jobs", "1", "--systems", "RNNenc,RNNsearch", "--out", str(alone)]
    pinned = (  # pinned to one core before JAX starts, as seeds.py --threads 1 pins it
        f"import os, runpy, sys; os.sched_setaffinity(0, {{{cores[-1]}}}); sys.argv = {argv!r}; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    p = subprocess.run([sys.executable, "-c", pinned], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "[RNNsearch]" not in p.stdout and "started on core" not in p.stdout
    parallel = json.loads((out / "results.json").read_text())["systems"]
    one = json.loads((alone / "results.json").read_text())["systems"]
    for system in ("RNNenc", "RNNsearch"):
        assert one[system] == parallel[system], system
    for name in ("rnnenc_cpu", "rnnsearch_cpu"):
        hyps = ("eval", "test", "hypotheses.txt")
        assert (alone / name).joinpath(*hyps).read_bytes() == (out / name).joinpath(*hyps).read_bytes(), name
