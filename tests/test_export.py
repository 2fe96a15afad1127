"""``attn-jax export`` and ``attn_jax.exported.load``: the loaded export translates as ``attn-jax translate`` does,
in a process that imports no model code; exports for another platform, damaged exports and bad flags are one
line each."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from attn_jax.cli import main
from attn_jax.exported import ExportError, export_run, load
from attn_jax.exported._load import _length_batches, _pad_rows, _Vocabulary, padded_width, target_limit

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Lengths 4, 1, 8, 12 and 15 tokens (the widest source width 16 holds), one unknown word, a blank line.
SENTENCES = [
    "the dog slept .",
    ".",
    "",
    "the museum buried those round orange waiters zzzqx .",
    "every monk stood , because the torch bit fragile lazy bananas .",
    "every monk stood , because the torch bit fragile lazy bananas which knelt .",
]
# Imported by the loader's process, these would mean model code (or the trainer's stack) came along.
MODEL_MODULES = ("flax", "optax", "orbax", "attn_jax.models", "attn_jax.decoding", "attn_jax.train")


def _make_run(workdir, arch: str) -> str:
    """A run directory with vocabularies, config and one untrained checkpoint (parameters N(0, 0.5²)), written
    with the trainer's API at a tiny size: RNNsearch, or a Transformer whose decoder holds 24 positions (so its
    cap, not the length rule, limits the longer sentences)."""
    from attn_jax import data
    from attn_jax.train import (
        CheckpointManager,
        StepConfig,
        init_train_state,
        load_config,
        model_config,
        optimizer_config,
    )

    if arch == "rnnsearch":
        config = load_config(os.path.join(_ROOT, "configs", "rnnsearch_cpu.py:smoke"))
        config.model.update(embed=8, hidden=10, maxout=6, align=7)
    else:
        config = load_config(os.path.join(_ROOT, "configs", "transformer_cpu.py:smoke"))
        # Untied output weights: a tied untrained decoder repeats its first word whatever the source.
        config.model.update(d_model=16, heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, max_length=24)
        config.model.share_embeddings = "none"
    s = config.data.synthetic_spec
    spec = data.SyntheticSpec(
        train_size=s.train_size, validation_size=s.validation_size, test_per_bucket=0, seed=s.seed,
        min_length=s.min_length, max_length=s.max_length,
    )  # fmt: skip
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
        params=jax.tree.map(lambda s: rng.normal(0.0, 0.5, s.shape).astype(s.dtype), abstract.params),
        opt_state=jax.tree.map(zeros, abstract.opt_state),
        rng=zeros(abstract.rng),
    )
    manager = CheckpointManager(os.path.join(workdir, "checkpoints"), async_save=False)
    manager.save(1, state, {}, json.loads(config.to_json()), {"nll_per_token": 1.0})
    manager.close()
    return str(workdir)


def _translate_cli(run: str, tmp, *flags: str) -> list[str]:
    src, out = tmp / "in.txt", tmp / f"out{'_'.join(flags)}.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    assert main(["translate", "--workdir", run, "--input", str(src), "--output", str(out), *flags]) == 0
    return out.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """For each architecture: ``(run, export directory, translate's beam output, translate's greedy output)``."""
    out = {}
    for arch in ("rnnsearch", "transformer"):
        tmp = tmp_path_factory.mktemp(arch)
        run = _make_run(tmp / "run", arch)
        assert main(["export", "--workdir", run, "--output", str(tmp / "export"), "--beam", "3"]) == 0
        beam = _translate_cli(run, tmp, "--beam", "3")
        greedy = _translate_cli(run, tmp, "--beam", "1", "--alpha", "0")
        out[arch] = (run, str(tmp / "export"), beam, greedy)
    return out


def test_loaded_export_translates_as_translate_without_model_code(exports):
    """Beam (K=3, α=0.6) and greedy translations of the loaded exports, in a fresh process, equal ``attn-jax
    translate``'s; that process has imported neither Flax nor any model, decoding or training module."""
    script = (
        "import json, sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "from attn_jax import exported\n"
        "lines, dirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
        "out = {}\n"
        "for arch, d in dirs.items():\n"
        "    m = exported.load(d)\n"
        "    out[arch] = [m.translate(lines), m.translate(lines, greedy=True), m.last_report.stopped_at_limit]\n"
        "out['modules'] = sorted(sys.modules)\n"
        "print(json.dumps(out))\n"
    )
    dirs = {arch: e[1] for arch, e in exports.items()}
    env = {**os.environ, "PYTHONPATH": _ROOT}
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(SENTENCES), json.dumps(dirs)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    imported = [m for m in got["modules"] if m.split(".")[0] in MODEL_MODULES or m.startswith(MODEL_MODULES)]
    assert imported == []
    for arch, (_, _, beam, greedy) in exports.items():
        assert got[arch][0] == beam, arch
        assert got[arch][1] == greedy, arch
        assert beam != greedy  # so that the modes are told apart
    # Untrained, every sentence runs to its limit; the Transformer's is its 24-position decoder for the longest.
    assert got["rnnsearch"][2] == got["transformer"][2] == 5


