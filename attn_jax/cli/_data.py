"""``attn-jax data``: statistics of the built-in corpus, a plain-text corpus or a prepared TFDS dataset.

    attn-jax data                                  # built-in corpus (config "default"), built on first use
    attn-jax data --config tiny --data-dir /tmp/tfds
    attn-jax data --src train.en --tgt train.fr    # plain-text, one sentence a line
    attn-jax data --src 'data/{split}.en' --tgt 'data/{split}.fr'            # every split that has files
    attn-jax data --src 'data/{split}.en' --tgt 'data/{split}.fr' --split valid
    attn-jax data --tsv pairs.tsv
    attn-jax data --tfds wmt14_translate/fr-en --source-key en --target-key fr --split validation
    attn-jax data --prepare --config configs/rnnsearch50.py --workdir runs/r50 --config.data.corpus=plain ...

Prints pairs per split, a source-length histogram, vocabulary sizes and an example pair with its alignment.
The built-in corpus and ``--tfds`` datasets live in a TFDS data directory: ``--data-dir`` (the trainer's
``data.data_dir``), else TFDS's own, ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``. The built-in corpus is
built there on first use (``default``: about 39 MB); stderr says first which directory is read or written, then
how many bytes were written or that an existing copy was reused. TFDS's and TensorFlow's own logs and progress
bars are kept off the output unless ``--verbose``.
``{split}`` in ``--src``/``--tgt``/``--tsv`` stands for the split name, as in the trainer's
``data.source_path``/``target_path``/``tsv_path``: without ``--split`` every split whose files exist is read
(train, validation/valid/dev, test, then the others); ``--split validation`` reads ``valid`` or ``dev`` when
there are no ``validation`` files, as training does. A bad file prints one line ``attn-jax data: error:
FILE:LINE: ...`` and exits with status 1 (2 on bad flags).

``--prepare`` takes a training config instead (``--config path.py[:arg]`` and ``--config.KEY=VALUE``
overrides, as ``attn-jax train``) and prepares its training split on disk as training with
``data.prepared_dir`` would: in ``--out DIR``, else where ``data.prepared_dir`` of ``--workdir`` points
(``<workdir>/prepared`` when it is empty or ``auto``). It reuses an up-to-date directory and says why it
rebuilds one (:mod:`attn_jax.data._prepared`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import os
import re
import sys
import threading

from attn_jax.cli._errors import error_line

_HIST_EDGES = (0, 10, 20, 30, 40, 50, 60)
_SPLIT = "{split}"  # in a file path: the split name, as in the trainer's data.source_path


def add_data_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``data`` subcommand to an ``argparse`` subparsers object; its handler is :func:`run_data`."""
    from attn_jax.cli._help import summary

    p = subparsers.add_parser(
        "data",
        help="corpus statistics (built-in corpus, plain-text files or a TFDS dataset)",
        description=summary(__doc__),
    )
    p.add_argument(
        "--src",
        metavar="FILE",
        help="plain-text source file (needs --tgt); {split} stands for the split name",
    )
    p.add_argument("--tgt", metavar="FILE", help="plain-text target file, line-aligned with --src")
    p.add_argument(
        "--tsv", metavar="FILE", help="tab-separated file: source<TAB>target per line; {split} as for --src"
    )
    p.add_argument(
        "--tfds", metavar="NAME", help="a prepared TFDS translation dataset, e.g. wmt14_translate/fr-en"
    )
    p.add_argument(
        "--config",
        default="default",
        help="config of the built-in corpus: default, small or tiny (default: %(default)s)",
    )
    p.add_argument(
        "--data-dir",
        metavar="DIR",
        default=None,
        help="TFDS data directory the built-in corpus is built in and --tfds read from, as the trainer's "
        "data.data_dir (default: $TFDS_DATA_DIR, else ~/tensorflow_datasets)",
    )
    p.add_argument(
        "--split",
        action="append",
        help="split(s) to read (default: all splits; for --src/--tgt/--tsv those whose {split} files exist)",
    )
    p.add_argument(
        "--source-key", default=None, help="TFDS feature of the source text (default: supervised keys)"
    )
    p.add_argument("--target-key", default=None, help="TFDS feature of the target text")
    p.add_argument(
        "--max-examples", type=int, default=None, help="read at most this many pairs per TFDS split"
    )
    p.add_argument(
        "--vocab-size", type=int, default=30000, help="shortlist size K for coverage (default: %(default)s)"
    )
    p.add_argument(
        "--example", type=int, default=0, help="index of the example pair to print (default: %(default)s)"
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show TFDS's and TensorFlow's own logs and progress bars (on stderr)",
    )
    p.add_argument(
        "--prepare",
        action="store_true",
        help="prepare the training split of the training config --config (path.py[:arg], with "
        "--config.KEY=VALUE overrides) as memory-mapped arrays on disk, for data.prepared_dir",
    )
    p.add_argument(
        "--workdir", metavar="DIR", help="with --prepare: the run directory whose prepared data to write"
    )
    p.add_argument(
        "--out", metavar="DIR", help="with --prepare: the directory to write (default: from --workdir)"
    )
    p.set_defaults(func=run_data, overrides=[])
    from attn_jax.cli._train import accept_config_overrides

    accept_config_overrides(p)  # --config.KEY=VALUE overrides of a training config, for --prepare
    return p


