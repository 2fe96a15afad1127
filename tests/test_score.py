"""``attn-jax score`` / ``score_pairs``: the log-probability of given translations equals the trainer's
teacher-forced NLL and the beam search's own log-probability of its hypotheses; errors are one line."""

import numpy as np
import pytest

from attn_jax.cli import main
from attn_jax.pipeline import load_model, score_pairs, translate_sentences
from tests.test_cli_translate import SENTENCES, make_run
from tests.tolerance import assert_close_f32

SOURCES = [s for s in SENTENCES if s]
TARGETS = [
    "le chien dormait .",
    ".",
    "le musée zzzqx",
    "chaque moine se tenait debout , parce que la torche .",
]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_model(make_run(tmp_path_factory.mktemp("run")))


@pytest.mark.numerics
def test_totals_equal_the_trainers_teacher_forced_nll(loaded):
    """Σ totals == -(eval_step's summed log-likelihood) with label smoothing 0, on one padded batch built
    here as the trainer's batches are (source + </s>, <s> + target, target + </s>)."""
    from flax import nnx

    from attn_jax.data import Batch
    from attn_jax.train import StepConfig, eval_step, model_config

    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    src_ids, tgt_ids = [sv.encode(s) for s in SOURCES], [tv.encode(t) for t in TARGETS]
    width = max(len(x) for x in src_ids + tgt_ids) + 3  # extra padding: it must change nothing
    rows = len(SOURCES)
    src = np.full((rows, width), sv.pad_id, np.int32)
    tgt_in, tgt_out = (np.full((rows, width), tv.pad_id, np.int32) for _ in range(2))
    for r, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        src[r, : len(s) + 1] = [*s, sv.eos_id]
        tgt_in[r, : len(t) + 1] = [tv.bos_id, *t]
        tgt_out[r, : len(t) + 1] = [*t, tv.eos_id]
    batch = Batch(
        src=src,
        src_len=np.array([len(s) + 1 for s in src_ids], np.int32),
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        tgt_len=np.array([len(t) + 1 for t in tgt_ids], np.int32),
        example_id=np.arange(rows, dtype=np.int32),
    )
    cfg = StepConfig(model=model_config(loaded.config, sv.size, tv.size), label_smoothing=0.0)
    params = nnx.to_pure_dict(nnx.state(loaded.model))
    sums = eval_step(params, batch, cfg).loss
    scores = score_pairs(loaded, SOURCES, TARGETS, batch_size=2)
    assert [s.tokens for s in scores] == [len(t) + 1 for t in tgt_ids]
    assert sum(s.tokens for s in scores) == int(sums.tokens)
    tokens = int(sums.tokens)
    assert_close_f32(sum(s.total for s in scores), -float(sums.nll), reduction=tokens * tv.size)
    for s in scores:
        assert s.per_token == pytest.approx(s.total / s.tokens, rel=1e-12) and s.total < 0
    assert [s.target_unk for s in scores] == [t.count(tv.unk_id) for t in tgt_ids]
    assert scores[2].target_unk > 0  # "zzzqx" is no target word


@pytest.mark.numerics
def test_totals_equal_the_nbest_log_probabilities_of_the_beam_search(loaded):
    """Each n-best hypothesis's ``log_prob`` (raw log P, not the length-normalised ``score``) is its score."""
    nbest = translate_sentences(loaded, SOURCES, beam_size=3, nbest=3)
    srcs = [s for s, hyps in zip(SOURCES, nbest, strict=True) for _ in hyps]
    hyps = [h for hs in nbest for h in hs]
    scores = score_pairs(loaded, srcs, [h.text for h in hyps], batch_size=4)
    assert [s.tokens for s in scores] == [len(h.ids) + 1 for h in hyps]
    longest = max(s.tokens for s in scores)
    assert_close_f32(
        [s.total for s in scores], [h.log_prob for h in hyps], reduction=longest * loaded.tgt_vocab.size
    )
    assert any(h.score != pytest.approx(h.log_prob) for h in hyps)  # the score compared is not the beam's


def test_cli_writes_total_and_per_token_and_fails_in_one_line(loaded, tmp_path, capsys, monkeypatch):
    src, tgt, out = tmp_path / "src.txt", tmp_path / "tgt.txt", tmp_path / "scores.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    tgt.write_text("\n".join(TARGETS) + "\n", encoding="utf-8")
    argv = ["score", "--workdir", loaded.workdir, "--src", str(src), "--tgt", str(tgt)]
    assert main([*argv, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    want = score_pairs(loaded, SOURCES, TARGETS)
    unk = sum(1 for s in want if s.target_unk)
    assert f"{unk} of 4 targets have words outside the target vocabulary" in err
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4
    for line, s in zip(lines, want, strict=True):
        total, per_token = map(float, line.split("\t"))
        assert total == pytest.approx(s.total, abs=1e-6) and per_token == pytest.approx(s.per_token, abs=1e-6)

    tgt.write_text("\n".join(TARGETS[:3]) + "\n", encoding="utf-8")
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"attn-jax score: error: {src} has 4 lines but {tgt} has 3; line k of each must form pair k"
    ]

    # A pair longer than the model can read is refused, never truncated.
    tgt.write_text("\n".join(TARGETS) + "\n", encoding="utf-8")
    monkeypatch.setattr("attn_jax.pipeline._score.model_length_cap", lambda model: 6)
    assert main(argv) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "2 pair(s) longer than the model's 6 positions" in line and "first line 3" in line
