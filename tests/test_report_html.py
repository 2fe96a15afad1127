"""``attn-jax report``'s page in a real headless Chromium (Playwright): a hover shows the source word, target word
and weight of the data, switching a head redraws, nothing is fetched from the network, the significance equals
sacreBLEU's own command, and 3,000 sentences stay small and quick. Screenshots go to ``$ARTIFACTS_DIR`` or
``tests/artifacts/``."""

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from attn_jax import eval as ev
from attn_jax.eval import _html
from attn_jax.pipeline._attention_file import save_attention_arrays

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = os.environ.get("ARTIFACTS_DIR") or os.path.join(os.path.dirname(__file__), "artifacts")
WORDS = "the cat dog sat on a mat and ran far away from big red house".split()


def _browser_or_skip():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (the dev extra: make install)")
    if not os.path.exists(CHROMIUM):
        pytest.skip("no Debian chromium (make install installs it as root with apt; none here)")
    return sync_playwright


def fake_evaluation(directory, system, sources, references, hypotheses, *, layers=1, heads=1, seed=0):
    """An ``attn-jax evaluate`` output directory written without a model: sentences, ``evaluation.json`` with
    evaluate's own score objects, and an ``attention.npz`` of peaked random weights."""
    os.makedirs(directory, exist_ok=True)
    for name, lines in (("sources", sources), ("references", references), ("hypotheses", hypotheses)):
        with open(os.path.join(directory, f"{name}.txt"), "w", encoding="utf-8") as f:
            f.write("".join(s + "\n" for s in lines))
    evaluation = {
        "system": system,
        "corpus": "fake",
        "split": "test",
        "step": 1,
        "num_sentences": len(sources),
        "options": {"bleu_tokenize": None, "detokenize": "none"},
        "bleu_by_length": ev.bleu_by_length(hypotheses, references, sources).to_dict(),
        "chrf_by_length": ev.score_by_length("chrf", hypotheses, references, sources).to_dict(),
        "ter_by_length": ev.score_by_length("ter", hypotheses, references, sources).to_dict(),
        "length_limit": {"stopped_at_limit": 0},
    }
    with open(os.path.join(directory, "evaluation.json"), "w", encoding="utf-8") as f:
        json.dump(evaluation, f)
    rng = np.random.default_rng(seed)

    def peaked(t, s):
        logits = rng.normal(0, 5, (layers, heads, t + 1, s + 1))  # peaked, as trained attention is
        w = np.exp(logits - logits.max(-1, keepdims=True))
        return w / w.sum(-1, keepdims=True)

    views = {
        "hypothesis": [
            peaked(len(h.split()), len(s.split())) for s, h in zip(sources, hypotheses, strict=True)
        ],
        "reference": [
            peaked(len(r.split()), len(s.split())) for s, r in zip(sources, references, strict=True)
        ],
    }
    gold = [
        " ".join(f"{j % len(s.split())}-{j}" for j in range(len(r.split())))
        for s, r in zip(sources, references, strict=True)
    ]
    save_attention_arrays(
        os.path.join(directory, "attention.npz"),
        views,
        source_tokens=[s.split() for s in sources],
        target_tokens={
            "hypothesis": [h.split() for h in hypotheses],
            "reference": [r.split() for r in references],
        },
        gold=gold,
    )
    return directory


def fake_systems(root, n, seed=0):
    """Two fake systems (an RNN, one layer, one head; a Transformer, 2 layers, 4 heads) on ``n`` sentences."""
    rng = np.random.default_rng(seed)
    sources, refs, a, b = [], [], [], []
    for _ in range(n):
        length = int(rng.integers(3, 40))
        src = [WORDS[k] for k in rng.integers(0, len(WORDS), length)]
        ref = [w.upper() for w in src]
        sources.append(" ".join(src))
        refs.append(" ".join(ref))
        a.append(" ".join(w if rng.random() < 0.6 else "X" for w in ref))
        b.append(" ".join(w if rng.random() < 0.8 else "Y" for w in ref))
    return [
        ev.read_evaluated_run(
            fake_evaluation(os.path.join(root, "rnn"), "RNNsearch", sources, refs, a, seed=1)
        ),
        ev.read_evaluated_run(
            fake_evaluation(
                os.path.join(root, "tf"), "Transformer", sources, refs, b, layers=2, heads=4, seed=2
            )
        ),
    ]


