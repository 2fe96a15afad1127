"""``evaluate --save-attention``'s ``attention.npz``: every layer and head of the Transformer on its own translation
equals what its beam search reported (their mean), the reference view equals the teacher-forced pass that AER
uses, and ``attn-jax report`` turns two real evaluations into a page."""

import json
import os

import numpy as np
import pytest

from attn_jax.cli import main
from attn_jax.eval import read_evaluated_run
from attn_jax.pipeline import DecodeOptions, evaluate_workdir, load_model, reference_cross_attention
from tests.test_cli_translate import make_run


def _views(run_dir):
    """``{view: [array [L, H, T, S] per sentence]}`` and the meta, read back as the report does."""
    z = read_evaluated_run(run_dir).attention
    out = {}
    for v in z["meta"]["views"]:
        shapes, flat = z[f"{v}_shapes"], z[f"{v}_weights"].astype(np.float32)
        ends = np.cumsum(np.prod(shapes, axis=1))
        out[v] = [c.reshape(s) for c, s in zip(np.split(flat, ends[:-1]), shapes, strict=True)]
    return out, z["meta"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    out = {}
    small = dict(d_model=16, heads=2, d_ff=24, encoder_layers=1, decoder_layers=2, max_length=48)
    for arch in ("rnnsearch", "transformer"):
        kw = dict(config_file="transformer_cpu", model=small) if arch == "transformer" else {}
        run = make_run(tmp_path_factory.mktemp(arch), arch=arch, **kw)
        result = evaluate_workdir(
            run,
            decode=DecodeOptions(beam_size=2),
            max_examples=7,
            num_heatmaps=0,
            save_attention=True,
            one_shape=True,
            out_dir=os.path.join(run, "eval", "test"),
        )
        out[arch] = (run, result)
    return out


def test_transformer_heads_average_to_the_search_attention(evaluated):
    run, result = evaluated["transformer"]
    views, meta = _views(os.path.join(run, "eval", "test"))
    assert meta["views"] == ["hypothesis", "reference"] and meta["heads"] > 1
    with open(os.path.join(run, "eval", "test", "hypotheses.txt"), encoding="utf-8") as f:
        hyps = f.read().splitlines()
    for w, tokens, hyp in zip(views["hypothesis"], meta["target_tokens"]["hypothesis"], hyps, strict=True):
        assert w.shape[:2] == (meta["layers"], meta["heads"]) and w.shape[2] == len(tokens) + 1
        assert tokens == hyp.split()
        # Stored as float16 (3 decimal digits): each row still sums to 1 within its rounding.
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=5e-3)


def test_reference_view_is_the_teacher_forced_pass(evaluated):
    run, _ = evaluated["transformer"]
    views, meta = _views(os.path.join(run, "eval", "test"))
    loaded = load_model(run)
    ev_dir = read_evaluated_run(run)
    for i, heads, _ in reference_cross_attention(loaded, ev_dir.sources, ev_dir.references):
        # float16 storage: a relative step of 2^-11 on weights <= 1.
        np.testing.assert_allclose(views["reference"][i], heads, atol=6e-4)
        assert meta["target_tokens"]["reference"][i] == ev_dir.references[i].split()


def test_rnn_has_one_layer_one_head(evaluated):
    run, result = evaluated["rnnsearch"]
    views, meta = _views(os.path.join(run, "eval", "test"))
    assert (meta["layers"], meta["heads"]) == (1, 1)
    assert result["options"]["save_attention"] is True
    assert all(w.shape[:2] == (1, 1) for v in views.values() for w in v)


def test_report_cli_on_two_real_evaluations(evaluated, tmp_path, capsys):
    runs = [evaluated[a][0] for a in ("rnnsearch", "transformer")]
    assert main(["report", *runs, "--out", str(tmp_path), "--bootstrap-samples", "50"]) == 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    data = json.loads(page.split('<script type="application/json" id="data">')[1].split("</script>")[0])
    assert [s["name"] for s in data["systems"]] == ["RNNsearch", "Transformer"]
    assert data["systems"][1]["attention"]["heads"] > 1
    assert "2 systems, 7 sentences" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 1
