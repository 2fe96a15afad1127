"""Configs: every preset loads and validates, paper presets carry the paper's numbers, overrides and one-line
errors (library and ``attn-jax train``)."""

import pathlib

import ml_collections
import pytest

from attn_jax.cli import main
from attn_jax.cli._train import _split_overrides
from attn_jax.train import (
    ConfigError,
    apply_overrides,
    check_config,
    default_config,
    flatten_config,
    load_config,
    model_config,
    optimizer_config,
)

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
PRESETS = sorted(p.name for p in CONFIGS.glob("*.py"))


def test_presets_exist():
    assert {
        "rnnenc30.py",
        "rnnenc50.py",
        "rnnsearch30.py",
        "rnnsearch50.py",
        "rnnsearch_cpu.py",
        "rnnenc_cpu.py",
    } <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_and_its_smoke_variant_validate(name):
    full = load_config(str(CONFIGS / name))
    check_config(full)
    smoke = load_config(f"{CONFIGS / name}:smoke")
    check_config(smoke)
    # smoke keeps the architecture and optimiser, and runs on the built-in generator in seconds
    for key in ("arch", "scorer", "attention"):  # the attention of the architecture is kept (gnmt: attention)
        assert smoke.model.get(key) == full.model.get(key)
    assert smoke.optimizer.name == full.optimizer.name
    assert smoke.num_train_steps <= 50 and smoke.data.corpus == "synthetic" and not smoke.data.use_tfds
    assert len(smoke.data.bucket_boundaries) == 1  # one compiled shape
    doc = (CONFIGS / name).read_text().split('"""')[1]
    assert f"--config configs/{name}" in doc and "smoke" in doc and "Expected" in doc


@pytest.mark.parametrize("arch", ["rnnsearch", "rnnenc"])
@pytest.mark.parametrize("length", [30, 50])
def test_paper_presets_have_the_papers_settings(arch, length):
    c = load_config(str(CONFIGS / f"{arch}{length}.py"))
    m = model_config(c, src_vocab=c.data.src_vocab_size + 4, tgt_vocab=c.data.tgt_vocab_size + 4)
    assert (m.arch, m.embed, m.hidden, m.maxout) == (arch, 620, 1000, 500)
    if arch == "rnnsearch":
        assert (m.align, m.scorer) == (1000, "additive")
    assert m.dtype == "float32" and m.param_dtype == "float32"
    assert (c.data.src_vocab_size, c.data.tgt_vocab_size) == (30000, 30000)
    assert (c.data.max_source_length, c.data.max_target_length) == (length, length)
    assert c.data.batch_size == 80
    assert (c.data.corpus, c.data.tfds_name, c.data.source_key, c.data.target_key) == (
        "tfds",
        "wmt14_translate/fr-en",
        "en",
        "fr",
    )
    o = optimizer_config(c)
    assert (o.name, o.learning_rate, o.rho, o.eps, o.clip_norm, o.weight_decay) == (
        "adadelta",
        1.0,
        0.95,
        1e-6,
        1.0,
        0.0,
    )


def test_overrides_parse_with_the_fields_types():
    base = default_config()
    c = apply_overrides(
        base,
        [
            "model.hidden=256",
            "optimizer.learning_rate=3",  # an int for a float field
            "mixed_precision=true",
            "data.corpus=tsv",
            "data.tsv_path=/tmp/{split}.tsv",
            "data.bucket_boundaries=16,32",
            "config.seed=7",  # the --config. prefix may stay
            "optimizer.eps=1e-8",
        ],
    )
    assert c.model.hidden == 256 and isinstance(c.model.hidden, int)
    assert c.optimizer.learning_rate == 3.0 and isinstance(c.optimizer.learning_rate, float)
    assert c.mixed_precision is True and c.data.corpus == "tsv" and c.data.tsv_path == "/tmp/{split}.tsv"
    assert c.data.bucket_boundaries == (16, 32) and c.seed == 7 and c.optimizer.eps == 1e-8
    assert apply_overrides(base, ["data.bucket_boundaries=(8, 24)"]).data.bucket_boundaries == (8, 24)
    assert apply_overrides(base, ["data.bucket_boundaries=40"]).data.bucket_boundaries == (40,)
    assert base.model.hidden == 1000  # the input is not modified
    check_config(c)
    assert model_config(c, 10, 10).dtype == "bfloat16"  # mixed precision: bf16 compute, fp32 params
    assert model_config(c, 10, 10).param_dtype == "float32"


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.hiden=3", "unknown config key 'model.hiden' (did you mean 'model.hidden'?)"),
        ("nonsense=3", "unknown config key 'nonsense'"),
        ("model=3", "config key 'model' is a group"),
        ("model.hidden=abc", "config key 'model.hidden': cannot parse 'abc' as int"),
        ("model.hidden=2.5", "cannot parse '2.5' as int"),
        ("tensorboard=maybe", "config key 'tensorboard': cannot parse 'maybe' as bool"),
        ("model.hidden", "must look like key=value"),
    ],
)
def test_override_errors_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        apply_overrides(default_config(), [override])
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.hidden=0", "hidden must be a positive int"),
        ("model.scorer=cosine", "scorer must be one of"),
        ("optimizer.name=sgd", "optimizer.name must be one of"),
        ("data.batch_size=0", "batch_size=0 must be a positive multiple"),
        ("num_train_steps=0", "num_train_steps must be a positive int"),
        ("label_smoothing=1.0", "label_smoothing must be in [0, 1)"),
        ("data.corpus=wmt", "data.corpus must be one of"),
        ("data.synthetic=huge", "data.synthetic must be one of"),
        ("data.corpus=tfds", "needs data.tfds_name"),
        ("data.bucket_boundaries=32,16", "bucket_boundaries must be increasing"),
    ],
)
def test_impossible_values_are_config_errors(override, message):
    c = apply_overrides(default_config(), [override])
    with pytest.raises(ConfigError) as e:
        check_config(c)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_check_config_rejects_wrong_types_and_extra_keys():
    d = default_config().to_dict()
    d["model"]["hidden"] = "wide"  # a config file may build its ConfigDict from a plain dict
    with pytest.raises(ConfigError, match="'model.hidden' must be int, got 'wide'"):
        check_config(ml_collections.ConfigDict(d))
    d = default_config().to_dict()
    d["keep_best"] = 1
    with pytest.raises(ConfigError, match="'keep_best' must be bool"):
        check_config(ml_collections.ConfigDict(d))
    c = default_config()
    c.model.depth = 2
    with pytest.raises(ConfigError, match="unknown config key 'model.depth'"):
        check_config(c)


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(str(tmp_path / "nope.py"))
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="defines no get_config"):
        load_config(str(tmp_path / "empty.py"))
    (tmp_path / "broken.py").write_text("def get_config(:\n")
    with pytest.raises(ConfigError, match="cannot load: SyntaxError"):
        load_config(str(tmp_path / "broken.py"))
    (tmp_path / "extra.py").write_text(
        "from attn_jax.train import default_config\n\ndef get_config():\n    c = default_config()\n    c.model.hiden = 3\n    return c\n"
    )
    with pytest.raises(ConfigError, match="unknown config key 'model.hiden'"):
        load_config(str(tmp_path / "extra.py"))
    with pytest.raises(ConfigError, match="unknown variant 'big'"):
        load_config(f"{CONFIGS / 'rnnsearch_cpu.py'}:big")