def _page_data(path):
    page = open(path, encoding="utf-8").read()
    return json.loads(page.split('<script type="application/json" id="data">')[1].split("</script>")[0])


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    runs = fake_systems(str(root), 40)
    out = ev.write_report_html(runs, root / "report.html", bootstrap_samples=200)
    return out["path"], runs


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _browser_or_skip()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _quantised(run, view, i, layer, head):
    """The weights the page shows for one sentence: round(255 w) / 255, a head or the mean of heads."""
    z = run.attention
    shapes = z[f"{view}_shapes"]
    start = int(np.prod(shapes[:i], axis=1).sum())
    w = z[f"{view}_weights"][start : start + int(np.prod(shapes[i]))].astype(np.float32).reshape(shapes[i])
    q = np.clip(np.rint(w * 255), 0, 255) / 255
    return q[layer].mean(0) if head == "mean" else q[layer, head]


def _hover(pg, row, col):
    geo = pg.eval_on_selector(
        "#hm", "c => ({left: +c.dataset.left, top: +c.dataset.top, cell: +c.dataset.cell})"
    )
    x, y = geo["left"] + (col + 0.5) * geo["cell"], geo["top"] + (row + 0.5) * geo["cell"]
    pg.hover("#hm", position={"x": x, "y": y})
    pg.wait_for_selector("#tip", state="visible")
    return pg.inner_text("#tip-src"), pg.inner_text("#tip-tgt"), float(pg.inner_text("#tip-w"))


def test_click_hover_and_switch_head(page, browser):
    path, runs = page
    pg = browser.new_page()
    requests = []
    pg.on("request", lambda r: requests.append(r.url))
    pg.goto("file://" + path)
    pg.wait_for_selector("body[data-ready='1']")
    pg.click("#sentences tr[data-index='3']")
    pg.select_option("#hm-system", "1")
    pg.select_option("#hm-view", "reference")
    pg.select_option("#hm-layer", "1")
    pg.select_option("#hm-head", "2")
    pg.wait_for_function("document.getElementById('hm').dataset.head === '2'")
    tf = runs[1]
    src = tf.sources[3].split() + ["</s>"]
    ref = tf.references[3].split() + ["</s>"]
    w = _quantised(tf, "reference", 3, 1, 2)
    assert _hover(pg, 2, 1) == (src[1], ref[2], pytest.approx(float(w[2, 1]), abs=6e-4))
    pg.select_option("#hm-head", "0")
    pg.wait_for_function("document.getElementById('hm').dataset.head === '0'")
    w0 = _quantised(tf, "reference", 3, 1, 0)
    assert _hover(pg, 2, 1)[2] == pytest.approx(float(w0[2, 1]), abs=6e-4)
    pg.select_option("#hm-head", "mean")
    pg.wait_for_function("document.getElementById('hm').dataset.head === 'mean'")
    wm = _quantised(tf, "reference", 3, 1, "mean")
    assert _hover(pg, 0, 0)[2] == pytest.approx(float(wm[0, 0]), abs=6e-4)
    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, "report_heatmap.png")
    pg.screenshot(path=shot, full_page=True)
    print(f"screenshot: {shot}")
    # Nothing but the file itself: no CDN, no font, no fetch.
    assert requests == ["file://" + path], requests
    pg.close()


def test_filters_and_sort(page, browser):
    path, runs = page
    pg = browser.new_page()
    pg.goto("file://" + path)
    pg.wait_for_selector("body[data-ready='1']")
    a = np.array(_page_data(path)["systems"][0]["sentence_bleu"])
    b = np.array(_page_data(path)["systems"][1]["sentence_bleu"])
    pg.select_option("#cmp-rel", "worse")
    shown = [
        int(i) for i in pg.eval_on_selector_all("#sentences tr.row", "rs => rs.map(r => r.dataset.index)")
    ]
    assert shown == [i for i in range(len(a)) if a[i] < b[i]]
    pg.select_option("#cmp-rel", "any")
    pg.select_option("#bucket", "1")  # 10-19
    lengths = pg.eval_on_selector_all("#sentences tr.row", "rs => rs.map(r => +r.children[1].textContent)")
    assert lengths and all(10 <= n < 20 for n in lengths)
    pg.select_option("#bucket", "-1")
    pg.click("th[data-sort='length']")
    lengths = pg.eval_on_selector_all("#sentences tr.row", "rs => rs.map(r => +r.children[1].textContent)")
    assert lengths == sorted(lengths, reverse=True)
    pg.close()