def _prepare(args: argparse.Namespace) -> int:
    """``--prepare``: prepare the training split of a training config on disk and summarise it."""
    if not (args.out or args.workdir):
        return _error("--prepare needs --out DIR or --workdir DIR", 2)
    from attn_jax.data import CorpusError
    from attn_jax.train import (
        ConfigError,
        apply_overrides,
        check_config,
        load_config,
        prepare_train_split,
        resolve_prepared_dir,
    )

    try:
        config = apply_overrides(load_config(args.config), args.overrides)
        check_config(config)
    except ConfigError as e:
        return _error(str(e), 2)
    d = config.data
    directory = args.out or resolve_prepared_dir(d, args.workdir) or os.path.join(args.workdir, "prepared")
    try:
        prepared = prepare_train_split(
            config, directory, log=lambda line: print(line, file=sys.stderr, flush=True)
        )
    except CorpusError as e:
        return _error(str(e))
    m = prepared.manifest
    c = m["counts"]
    read = c["kept"] + c["source_too_long"] + c["target_too_long"] + c["both_too_long"]
    print(f"prepared: {prepared.directory}")
    print(f"corpus: {m['name']}")
    print(
        f"pairs: {m['pairs']:,} encoded ({c['empty']:,} with an empty side and {c['beyond_max_examples']:,} beyond "
        f"data.max_train_examples not read); {c['kept']:,} of {read:,} within the length limits, "
        f"{c['source_too_long']:,} with the source over, {c['target_too_long']:,} with the target over, "
        f"{c['both_too_long']:,} with both over"
    )
    for side in ("source", "target"):
        s = m["lengths"][side]
        print(
            f"{side}: {s['tokens']:,} tokens, length mean {s['mean']:.1f}, median {s['p50']}, 90% {s['p90']}, "
            f"99% {s['p99']}, max {s['max']}"
        )
    print(f"vocabularies: {m['vocab_sizes'][0]:,} / {m['vocab_sizes'][1]:,} (with the four specials)")
    return 0


def _error(message: object, status: int = 1) -> int:
    return error_line("data", message, status)


def _say(message: str) -> None:
    print(f"attn-jax data: {message}", file=sys.stderr, flush=True)


def _size(n: int) -> str:
    """``39.2 MB (39,178,240 bytes)``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"


def _origin(data_dir: str | None, where) -> str:
    """Why the data directory is the one it is, and how to choose another."""
    if data_dir is not None:
        return f"data dir {where.data_dir}, from --data-dir"
    env = os.environ.get("TFDS_DATA_DIR")
    why = "$TFDS_DATA_DIR" if env else "TFDS's default"
    return f"data dir {where.data_dir}, {why}; --data-dir DIR to choose"


# TensorFlow's C++ log lines (absl/glog format: I1201 22:52:04.123456  4242 port.cc:153] ...) and the
# warning absl prints before its first one; TF 2.21 writes them at import, before it reads TF_CPP_MIN_LOG_LEVEL.
# Only INFO/WARNING lines are dropped: E and F lines still reach stderr.
_CPP_NOISE = re.compile(
    rb"^(?:[IW]\d{4} [\d:.]+ +\d+ [^ \]]+:\d+\] |WARNING: All log messages before absl::InitializeLog\(\)"
    rb"|To enable the following instructions: )"
)


@contextlib.contextmanager
def _filter_fd2():
    """Drop TensorFlow's C++ INFO/WARNING lines, which bypass Python and write to file descriptor 2."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (an embedding host): nothing to filter
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump() -> None:
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if not _CPP_NOISE.match(line):
                    with contextlib.suppress(OSError):  # stderr closed under us: nowhere left to say it
                        os.write(saved, line)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the pump reads to the end and stops
        thread.join(timeout=10)
        os.close(saved)