def test_flatten_covers_every_field():
    flat = flatten_config(default_config())
    assert flat["model.hidden"] == 1000 and flat["optimizer.rho"] == 0.95 and flat["data.batch_size"] == 80
    assert all(not isinstance(v, dict) for v in flat.values())


def test_split_overrides_accepts_both_spellings():
    overrides, rest = _split_overrides(
        ["--config", "c.py", "--config.model.hidden=3", "--resume", "--config.seed", "4", "--workdir", "w"]
    )
    assert overrides == ["model.hidden=3", "seed=4"]
    assert rest == ["--config", "c.py", "--resume", "--workdir", "w"]


def _cli(argv, capsys):
    status = main(["train", *argv])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("attn-jax train: error: ")]
    return status, lines, err


@pytest.mark.parametrize(
    "extra, status, message",
    [
        (["--config.model.hiden=3"], 2, "unknown config key 'model.hiden' (did you mean 'model.hidden'?)"),
        (["--config.model.hidden", "-4"], 2, "hidden must be a positive int, got -4"),
        (["--config.data.max_source_length=1"], 1, "no pairs left after the length filter"),
    ],
)
def test_cli_one_line_errors(tmp_path, capsys, extra, status, message):
    got, lines, err = _cli(
        ["--config", f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke", "--workdir", str(tmp_path / "w"), *extra],
        capsys,
    )
    assert got == status
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err


def test_cli_missing_config_file(tmp_path, capsys):
    got, lines, err = _cli(
        ["--config", str(tmp_path / "missing.py"), "--workdir", str(tmp_path / "w")], capsys
    )
    assert (
        got == 2
        and len(lines) == 1
        and "missing.py: no such config file" in lines[0]
        and "Traceback" not in err
    )


def test_cli_help_explains_overrides(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--config.KEY=VALUE" in out and "--resume" in out and "--workdir" in out


def test_generated_corpus_equals_the_generator_for_every_split():
    from attn_jax.data import SyntheticSpec, generate_synthetic
    from attn_jax.train import load_corpus

    c = apply_overrides(
        default_config(),
        [
            "data.synthetic=custom",
            "data.synthetic_spec.train_size=20",
            "data.synthetic_spec.validation_size=6",
            "data.synthetic_spec.test_per_bucket=2",
            "data.synthetic_spec.seed=3",
        ],
    )
    want = generate_synthetic(SyntheticSpec(train_size=20, validation_size=6, test_per_bucket=2, seed=3))
    for split in ("train", "validation", "test"):
        got = load_corpus(c.data, split)
        assert list(got.sources) == [p.source for p in want[split]]
        assert list(got.alignments) == [p.alignment for p in want[split]]
    assert len(load_corpus(c.data, "train", max_examples=5)) == 5
    with pytest.raises(ValueError, match="unknown split 'train\\[:5\\]'"):
        load_corpus(c.data, "train[:5]")


def test_model_group_follows_the_architecture():
    """model.arch selects the config class: its fields are the model keys, others are one-line errors."""
    from attn_jax.models import GNMTConfig

    c = load_config(str(CONFIGS / "gnmt_cpu.py"))
    m = model_config(c, src_vocab=20, tgt_vocab=30)
    assert isinstance(m, GNMTConfig) and (m.encoder_layers, m.decoder_layers, m.hidden) == (4, 4, 64)
    with pytest.raises(ConfigError, match="unknown config key 'model.maxout'"):
        apply_overrides(c, ["model.maxout=8"])
    bad = default_config()
    bad.model.arch = "lstm"
    with pytest.raises(ConfigError, match="model.arch must be one of rnnsearch, rnnenc, gnmt"):
        check_config(bad)
    wrong = default_config()
    wrong.model.arch = "gnmt"  # RNN fields under a gnmt arch
    # The first RNN-only key in order (attention_init, input_feeding, ...) is named.
    with pytest.raises(ConfigError, match=r"unknown config key 'model\.(attention_init|input_feeding)'"):
        check_config(wrong)
