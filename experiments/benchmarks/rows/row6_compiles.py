"""Row 6: compilations of train_step and eval_step during a bucketed run."""

from __future__ import annotations

import collections
import contextlib
import logging

from harness import Ctx, Section, verdict

from rows.rnnsearch import step_config

# Row 6's batch sizes: different from row 4's (32 full, 8 quick), so no shape is already compiled.
COMPILE_TRAIN_BATCH = 6
COMPILE_EVAL_BATCH = 10


class _CompileLog(logging.Handler):
    """Collects JAX's "Compiling <name> ..." records (emitted at DEBUG unless jax_log_compiles is on)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.names: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("Compiling "):
            self.names.append(msg.split()[1])

    def count(self, fragment: str) -> int:
        return sum(fragment in n for n in self.names)


def row_compiles(ctx: Ctx) -> Section:
    """Count compilations of train_step / eval_step over a bucketed run; they must not grow with steps."""
    s = ctx.sizes
    encoded, vocab = _random_corpus(ctx)
    # Row 4's configuration (its vocabulary covers this corpus' ids), so init_train_state is not compiled
    # again; the batch sizes here differ from row 4's, so every train_step shape is new to this row.
    step_cfg = step_config(ctx)
    if vocab > step_cfg.model.src_vocab:
        raise ValueError(f"row 6's corpus needs a vocabulary of {vocab}")
    sec = Section(
        "6. Compilations during a bucketed training run",
        f"A random 400-pair corpus through `attn_jax.data.make_batch_iterator` with buckets "
        f"{list(s.bucket_boundaries)} (batch {COMPILE_TRAIN_BATCH}), {s.compile_steps} `train_step`s (row 4's "
        f"model and optimiser), then one `eval_step` pass (batch {COMPILE_EVAL_BATCH}, remainder padded). "
        "Compilations are counted from JAX's own `Compiling <fn>` log records. "
        "Target: train_step compilations = distinct training batch shapes seen; none after the first pass "
        "over the shapes; eval_step compilations = distinct evaluation shapes.",
    )
    with _compile_log() as handler:
        seen, seen_half, compiles_half, train_compiles, eval_shapes = _train_and_evaluate(
            ctx, encoded, step_cfg, handler
        )
    eval_compiles = handler.count("eval_step")
    half = s.compile_steps // 2
    new_late = len(seen) - len(seen_half)
    late = train_compiles - compiles_half
    rows = [
        [
            f"train_step, steps 1–{half}",
            str(len(seen_half)),
            str(compiles_half),
            verdict(compiles_half == len(seen_half)),
        ],
        [
            f"train_step, steps {half + 1}–{s.compile_steps}",
            f"{new_late} new",
            str(late),
            verdict(late == new_late),
        ],
        ["train_step, whole run", str(len(seen)), str(train_compiles), verdict(train_compiles == len(seen))],
        [
            "eval_step, one pass",
            str(len(eval_shapes)),
            str(eval_compiles),
            verdict(eval_compiles == len(eval_shapes)),
        ],
    ]
    sec.table(["program", "distinct batch shapes", "compilations", "status"], rows)
    others = collections.Counter(n for n in handler.names if "train_step" not in n and "eval_step" not in n)
    listed = ", ".join(f"{name} ×{n}" for name, n in sorted(others.items())) or "none"
    sec.notes.append(
        f"Training shapes seen: {sorted(seen)}; evaluation shapes: {sorted(eval_shapes)}. Other programs "
        f"compiled during the run: {listed}."
    )
    return sec


def _random_corpus(ctx: Ctx):
    """400 random pairs that fit the last bucket, encoded; and the larger of the two vocabularies' sizes."""
    from attn_jax.data import WordVocabulary, corpus_from_pairs, encode_corpus

    rng = ctx.np.random.default_rng(5)
    words = [f"w{i}" for i in range(40)]
    top = ctx.sizes.bucket_boundaries[-1] - 1  # source + </s> and target + <s> fit the last bucket

    def sentence(lo, hi):
        return " ".join(rng.choice(words, int(rng.integers(lo, hi + 1))))

    pairs = [(sentence(2, top - 1), sentence(2, top - 1)) for _ in range(400)]
    corpus = corpus_from_pairs(pairs, name="bench")
    src_vocab = WordVocabulary.build([p[0] for p in pairs])
    tgt_vocab = WordVocabulary.build([p[1] for p in pairs])
    return encode_corpus(corpus, src_vocab, tgt_vocab), max(src_vocab.size, tgt_vocab.size)


@contextlib.contextmanager
def _compile_log():
    """A ``_CompileLog`` on JAX's compilation logger for the duration, the logger's settings restored after."""
    handler = _CompileLog()
    logger = logging.getLogger("jax._src.interpreters.pxla")
    old_level, old_propagate = logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate


def _train_and_evaluate(ctx: Ctx, encoded, step_cfg, handler: _CompileLog):
    """``compile_steps`` train steps, then one evaluation pass, over bucketed batches of ``encoded``.

    Returns the training shapes seen, those seen in the first half of the steps, the train_step compilations
    by then and after the last step, and the evaluation shapes.
    """
    from attn_jax.data import BatchConfig, make_batch_iterator
    from attn_jax.train import eval_step, init_train_state, train_step

    jax, s = ctx.jax, ctx.sizes
    train_cfg = BatchConfig(batch_size=COMPILE_TRAIN_BATCH, bucket_boundaries=s.bucket_boundaries, seed=0)
    eval_cfg = BatchConfig(
        batch_size=COMPILE_EVAL_BATCH,
        bucket_boundaries=s.bucket_boundaries,
        shuffle=False,
        num_epochs=1,
        drop_remainder=False,
    )
    device = jax.local_devices()[0]
    state = jax.device_put(init_train_state(step_cfg, 0), device)
    train_iter = make_batch_iterator(encoded, train_cfg, prefetch=0)
    seen, seen_half, compiles_half = set(), set(), 0
    half = s.compile_steps // 2
    for i in range(s.compile_steps):
        batch = next(train_iter)
        seen.add(batch.src.shape)
        state, metrics = train_step(state, batch, step_cfg)
        jax.device_get(metrics)
        if i + 1 == half:
            seen_half, compiles_half = set(seen), handler.count("train_step")
    train_compiles = handler.count("train_step")
    eval_shapes = set()
    for batch in make_batch_iterator(encoded, eval_cfg, prefetch=0):
        eval_shapes.add(batch.src.shape)
        jax.device_get(eval_step(state.params, batch, step_cfg))
    return seen, seen_half, compiles_half, train_compiles, eval_shapes