@contextlib.contextmanager
def _third_party_output(verbose: bool):
    """TFDS's prints and INFO logs, its progress bars and TensorFlow's C++ logs: on stderr with ``verbose``,
    else dropped (this command says itself where the data are and what was written). Warnings and errors of
    Python loggers and C++ errors still reach stderr."""
    absl = logging.getLogger("absl")
    level, handler = absl.level, None
    if verbose:
        if not absl.hasHandlers():  # absl's INFO lines reach stderr only through a handler
            handler = logging.StreamHandler(sys.stderr)
            absl.addHandler(handler)
        absl.setLevel(logging.INFO)
        # TFDS reports building on stdout; keep stdout for the statistics.
        with contextlib.redirect_stdout(sys.stderr):
            try:
                yield
            finally:
                absl.setLevel(level)
                if handler is not None:
                    absl.removeHandler(handler)
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's own knob; set before it is imported
    from tensorflow_datasets.core.utils import tqdm_utils

    bars = tqdm_utils._active  # no public getter; restored below for callers in the same process
    tqdm_utils.display_progress_bar(False)
    absl.setLevel(logging.WARNING)
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), _filter_fd2():
            yield
    finally:
        absl.setLevel(level)
        tqdm_utils.display_progress_bar(bars)


def _load(args) -> tuple[str, dict]:
    """``(title, {split: ParallelCorpus})`` for the corpus the arguments name."""
    from attn_jax import data

    if args.src is not None or args.tgt is not None:
        patterns = [args.src, args.tgt]
        corpora = _file_splits(
            patterns, args.split, lambda s: data.read_plain_corpus(*(data.split_path(p, s) for p in patterns))
        )
        return f"{args.src} | {args.tgt}", corpora
    if args.tsv is not None:
        return args.tsv, _file_splits(
            [args.tsv], args.split, lambda s: data.read_tsv_corpus(data.split_path(args.tsv, s))
        )
    if args.tfds is not None:
        where = data.prepare_tfds_dataset(args.tfds, data_dir=args.data_dir)
        _say(f"reading {args.tfds} from {where.path} ({_origin(args.data_dir, where)})")
        splits = args.split or _tfds_splits(args.tfds, args.data_dir)
        corpora = {
            s: data.load_tfds_corpus(
                args.tfds,
                s,
                source_key=args.source_key,
                target_key=args.target_key,
                data_dir=args.data_dir,
                max_examples=args.max_examples,
            )
            for s in splits
        }
        return args.tfds, corpora
    splits = args.split or ["train", "validation", "test"]
    name = f"attn_jax_synthetic/{args.config}"
    where = data.prepare_tfds_dataset(name, data_dir=args.data_dir)
    origin = _origin(args.data_dir, where)
    if where.prepared:
        _say(f"reusing {name} prepared in {where.path} ({_size(where.bytes)}; {origin}); nothing written")
    else:
        _say(f"building {name} in {where.path} ({origin})")
        where = data.prepare_tfds_dataset(name, data_dir=where.data_dir, build=True)
        _say(f"wrote {_size(where.bytes)} to {where.path}")
    corpora = {s: data.load_synthetic_corpus(s, args.config, data_dir=where.data_dir) for s in splits}
    return f"{name} (data_dir: {where.data_dir})", corpora


def _file_splits(patterns: list[str], asked: list[str] | None, read) -> dict:
    """``{split: corpus}`` of a file corpus: one ``all`` split without ``{split}`` in the paths; else the splits
    asked for (``validation`` may read ``valid`` or ``dev``, as training does) or every one with files."""
    from attn_jax import data

    if _SPLIT not in patterns[0]:
        return {"all": read("all")}
    if asked:
        splits = [data.resolve_split(patterns, s, choose="--split") for s in asked]
        for s, used in zip(asked, splits, strict=True):
            if s != used:  # said on stderr: stdout keeps the statistics' layout
                print(f"attn-jax data: no {s!r} files, so --split {s} reads {used!r}", file=sys.stderr)
    else:
        splits = data.find_splits(patterns[0])
        if not splits:
            raise data.CorpusError(f"{patterns[0]}: no file matches ({_SPLIT} stands for any split name)")
    return {s: read(s) for s in dict.fromkeys(splits)}


def _tfds_splits(name: str, data_dir: str | None) -> list[str]:
    """The prepared splits of a TFDS dataset (``["train"]`` when TFDS does not say)."""
    import tensorflow_datasets as tfds

    from attn_jax.data import CorpusError

    try:
        splits = list(tfds.builder(name, data_dir=data_dir).info.splits.keys())
    except Exception as e:
        raise CorpusError(f"{name}: unknown TFDS dataset ({str(e).splitlines()[0]})") from None
    return splits or ["train"]


