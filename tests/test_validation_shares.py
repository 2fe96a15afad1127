"""Validation by translation in shares (a multi-process run): each process translates every ``count``-th
sentence, and the gathered shares give the hypotheses, counts and scores of one process translating all."""

import jax
import numpy as np
import pytest

from attn_jax.train import (
    StepConfig,
    TranslationValidator,
    apply_overrides,
    init_train_state,
    load_config,
    make_inputs,
    model_config,
    optimizer_config,
)
from tests.test_data_prepared import _SMOKE, _overrides, _write

# 23 sources of 1-9 words (one empty: it translates to "" in no share), references reversed.
WORDS = "a b c d e f g h i j".split()
SOURCES = [" ".join(WORDS[(5 * k + i) % 10] for i in range(1 + k % 9)) for k in range(22)] + [""]
REFERENCES = [" ".join(reversed(s.upper().split())) for s in SOURCES]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    _write(d, "train", list(zip(SOURCES[:-1], REFERENCES[:-1], strict=True)))
    config = apply_overrides(load_config(_SMOKE), _overrides(d, "data.prefetch=0", "validation.batch_size=5"))
    inputs = make_inputs(config, str(d / "vocab"), reuse_vocab=False)
    model = model_config(config, inputs.src_vocab.size, inputs.tgt_vocab.size)
    step_cfg = StepConfig(model=model, optimizer=optimizer_config(config))
    params = jax.tree.map(np.asarray, init_train_state(step_cfg, 0).params)
    return config, inputs, model, params


def _validator(run, shard):
    config, inputs, model, _ = run
    return TranslationValidator(
        config, SOURCES, REFERENCES, inputs.src_vocab, inputs.tgt_vocab, model, shard=shard
    )


@pytest.mark.parametrize("count", [2, 3])
def test_shares_gathered_equal_one_process(run, count):
    params = run[3]
    one = _validator(run, (0, 1))
    want = one.translate(params)
    shares = [_validator(run, (p, count)) for p in range(count)]
    tables = [v.decode_share(params) for v in shares]
    assert sorted(i for t in tables for i in t[:, 0].tolist()) == one.todo  # each sentence in one share
    assert [len(t) for t in tables] == [len(one.todo[p::count]) for p in range(count)]
    for v in shares:  # every process merges the same gathered tables
        got = v.merge(tables)
        assert got == want
        assert v.score(got[0]) == one.score(want[0])
    assert want[1] == 22 and want[0][-1] == ""
    assert f"each of {count} processes a share" in shares[0].describe()
    assert "processes" not in one.describe()
