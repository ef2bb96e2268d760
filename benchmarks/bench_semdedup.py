"""Semantic dedup (data.dedup.semantic) beside MinHash on planted paraphrases: precision, recall and CPU cost.

The planted set is `mlops.data.labelled_semantic`: support questions (16 intents, many of them look-alike pairs such
as upgrade / downgrade) asked several ways each (synonyms, reordering, politeness prefixes and sign-offs, one of a
few canned answers), over several seeds, plus a paraphrase flood (one question 30 times). A drop is right when it
names a record of its own intent; recall counts every record but one per intent as a drop to make. Printed:
  precision, recall   per method and setting, summed over the seeds (MinHash at the build's 0.7; semantic at 0.80,
                      0.85 (the default) and 0.90; and both in build order: exact + MinHash, then semantic)
  flood kept          copies of the flooded question each method keeps (1 is ideal)
  cost                CPU ms and wall ms per record on a realistic corpus (mlops.data.labelled_dedup conversations):
                      MinHash signature, LSH (band hashes, buckets, confirmations, clusters); embedding (batch 64),
                      clustering (k-means + in-cluster comparisons); the model load once per worker

Usage: .venv/bin/python benchmarks/bench_semdedup.py [--seeds 3] [--per-group 8] [--cost-records 2000]
       [--json PATH]   (default: benchmarks/results/semdedup-<date>.json)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from mlops.data import semdedup  # noqa: E402
from mlops.data.labelled_semantic import flood, paraphrase_cases, score  # noqa: E402
from mlops.data.lsh import Decision, dedup_texts  # noqa: E402

THRESHOLDS = (0.80, 0.85, 0.90)
# Semantic at its default threshold on the planted set, as a regression bar (measured when written: 1.00, 0.59;
# most misses are rewordings below 0.85 even beside the same canned answer: 0.80 finds 0.72, still exact).
GOAL_PRECISION, GOAL_RECALL = 0.95, 0.50


class Timer:
    def __enter__(self) -> Timer:
        self.cpu, self.wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.cpu, self.wall = time.process_time() - self.cpu, time.perf_counter() - self.wall


def both(texts: list[str], vectors, threshold: float) -> list:
    """Build order: exact + MinHash first, then semantic dedup on what they kept."""
    first = dedup_texts(texts)
    kept = [d.index for d in first if d.kept]
    second = semdedup.semantic_dedup_texts([texts[i] for i in kept], vectors=vectors[kept], threshold=threshold)
    out = list(first)
    for d in second:
        if not d.kept:
            out[kept[d.index]] = Decision(kept[d.index], False, "semantic", kept[d.duplicate_of], d.similarity)
    return out


def add(total: dict, part: dict) -> None:
    for key in ("records", "drops", "right"):
        total[key] = total.get(key, 0) + part[key]
    total["expected"] = total.get("expected", 0) + part["records"] - part["groups"]


def quality(embedder, seeds: int, per_group: int) -> dict:
    from mlops.data.embed import quantise

    totals: dict[str, dict] = {}
    for seed in range(1, seeds + 1):
        cases = paraphrase_cases(per_group=per_group, seed=seed)
        texts, groups = [c.text for c in cases], [c.group for c in cases]
        vectors = quantise(embedder.embed(texts, 64))
        runs = {"minhash 0.7 (build default)": dedup_texts(texts)}
        for t in THRESHOLDS:
            name = f"semantic {t:.2f}" + (" (default)" if t == 0.85 else "")
            runs[name] = semdedup.semantic_dedup_texts(texts, vectors=vectors, threshold=t, seed=seed)
        runs["exact+minhash, then semantic 0.85"] = both(texts, vectors, 0.85)
        for name, decisions in runs.items():
            add(totals.setdefault(name, {}), score(groups, decisions))
    print(f"\n== planted paraphrases: {seeds} seeds x {len(paraphrase_cases(per_group=1))} intents x {per_group}")
    print(f"{'method':36} {'drops':>6} {'right':>6} {'to make':>7} {'precision':>9} {'recall':>7}")
    for name, t in totals.items():
        t["precision"] = t["right"] / t["drops"] if t["drops"] else 1.0
        t["recall"] = t["right"] / t["expected"] if t["expected"] else 1.0
        print(f"{name:36} {t['drops']:>6} {t['right']:>6} {t['expected']:>7} {t['precision']:>9.4f} "
              f"{t['recall']:>7.4f}")
    return totals


def flooded(embedder) -> dict:
    from mlops.data.embed import quantise

    cases = flood(question=0, copies=30)
    texts = [c.text for c in cases]
    copies = [i for i, c in enumerate(cases) if c.group == 0]
    minhash = dedup_texts(texts)
    semantic = semdedup.semantic_dedup_texts(texts, vectors=quantise(embedder.embed(texts, 64)))
    others_lost = sum(not semantic[i].kept for i, c in enumerate(cases) if c.group != 0)
    out = {"copies": len(copies), "minhash_kept": sum(minhash[i].kept for i in copies),
           "semantic_kept": sum(semantic[i].kept for i in copies), "semantic_other_questions_lost": others_lost}
    print(f"\n== paraphrase flood: one question {len(copies)} times among {len(cases) - len(copies)} others")
    print(f"copies kept: minhash {out['minhash_kept']}/{len(copies)}, semantic {out['semantic_kept']}/{len(copies)}"
          f" (ideal 1); other questions lost by semantic: {others_lost}")
    return out


def cost(embedder, records: int) -> dict:
    import numpy as np
    import torch

    from mlops.data.dedup import signature
    from mlops.data.embed import quantise
    from mlops.data.labelled_dedup import conversations
    from mlops.data.lsh import band_hash, bucket_edges, components, lsh_params

    texts = ["\n".join(m["content"] for m in r["messages"]) for r in conversations(records, seed=9)]
    with Timer() as sig:
        sigs = np.stack([signature(t, 128, 3) for t in texts])
    with Timer() as lsh:
        bands, rows = lsh_params(0.7, 128)
        keys = np.arange(len(texts), dtype=np.int64)
        edges = [bucket_edges(band_hash(sigs, b, rows), keys, lambda k: sigs[k], 0.7) for b in range(bands)]
        components(np.concatenate([e.low for e in edges]), np.concatenate([e.high for e in edges]))
    embedder.embed(texts[:64], 64)  # warm-up: first-call allocations are not per-record cost
    with Timer() as emb:
        vectors = quantise(embedder.embed(texts, 64))
    with Timer() as clus:
        k = semdedup.auto_clusters(len(texts))
        labels, rounds = semdedup.kmeans(vectors, k, seed=1, iterations=20)
        _, compared = semdedup.drops_by_cluster(keys, vectors, labels, 0.85)
    n = len(texts)
    words = sum(len(t.split()) for t in texts) / n
    out = {"records": n, "words_per_record": round(words, 1), "torch_threads": torch.get_num_threads(),
           "clusters": k, "kmeans_rounds": rounds, "compared_pairs": compared}
    print(f"\n== cost per record: {n} support conversations, {words:.0f} words each, torch threads "
          f"{torch.get_num_threads()} (CPU time counts every thread)")
    print(f"{'step':40} {'CPU ms/rec':>10} {'wall ms/rec':>11}")
    rows_ = [("minhash signature (128 perm, 3-shingles)", sig), ("minhash LSH (bands, buckets, clusters)", lsh),
             ("semantic embedding (MiniLM-L6, batch 64)", emb),
             (f"semantic clustering (k={k}, {rounds} rounds)", clus)]
    for name, t in rows_:
        print(f"{name:40} {1000 * t.cpu / n:>10.3f} {1000 * t.wall / n:>11.3f}")
        out[name] = {"cpu_ms": 1000 * t.cpu / n, "wall_ms": 1000 * t.wall / n}
    mh, se = (sig.cpu + lsh.cpu) / n, (emb.cpu + clus.cpu) / n
    out["minhash_cpu_ms"], out["semantic_cpu_ms"] = 1000 * mh, 1000 * se
    print(f"{'total: minhash':40} {1000 * mh:>10.3f}\n{'total: semantic':40} {1000 * se:>10.3f}  "
          f"({se / mh:.0f}x minhash)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--per-group", type=int, default=8)
    parser.add_argument("--cost-records", type=int, default=2000)
    parser.add_argument("--json", type=Path,
                        default=REPO / "benchmarks" / "results" / f"semdedup-{time.strftime('%Y-%m-%d')}.json")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    from mlops.data.embed import Embedder

    with Timer() as load:
        embedder = Embedder("all-MiniLM-L6-v2")
    print(f"model load (once per worker): {load.wall:.2f} s wall, {load.cpu:.2f} s CPU")
    results = {"model_load_s": load.wall, "quality": quality(embedder, args.seeds, args.per_group),
               "flood": flooded(embedder), "cost": cost(embedder, args.cost_records)}
    default = results["quality"]["semantic 0.85 (default)"]
    ok = default["precision"] >= GOAL_PRECISION and default["recall"] >= GOAL_RECALL
    print(f"\nsemantic 0.85: precision {default['precision']:.4f} (goal >= {GOAL_PRECISION}), recall "
          f"{default['recall']:.4f} (goal >= {GOAL_RECALL}): {'met' if ok else 'MISSED'}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    results["load_after"] = os.getloadavg()[0]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"written: {args.json.relative_to(REPO) if args.json.is_relative_to(REPO) else args.json}")


if __name__ == "__main__":
    main()