def _histogram(lengths: list[int]) -> list[int]:
    counts = [0] * len(_HIST_EDGES)
    for n in lengths:
        counts[min(n // 10, len(_HIST_EDGES) - 1)] += 1
    return counts


def _print_stats(title: str, corpora: dict, vocab_size: int, example: int) -> None:
    from attn_jax.data import parse_alignment

    print(f"corpus: {title}")
    print(
        f"{'split':<12}{'pairs':>10}{'src words':>12}{'tgt words':>12}"
        f"{'src mean/max':>15}{'tgt mean/max':>15}"
        f"{'skipped empty':>15}"
    )
    lengths = {}
    for split, c in corpora.items():
        sl = [len(s.split()) for s in c.sources]
        tl = [len(t.split()) for t in c.targets]
        lengths[split] = sl
        print(
            f"{split:<12}{len(c):>10,}{sum(sl):>12,}{sum(tl):>12,}"
            f"{sum(sl) / len(sl):>9.1f} / {max(sl):<3}{sum(tl) / len(tl):>9.1f} / {max(tl):<3}"
            f"{c.skipped_empty:>15,}"
        )

    print("\nsource length histogram (words):")
    print(f"{'length':<10}" + "".join(f"{s:>12}" for s in corpora))
    hists = {s: _histogram(sl) for s, sl in lengths.items()}
    for k, lo in enumerate(_HIST_EDGES):
        label = f"{lo}-{lo + 9}" if k < len(_HIST_EDGES) - 1 else f"{lo}+"
        print(f"{label:<10}" + "".join(f"{hists[s][k]:>12,}" for s in corpora))

    vocab_split = "train" if "train" in corpora else next(iter(corpora))
    c = corpora[vocab_split]
    print(f"\nvocabulary ({vocab_split}):")
    for side, sentences in (("source", c.sources), ("target", c.targets)):
        counts = collections.Counter(w for s in sentences for w in s.split())
        top = sum(n for _, n in counts.most_common(vocab_size))
        print(
            f"  {side}: {len(counts):,} word types; shortlist K={vocab_size:,} (+4 specials) covers "
            f"{100.0 * top / max(1, sum(counts.values())):.2f}% of tokens"
        )

    ex_split = "test" if "test" in corpora else next(iter(corpora))
    c = corpora[ex_split]
    i = min(max(example, 0), len(c) - 1)
    print(f"\nexample pair ({ex_split} #{i}):")
    print(f"  source:    {c.sources[i]}")
    print(f"  target:    {c.targets[i]}")
    if c.alignments is not None:
        print(f"  alignment: {c.alignments[i]}")
        src, tgt = c.sources[i].split(), c.targets[i].split()
        by_src = collections.defaultdict(list)
        for si, tj in parse_alignment(c.alignments[i]):
            by_src[si].append(tgt[tj] if 0 <= tj < len(tgt) else "?")
        links = [f"{w}->{' '.join(by_src[k]) if k in by_src else '(none)'}" for k, w in enumerate(src)]
        print(f"  links:     {' | '.join(links)}")


def run_data(args: argparse.Namespace) -> int:
    """Run ``attn-jax data`` with parsed arguments; returns the exit status."""
    if args.prepare:
        return _prepare(args)
    if args.overrides or args.workdir or args.out:
        return _error("--config.KEY=VALUE, --workdir and --out go with --prepare", 2)
    if (args.src is None) != (args.tgt is None):
        return _error("--src and --tgt go together", 2)
    given = [
        flag for flag, v in (("--src", args.src), ("--tsv", args.tsv), ("--tfds", args.tfds)) if v is not None
    ]
    if len(given) > 1:
        return _error(f"choose one corpus, got {' and '.join(given)}", 2)
    if args.src is not None and (_SPLIT in args.src) != (_SPLIT in args.tgt):
        return _error(
            f"--src and --tgt must both contain {_SPLIT} or neither, got {args.src} and {args.tgt}", 2
        )
    paths = [p for p in (args.src, args.tsv) if p is not None]
    if args.split and paths and _SPLIT not in paths[0]:
        flag = "--src/--tgt" if args.src is not None else "--tsv"
        return _error(
            f"--split needs {_SPLIT} in {flag} to stand for the split name (e.g. 'data/{_SPLIT}.en'), got {paths[0]}",
            2,
        )
    if args.vocab_size < 0:
        return _error(f"--vocab-size must be >= 0, got {args.vocab_size}", 2)

    from attn_jax.data import CorpusError

    try:
        if args.src is None and args.tsv is None:  # TFDS: the built-in corpus or --tfds
            with _third_party_output(args.verbose):
                title, corpora = _load(args)
        else:
            title, corpora = _load(args)
    except CorpusError as e:
        return _error(str(e))
    _print_stats(title, corpora, args.vocab_size, args.example)
    return 0
