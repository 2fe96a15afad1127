"""Copying (pointer-generator, See et al. 2017) against ``<unk>``: RNNsearch with and without ``model.copy`` on the
built-in corpus with names, several seeds at one budget.

    nice -n 5 python experiments/copy/run.py --seeds 0,1,2 --steps 1500 --out runs/copy   # one run at a time
    python experiments/copy/run.py --table --out runs/copy         # the README's table from results.jsonl
    python experiments/copy/run.py --smoke --seeds 0 --steps 30 --out /tmp/copy_smoke

The built-in corpus has no word that both languages share, so nothing in it can be copied. This study gives it
names, the case copying is for: the corpus of configs/rnnsearch_cpu.py (20,000 generated pairs of 3-30 words) is
generated, then every *singular* source noun is replaced, with probability ``--name-rate``, by a name, and its
aligned target noun by the same name (the noun's gender/number particle becomes the one of a masculine singular
noun, so the particle stays predictable from the source). Names are capitalised pseudo-words; the training split
draws them from one pool, validation and test from another, disjoint one: every test name is unseen in training.
Both vocabularies are capped at the number of non-name word types of the training split, and the script checks
that every name is rarer than every lexicon word, so that **every name is outside both vocabularies**, in
training as well as at test: without copying the model can only write ``<unk>`` for a name; with it, it can point
at the name in the source. The files (plain text, one pair a line, with the gold Pharaoh alignments) are written
to ``<out>/corpus`` and trained on through ``data.corpus=plain``.

Each (variant, seed) trains configs/rnnsearch_cpu.py on that corpus for ``--steps`` updates (the vocabulary caps and
corpus paths the only other overrides), the ``copy`` variant adding ``model.copy=true``, then evaluates the 140
test pairs (20 per source-length bucket) with beam search through ``attn_jax.pipeline.evaluate_workdir``. The
baseline is evaluated twice: as it is, and with ``replace_unk=True`` (each produced ``<unk>`` replaced by the
most-attended source word after decoding, Luong et al. 2015's post-hoc fix; no extra training), as a third row.

Measured on the test hypotheses:
  * ``unk_rate``: ``<unk>`` tokens over all hypothesis tokens;
  * ``name_recall``: reference name tokens that the hypothesis contains (clipped counts, as BLEU's matches);
  * ``bleu``: corpus BLEU (sacreBLEU 13a) of all pairs; ``bleu_no_unk``: the paper's "No UNK" BLEU, over the
    pairs whose source and reference have no ``<unk>`` (here: the pairs without names; the same pairs for every
    variant).
Only calls the library.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)  # this checkout's attn_jax and experiments/, wherever the script is run from

from experiments._results import load_results, mean_sd_cell, read_lines  # noqa: E402

UNK = "<unk>"
NAME_PARTICLE = "lo"  # attn_jax.data._lexicon.TARGET_PARTICLES[("m", False)]: names are masculine singular

_ONSETS = "b d f g h k l m n p r s t v z br dr gr kr st tr".split()
_NUCLEI = "a e i o u ai ou".split()
_CODAS = ["", "", "n", "r", "s", "k", "l"]


def make_names(count: int, seed: int, avoid: set[str]) -> list[str]:
    """``count`` distinct capitalised pseudo-words (2-3 syllables), none in ``avoid``.

    >>> names = make_names(5, 0, set())
    >>> len(set(names)), all(n[0].isupper() for n in names)
    (5, True)
    """
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < count:
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS) for _ in range(rng.choice((2, 3)))
        )
        word = word.capitalize()
        if word not in avoid and word.lower() not in avoid:
            out[word] = None
    return list(out)


def add_names(pair, nouns: frozenset[str], pool: list[str], rate: float, rng: random.Random):
    """``(source, target, alignment)`` of one generated pair with some singular nouns replaced by names.

    A source noun ``i`` aligns to two target words, the noun and its particle, in that order; both are
    replaced (the name, then ``NAME_PARTICLE``). The alignment is unchanged.

    >>> from attn_jax.data import translate_source
    >>> p = translate_source("the dog saw a cat .")
    >>> s, t, a = add_names(p, frozenset({"dog", "cat"}), ["Kora"], 1.0, random.Random(0))
    >>> s.split()[1] == s.split()[4] == "Kora", t.split().count("Kora"), a == p.alignment
    (True, 2, True)
    """
    src, tgt = pair.source.split(), pair.target.split()
    links = collections.defaultdict(list)
    for link in pair.alignment.split():
        i, j = (int(x) for x in link.split("-"))
        links[i].append(j)
    for i, word in enumerate(src):
        if word in nouns and len(links[i]) == 2 and rng.random() < rate:
            name = rng.choice(pool)
            j_noun, j_particle = sorted(links[i])
            src[i], tgt[j_noun], tgt[j_particle] = name, name, NAME_PARTICLE
    return " ".join(src), " ".join(tgt), pair.alignment


def build_corpus(out: str, smoke: bool, rate: float) -> dict:
    """Write ``<out>/corpus/{split}.src|.tgt|.align``; return the vocabulary caps and corpus statistics."""
    from attn_jax.data import SyntheticSpec, generate_synthetic
    from attn_jax.data._lexicon import LEXICON

    spec = (
        SyntheticSpec(
            train_size=300, validation_size=50, test_per_bucket=2, seed=0, min_length=3, max_length=12
        )
        if smoke
        else SyntheticSpec(
            train_size=20_000, validation_size=500, test_per_bucket=20, seed=0, min_length=3, max_length=30
        )
    )
    splits = generate_synthetic(spec)
    known = set(LEXICON.nouns) | {w for p in splits["train"] for w in (p.source + " " + p.target).split()}
    train_pool = make_names(3000, 1, known)
    eval_pool = make_names(1000, 2, known | set(train_pool))
    nouns = frozenset(LEXICON.nouns)
    rng = random.Random(0)
    corpus = os.path.join(out, "corpus")
    os.makedirs(corpus, exist_ok=True)
    names = set(train_pool) | set(eval_pool)
    stats = {}
    counts = {"src": collections.Counter(), "tgt": collections.Counter()}
    for split, pairs in splits.items():
        generated = len(pairs)
        if split == "train":  # the pairs of at most 30 words per side, as the config keeps
            pairs = [p for p in pairs if max(len(p.source.split()), len(p.target.split())) <= 30]
        pool = train_pool if split == "train" else eval_pool
        rows = [add_names(p, nouns, pool, rate, rng) for p in pairs]
        for ext, k in (("src", 0), ("tgt", 1), ("align", 2)):
            with open(os.path.join(corpus, f"{split}.{ext}"), "w", encoding="utf-8") as f:
                f.writelines(r[k] + "\n" for r in rows)
        tokens = [w for r in rows for w in r[1].split()]
        stats[split] = {
            "pairs": len(rows),
            "dropped_over_30_words": generated - len(rows),  # training only: the config's length limit
            "pairs_with_names": sum(any(w in names for w in r[0].split()) for r in rows),
            "target_name_share": sum(w in names for w in tokens) / max(len(tokens), 1),
        }
        if split == "train":
            for r in rows:
                counts["src"].update(r[0].split())
                counts["tgt"].update(r[1].split())
    caps = {}
    for side, c in counts.items():
        lexicon = {w: n for w, n in c.items() if w not in names}
        named = {w: n for w, n in c.items() if w in names}
        if named and min(lexicon.values()) <= max(named.values()):
            if smoke:  # a 300-pair corpus has lexicon words seen once: the smoke run checks the script only
                print(f"smoke: {side} vocabulary cap does not keep every name out", flush=True)
                caps[side] = len(lexicon)
                continue
            raise SystemExit(
                f"{side}: a lexicon word ({min(lexicon.values())} times) is not more frequent than every name "
                f"({max(named.values())} times): a vocabulary cap would let names in; lower --name-rate"
            )
        caps[side] = len(lexicon)
    stats["vocab_caps"] = caps
    return stats


def name_recall(hyps: list[str], refs: list[str], names: set[str]) -> float:
    """Reference name tokens found in their hypothesis (clipped counts) over all reference name tokens.

    >>> name_recall(["Ka Ka x", "y"], ["Ka Bo", "Bo"], {"Ka", "Bo"})
    0.3333333333333333
    """
    hit = total = 0
    for h, r in zip(hyps, refs, strict=True):
        want = collections.Counter(w for w in r.split() if w in names)
        have = collections.Counter(h.split())
        hit += sum(min(n, have[w]) for w, n in want.items())
        total += sum(want.values())
    return hit / max(total, 1)


def score(variant: str, seed: int, result: dict, names: set[str]) -> dict:
    files = result["files"]
    refs, hyps = (read_lines(files[k]) for k in ("references.txt", "hypotheses.txt"))
    tokens = [w for h in hyps for w in h.split()]
    no_unk = result.get("no_unk") or {}
    return {
        "variant": variant,
        "seed": seed,
        "pairs": len(hyps),
        "bleu": result["bleu"],
        "bleu_no_unk": no_unk.get("bleu"),
        "no_unk_pairs": no_unk.get("sentences"),
        "unk_rate": sum(w == UNK for w in tokens) / max(len(tokens), 1),
        "name_recall": name_recall(hyps, refs, names),
    }


def run_seed(args, variants: list[str], seed: int, names: set[str], caps: dict) -> list[dict]:
    from attn_jax.pipeline import DecodeOptions, evaluate_workdir, quiet_checkpoint_logs
    from attn_jax.train import apply_overrides, load_config, train_and_evaluate

    quiet_checkpoint_logs()
    corpus = os.path.join(args.out, "corpus")
    records = []
    # each training and the systems evaluated from it (replace_unk decodes the baseline's model)
    trained_for = {"baseline": ("baseline", "replace_unk"), "copy": ("copy",)}
    for variant in [v for v, systems in trained_for.items() if set(systems) & set(variants)]:
        overrides = [
            f"seed={seed}",
            f"num_train_steps={args.steps}",
            f"eval_every={args.steps}",
            f"checkpoint_every={args.steps}",
            "log_every=50",
            "tensorboard=false",
            "async_checkpoints=false",
            "data.corpus=plain",
            f"data.source_path={corpus}/{{split}}.src",
            f"data.target_path={corpus}/{{split}}.tgt",
            f"data.alignment_path={corpus}/{{split}}.align",
            f"data.src_vocab_size={caps['src']}",
            f"data.tgt_vocab_size={caps['tgt']}",
        ]
        if variant == "copy":
            overrides.append("model.copy=true")
        spec = os.path.join(REPO, "configs", "rnnsearch_cpu.py") + (":smoke" if args.smoke else "")
        config = apply_overrides(load_config(spec), overrides)
        workdir = os.path.join(args.out, f"{variant}_s{seed}")
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"== {variant} seed {seed}: training -> {workdir}", flush=True)
        t0 = time.perf_counter()
        trained = train_and_evaluate(config, workdir, tty=False)
        train_s = time.perf_counter() - t0
        for name in (n for n in trained_for[variant] if n in variants):
            replace = name == "replace_unk"
            t0 = time.perf_counter()
            result = evaluate_workdir(
                workdir,
                split="test",
                decode=DecodeOptions(beam_size=args.beam, replace_unk=replace),
                num_heatmaps=0,
                out_dir=os.path.join(workdir, "eval", name),
            )
            record = score(name, seed, result, names)
            record.update(
                steps=args.steps,
                beam=args.beam,
                validation_nll=(trained.validation or {}).get("nll_per_token"),
                gold_hit=(trained.validation or {}).get("attn_gold_hit"),
                train_s=round(train_s, 1),
                eval_s=round(time.perf_counter() - t0, 1),
            )
            print(json.dumps(record), flush=True)
            records.append(record)
    return records


def table(records: list[dict]) -> str:
    """Mean ± sd over seeds per variant (markdown)."""
    cols = [
        ("unk_rate", "UNK rate (%)", 100),
        ("name_recall", "names written (%)", 100),
        ("bleu", "BLEU", 1),
        ("bleu_no_unk", "BLEU No UNK", 1),
        ("validation_nll", "val. NLL/token", 1),
        ("gold_hit", "val. gold hit", 1),
    ]
    lines = ["| variant | seeds | " + " | ".join(c[1] for c in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for variant in ("baseline", "replace_unk", "copy"):
        rs = [r for r in records if r["variant"] == variant]
        if not rs:
            continue
        cells = []
        for key, _, scale in cols:
            cells.append(mean_sd_cell([r[key] * scale for r in rs if r.get(key) is not None]))
        label = {"baseline": "no copy", "replace_unk": "no copy + replace_unk", "copy": "model.copy"}[variant]
        lines.append(f"| {label} | {','.join(str(r['seed']) for r in rs)} | " + " | ".join(cells) + " |")
    if records:
        r = records[0]
        lines.append(
            f"\n{r['pairs']} test pairs, {r.get('no_unk_pairs')} of them without names (the No UNK pairs)."
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/copy")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--variants", default="baseline,replace_unk,copy")
    p.add_argument("--steps", type=int, default=1500, help="updates per run (the demo: 1500)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--name-rate", type=float, default=0.25, help="share of singular source nouns made names")
    p.add_argument("--table", action="store_true", help="print the table of results.jsonl and exit")
    p.add_argument("--smoke", action="store_true", help="configs/rnnsearch_cpu.py:smoke on a tiny corpus")
    args = p.parse_args(argv)
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    if args.table:
        print(table(load_results(args.out)))
        return
    stats = build_corpus(args.out, args.smoke, args.name_rate)
    print("corpus:", json.dumps(stats), flush=True)
    with open(os.path.join(args.out, "corpus", "stats.json"), "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1)
    names = set()  # for scoring: every capitalised token of the target files (the lexicon is lower case)
    for split in ("train", "validation", "test"):
        for line in read_lines(os.path.join(args.out, "corpus", f"{split}.tgt")):
            names.update(w for w in line.split() if w[:1].isupper())
    variants = args.variants.split(",")
    done = {(r["variant"], r["seed"]) for r in load_results(args.out)}
    for seed in (int(s) for s in args.seeds.split(",")):
        todo = [v for v in variants if (v, seed) not in done]
        if not todo:
            print(f"== seed {seed}: done already, skipped", flush=True)
            continue
        for record in run_seed(args, todo, seed, names, stats["vocab_caps"]):
            with open(os.path.join(args.out, "results.jsonl"), "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
    print(table(load_results(args.out)))


if __name__ == "__main__":
    main()