def test_manifest_states_shapes_run_and_limit(exports):
    run, directory, _, _ = exports["transformer"]
    with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["platforms"] == ["cpu"] and manifest["source_widths"] == [16]
    assert manifest["run"]["workdir"] == os.path.abspath(run) and manifest["run"]["step"] == 1
    assert manifest["decoding"]["beam_size"] == 3 and manifest["decoding"]["alpha"] == 0.6
    # The run's rule: max(14, ⌊2·n⌋ + 10) for data.max_target_length 14; the decoder's 24 positions cap it.
    limit = manifest["length_limit"]
    assert (limit["minimum"], limit["ratio"], limit["offset"], limit["model_cap"]) == (14, 2.0, 10, 23)
    assert manifest["functions"]["beam"]["16"]["output_length"] == min(2 * 15 + 10 + 1, 24)
    assert manifest["dtype"] == {"params": ["float32"], "compute": "float32"}


def test_loader_batches_limits_and_vocabularies_match_the_library():
    """The loader's copies of the batching, padding, length-limit and vocabulary code agree with the library's."""
    from attn_jax import decoding

    rng = np.random.default_rng(0)
    for batch_size in (1, 3, 32):
        lengths = [int(n) for n in rng.integers(2, 70, size=41)]
        assert _length_batches(lengths, batch_size) == decoding.length_batches(lengths, batch_size)
    assert [padded_width(n) for n in range(1, 70)] == [decoding.padded_width(n) for n in range(1, 70)]
    rows = [[5, 6, 7], [8]]
    for a, b in zip(_pad_rows(rows, 16, 4), decoding.pad_rows(rows, 16, 4, 2, 0), strict=True):
        np.testing.assert_array_equal(a, b)
    for rule in (
        decoding.LengthLimit(14, 2.0, 10),
        decoding.LengthLimit(0, 0.1, 0),
        decoding.LengthLimit.fixed(7),
    ):
        for cap in (None, 20):
            for n in range(0, 60):
                want = rule.tokens(n) + 1 if cap is None else min(rule.tokens(n) + 1, cap + 1)
                assert target_limit(tuple(rule), cap, n) == want


def test_loader_vocabularies_encode_and_decode_as_attn_jax_data(tmp_path):
    from attn_jax import data

    text = ["The dog slept .", "a cat , the DOG and a bird flew away .", "unseen wörds here"]
    corpus = text[:2] * 20 + ["the quick brown fox jumps over the lazy dog ."] * 20
    for name, vocab in (
        ("word", data.WordVocabulary.build(corpus, max_size=6, lowercase=True)),
        ("spm", data.SentencePieceVocabulary.train(corpus, vocab_size=40)),
    ):
        vocab.save(tmp_path / name)
        mine = _Vocabulary(str(tmp_path / name))
        for s in text:
            ids = vocab.encode(s)
            assert mine.encode(s) == ids
            assert mine.decode(ids) == vocab.decode(ids)


def test_export_for_another_platform_is_one_error_line(exports, tmp_path):
    run = exports["rnnsearch"][0]
    manifest = export_run(run, tmp_path / "tpu", platforms=("tpu",), max_source_length=8, modes=("greedy",))
    assert manifest["platforms"] == ["tpu"] and list(manifest["functions"]) == ["greedy"]
    with pytest.raises(ExportError) as e:
        load(tmp_path / "tpu")
    message = str(e.value)
    assert "\n" not in message and "exported for tpu only" in message and "runs on cpu" in message


@pytest.mark.parametrize("damage", ["truncate", "no_manifest", "no_weights"])
def test_damaged_export_is_one_error_line(exports, tmp_path, damage):
    directory = tmp_path / "copy"
    shutil.copytree(exports["rnnsearch"][1], directory)
    if damage == "truncate":
        path = directory / "beam_16.jaxexport"
        path.write_bytes(path.read_bytes()[:100])
        expected = "beam_16.jaxexport: damaged"
    elif damage == "no_manifest":
        os.remove(directory / "manifest.json")
        expected = "manifest.json: missing"
    else:
        os.remove(directory / "weights.npz")
        expected = "weights.npz: missing"
    with pytest.raises(ExportError) as e:
        load(directory)
    assert "\n" not in str(e.value) and expected in str(e.value)


def test_sentence_longer_than_the_export_is_one_error_line(exports):
    model = load(exports["rnnsearch"][1])
    with pytest.raises(
        ExportError, match=r"^line 2 has 16 source tokens, more than the 15 this export takes"
    ):
        model.translate(["a", " ".join(["the"] * 16)])


@pytest.mark.parametrize(
    "flags, status, expected",
    [
        (["--beam", "0"], 2, "--beam must be >= 1, got 0"),
        (["--platforms", "cpu,gpu"], 2, "--platforms must be distinct names among cpu,cuda,rocm,tpu"),
        (["--max-length", "5", "--max-length-ratio", "1"], 2, "not both"),
        (["--workdir", "/nonexistent/run"], 1, "/nonexistent/run: no such run directory"),
        (["--output", "EXISTING"], 1, "exists and is not an empty directory"),
    ],
)
def test_cli_errors_are_one_line(exports, tmp_path, capsys, flags, status, expected):
    run, existing = exports["rnnsearch"][0], exports["rnnsearch"][1]
    options, extra = {"--workdir": run, "--output": str(tmp_path / "new")}, []
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        value = existing if value == "EXISTING" else value
        if flag in options:
            options[flag] = value
        else:
            extra += [flag, value]
    argv = ["export", *[x for item in options.items() for x in item], *extra]
    assert main(argv) == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attn-jax export: error: ") and expected in err
    assert not os.path.exists(tmp_path / "new")