def test_significance_equals_sacrebleus_own_test(page):
    # sacreBLEU's command line (-f json) cannot print these numbers (its JSON writer fails on float32), so the
    # test calls the class that command calls, with the command's metrics and seed.
    from sacrebleu.metrics import BLEU, CHRF, TER
    from sacrebleu.significance import PairedTest

    path, runs = page
    sig = _page_data(path)["significance"][0]["metrics"]
    systems = [("a", runs[0].hypotheses), ("b", runs[1].hypotheses)]
    metrics = {"BLEU": BLEU(), "chrF": CHRF(), "TER": TER()}
    _, scores = PairedTest(systems, metrics, [runs[0].references], test_type="bs", n_samples=200)()
    assert sorted(sig) == sorted(k for k in scores if k != "System") == ["BLEU", "TER", "chrF2"]
    for name in sig:
        base, other = scores[name]
        assert (sig[name]["a"], sig[name]["b"]) == (base.score, other.score)
        assert sig[name]["p"] == other.p_value and sig[name]["b_ci"] == pytest.approx(other.ci)


def test_significance_equals_the_sacrebleu_command(page, tmp_path):
    # The command reads the same sentences from files and prints its table as text: score (mean ± 95 % CI) per
    # system and metric, then the p-values. Its rounding (one decimal, p to four) bounds the comparison.
    path, runs = page
    sig = _page_data(path)["significance"][0]["metrics"]
    files = {}
    for name, lines in (("ref", runs[0].references), ("a", runs[0].hypotheses), ("b", runs[1].hypotheses)):
        files[name] = tmp_path / name
        files[name].write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    sacrebleu = [sys.executable, "-m", "sacrebleu", str(files["ref"]), "-i", str(files["a"]), str(files["b"])]
    args = ["-m", "bleu", "chrf", "ter", "--paired-bs", "--paired-bs-n", "200", "-f", "text"]
    table = subprocess.run(sacrebleu + args, capture_output=True, text=True, check=True).stdout
    cells = re.findall(r"([\d.]+) \(([\d.]+) ± ([\d.]+)\)", table)
    p_values = [float(p) for p in re.findall(r"\(p = ([\d.]+)\)", table)]
    assert len(cells) == 6 and len(p_values) == 3, table
    for k, name in enumerate(("BLEU", "chrF2", "TER")):
        (a, a_mean, _), (b, b_mean, b_ci) = cells[k], cells[3 + k]
        got = sig[name]
        assert [round(got[x], 1) for x in ("a", "a_mean", "b", "b_mean", "b_ci")] == pytest.approx(
            [float(a), float(a_mean), float(b), float(b_mean), float(b_ci)], abs=0.051
        ), name
        assert round(got["p"], 4) == pytest.approx(p_values[k], abs=1e-4), name


@pytest.mark.slow
def test_3000_sentences_small_and_quick(tmp_path, browser):
    runs = fake_systems(str(tmp_path), 3000)
    t0 = time.perf_counter()
    out = ev.write_report_html(runs, tmp_path / "report.html", bootstrap_samples=100)
    write_s = time.perf_counter() - t0
    pg = browser.new_page()
    t0 = time.perf_counter()
    pg.goto("file://" + out["path"])
    pg.wait_for_selector("body[data-ready='1']")
    render_s = time.perf_counter() - t0
    pg.click("#sentences tr[data-index='0']")
    pg.wait_for_function("document.getElementById('hm').dataset.index === '0'")
    pg.close()
    print(
        f"3000 sentences: {out['bytes'] / 1e6:.1f} MB, written in {write_s:.1f} s, rendered in {render_s:.2f} s"
    )
    assert out["bytes"] < 20e6
    assert render_s < 3.0


def test_sacrebleus_tokenised_text_warning_is_said_once(tmp_path, caplog):
    """Tokenised outputs (sentences ending in " .") make sacreBLEU warn at every scoring of the bootstrap, three
    lines each time; the report says it once, with the count, and lets every other sacreBLEU record through."""
    n = 120
    sources = [f"w{i % 7} w{i % 5} ." for i in range(n)]
    refs = [s.upper() for s in sources]
    hyps = [r.replace("W1", "X") for r in refs]
    runs = [
        ev.read_evaluated_run(fake_evaluation(str(tmp_path / name), name, sources, refs, h, seed=1))
        for name, h in (("A", hyps), ("B", refs), ("C", hyps[::-1]))
    ]
    caplog.clear()  # building the fake runs scores them too
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        ev.write_report_html(runs, tmp_path / "report.html", bootstrap_samples=20)
    messages = [r.getMessage() for r in caplog.records if r.name == "sacrebleu"]
    assert not [m for m in messages if "forgot to detokenize" in m], messages
    once = [m for m in messages if "tokenized period" in m]
    assert len(once) == 1 and once[0].startswith("sacreBLEU warned 6 times"), messages
    # The filter holds back only those three lines.
    other = logging.LogRecord("sacrebleu", logging.WARNING, __file__, 0, "BLEU: effective order", None, None)
    assert _html._TokenisedWarning().filter(other)
