"""Near dedup side by side with datatrove (issue 30): the same generated corpus, one run, each contender in a
fresh child process, CPU time (the process and every worker it reaped) measured inside the child after its
entry points are imported.

Corpus: generated support chats (mlops.data.labelled_dedup, seed 7) of which ~10% are light edits of an
earlier chat (greeting, sign-off, a changed word or number, a typo, punctuation, case): the planted truth is
each record's group. Written twice, with the same text: `chats.jsonl` (messages, what our build reads) and
`texts.jsonl` ({"id", "text"}, the text our dedup sees: the messages joined by newlines), which both dedup-only
contenders read with the standard library's json and write their kept records to (the same I/O on both sides).

Contenders:
  datatrove      datatrove 0.10.1's MinHash pipeline on its LocalPipelineExecutor (one worker): signature ->
                 buckets (one task per band) -> cluster -> filter, then the kept records written
  datatrove (digits kept)  the same with norm_numbers off (its default turns every number into 0; ours keeps
                 numbers): shows how much of its precision is the normalisation and how much the missing
                 confirmation
  ours (build's LSH)  the build's dedup, mlops.data.lsh.dedup_texts (its stable entry point for comparisons):
                 exact hash and MinHash signature per record, LSH sorted per band, candidates confirmed at the
                 threshold, connected components keeping the first record; in one process
  ours (greedy, disk / memory)  the earlier in-order path: mlops.data.dedup's ExactIndex and NearIndex (or
                 mlops.data.diskindex's on-disk pair) queried and filled record by record, candidates confirmed;
                 shown for comparison, not judged
  ours build     the whole `build_snapshot` (parse, PII scrub, filters, decontamination, dedup, mixing,
                 tokenization, the Great Expectations gate, shards, manifest and acceptance report), 2 workers
  datatrove pipeline / ours pipeline / ours extras  the whole pipeline against datatrove's whole pipeline, the
                 same steps on one corpus (issue 43 item 4): read JSONL, Gopher quality and repetition filters (ours:
                 their equivalents), PII formatting of emails and IPs, MinHash dedup, tokenization; our build with
                 its extra steps (GE gate, acceptance report) timed inside it and subtracted, and our other extra
                 steps (decontamination, semantic dedup, perplexity filter) timed alone. benchmarks/data_peer_pipeline.py
                 holds them and says how each side is set up.

Parameters, the same where the two allow: 3-word shingles; LSH with 14 bands of 9 rows (datasketch's choice for
threshold 0.7 at 128 permutations; datatrove gets num_buckets=14, hashes_per_bucket=9, so 126 hashes). Ours
hashes 128 permutations (the last 2 only serve the confirmation) in 32 bits and confirms a candidate at an
estimated Jaccard >= 0.7; datatrove drops every LSH collision (union-find clusters, one kept per cluster), with
64-bit xxhash shingles. Normalisation: ours lowercases and splits on \\w+; datatrove's simplify_text (lowercase,
punctuation, numbers -> 0, diacritics) and then a whitespace split, because its English default (spaCy) is not
installed by the `bench` extra; a split is all spaCy would do to punctuation-free text, and cheaper.

Quality against the planted truth, the same rule for every contender (which member of a group is kept does not
matter): in a group of g records that reached dedup, d dropped, min(d, g-1) drops are right; precision = right
drops / drops, recall = right drops / sum(g-1). The build's filters may reject records before dedup; those
leave its truth.

Goals: ours (build's LSH) records/s per core >= 1.0x datatrove's at the same or better precision and recall;
the whole build's CPU time <= 2x datatrove's dedup-only CPU time (the older goal, kept for comparison); our
pipeline's CPU per record, the same steps, <= 1.0x datatrove's pipeline's at the same or better dedup precision
and recall (issue 43), our extra steps reported apart.

Usage: .venv/bin/python benchmarks/bench_data_peer.py [--records 30000] [--modes ...] [--extras-sample 1000]
       [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import data_peer_pipeline as pipeline

REPO = Path(__file__).resolve().parent.parent
SHINGLE, NUM_PERM, THRESHOLD = 3, 128, 0.7
PIPELINE_MODES = ["datatrove-pipeline", "ours-pipeline", "ours-extras"]
MODES = ["datatrove", "datatrove-digits", "ours-lsh", "ours-disk", "ours-memory", "ours-build", *PIPELINE_MODES]
DEFAULT_MODES = ["datatrove", "datatrove-digits", "ours-lsh", "ours-disk", "ours-build", *PIPELINE_MODES]
LABELS = {"datatrove": "datatrove", "datatrove-digits": "datatrove (digits kept)", "ours-lsh": "ours (build's LSH)",
          "ours-disk": "ours (greedy, disk)", "ours-memory": "ours (greedy, memory)", "ours-build": "ours build",
          "datatrove-pipeline": "datatrove pipeline", "ours-pipeline": "ours pipeline (build)",
          "ours-extras": "ours extra steps"}


def generate(folder: Path, n: int) -> list[int]:
    """Both files and the planted group of every line."""
    from mlops.data.labelled_dedup import dedup_cases

    groups = []
    with (folder / "chats.jsonl").open("w", encoding="utf-8") as chats, \
            (folder / "texts" / "texts.jsonl").open("w", encoding="utf-8") as texts:
        for i, case in enumerate(dedup_cases(n, seed=7)):
            groups.append(case.group)
            chats.write(json.dumps({"messages": case.messages, "domain": "general"}, ensure_ascii=False) + "\n")
            texts.write(json.dumps({"id": f"r-{i:016x}", "text": case.text}, ensure_ascii=False) + "\n")
    return groups


def bands() -> tuple[int, int]:
    from datasketch import MinHashLSH

    probe = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    return probe.b, probe.r


def quality(groups: list[int], dropped: set[int], left_out: set[int]) -> dict:
    size, drops = Counter(), Counter()
    for line, group in enumerate(groups):
        if line not in left_out:
            size[group] += 1
            drops[group] += line in dropped
    right = sum(min(drops[g], size[g] - 1) for g in size)
    expected = sum(s - 1 for s in size.values())
    total = len(dropped)
    return {"drops": total, "wrong": total - right, "duplicates": expected,
            "precision": right / total if total else 1.0, "recall": right / expected if expected else 1.0}


# ------------------------------------------------------------------ contenders (each runs in its own child)


def run_datatrove(folder: Path, work: Path, keep_digits: bool = False) -> dict:
    import numpy as np
    from datatrove.executor.local import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
    )
    from datatrove.pipeline.readers.base import BaseDiskReader
    from datatrove.pipeline.writers.disk_base import DiskWriter
    from datatrove.utils.hashing import HashConfig
    from datatrove.utils.text import TextNormConfig

    class Reader(BaseDiskReader):
        """JsonlReader's loop with the standard library's json (its own needs orjson, not in the extra)."""

        def read_file(self, filepath: str):
            with self.data_folder.open(filepath, "r") as fh:
                for li, line in enumerate(fh):
                    with self.track_time():
                        document = self.get_document_from_dict(json.loads(line), filepath, li)
                    if document:
                        yield document

    class Writer(DiskWriter):
        default_output_filename = "${rank}.jsonl"

        def _write(self, document: dict, file_handler, _filename: str) -> None:
            file_handler.write(json.dumps({"id": document["id"], "text": document["text"]}, ensure_ascii=False)
                               + "\n")

    Signature, Split = pipeline.datatrove_parts()  # UTF-8 bytes to xxhash; a whitespace split
    b, r = bands()
    cfg = MinhashConfig(n_grams=SHINGLE, num_buckets=b, hashes_per_bucket=r, seed=1,
                        norm_config=TextNormConfig(norm_numbers=not keep_digits),
                        hash_config=HashConfig(precision=64, hash_fc="xxhash"))
    texts, logs = str(folder / "texts"), work / "logs"

    def stage(name: str, pipeline: list, tasks: int = 1, depends=None):
        return LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, logging_dir=str(logs / name),
                                     depends=depends)

    signatures = stage("1", [Reader(texts), Signature(str(work / "sigs"), cfg, language=Split("en"))])
    buckets = stage("2", [MinhashDedupBuckets(str(work / "sigs"), str(work / "buckets"), config=cfg)], b, signatures)
    clusters = stage("3", [MinhashDedupCluster(str(work / "buckets"), str(work / "remove"), config=cfg)], 1, buckets)
    stage("4", [Reader(texts), MinhashDedupFilter(str(work / "remove")), Writer(str(work / "kept"), compression=None)],
          1, clusters).run()
    removed = work / "remove" / "000000.remove"
    dropped = np.fromfile(removed, dtype="<u4").tolist() if removed.exists() else []
    return {"dropped": dropped, "params": str(cfg)}


def run_ours_lsh(folder: Path, work: Path) -> dict:
    """The build's dedup (mlops.data.lsh: exact hash and MinHash per record, LSH sorted per band, candidates
    confirmed at the threshold, connected components keeping the first record) through its stable entry point
    for comparisons, `dedup_texts`, in one process."""
    from mlops.data.lsh import dedup_texts

    with (folder / "texts" / "texts.jsonl").open(encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    decisions = dedup_texts([r["text"] for r in rows], threshold=THRESHOLD, num_perm=NUM_PERM, shingle=SHINGLE)
    with (work / "kept.jsonl").open("w", encoding="utf-8") as out:
        for row, d in zip(rows, decisions, strict=True):
            if d.kept:
                out.write(json.dumps({"id": row["id"], "text": row["text"]}, ensure_ascii=False) + "\n")
    return {"dropped": [d.index for d in decisions if not d.kept]}


def run_ours_dedup(folder: Path, work: Path, index: str) -> dict:
    """Each record as the build handles it: exact hash and signature (in a worker, there), then the exact and
    near indexes in record order (mlops.data.clean.Cleaner.dedup)."""
    from mlops.data.dedup import ExactIndex, Keys, NearIndex, exact_hash, signature
    from mlops.data.diskindex import DiskExactIndex, DiskNearIndex, connect

    keys = Keys()
    db = connect(work / "dedup.sqlite") if index == "disk" else None
    exact = DiskExactIndex(db, keys) if db else ExactIndex(keys)
    near = DiskNearIndex(db, THRESHOLD, NUM_PERM, keys) if db else NearIndex(THRESHOLD, NUM_PERM, keys)
    dropped = []
    with (folder / "texts" / "texts.jsonl").open(encoding="utf-8") as fh, \
            (work / "kept.jsonl").open("w", encoding="utf-8") as out:
        for line_no, line in enumerate(fh):
            row = json.loads(line)
            text, key = row["text"], row["id"]
            h, sig = exact_hash(text), signature(text, NUM_PERM, SHINGLE)
            if exact.check_add(h, key) is not None or near.check_add(sig, key) is not None:
                dropped.append(line_no)
                continue
            out.write(json.dumps({"id": key, "text": text}, ensure_ascii=False) + "\n")
    if db is not None:
        db.close()
    return {"dropped": dropped}


def run_ours_build(folder: Path, work: Path) -> dict:
    from mlops.config import load_config
    from mlops.data.build import build_snapshot
    from mlops.data.records import record_id
    from mlops.tracking import MemoryTracker

    model = REPO / ".mlops" / "test-cache" / "models" / "tiny"
    config = work / "data.yaml"
    config.write_text(json.dumps({
        "base_model": str(model) if model.exists() else "tiny", "run": {"experiment": "bench", "seed": 1},
        "data": {"sources": [{"path": str(folder / "chats.jsonl")}], "workers": 2, "output_dir": str(work / "snap"),
                 "dedup": {"threshold": THRESHOLD, "num_perm": NUM_PERM, "shingle": SHINGLE},
                 "accept": {"on_fail": "flag"}}}))
    os.environ["MLOPS_HOME"] = str(work)
    result = build_snapshot(load_config(str(config), []), MemoryTracker(), force=True)
    line_of = {}
    with (folder / "chats.jsonl").open(encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            line_of[record_id("chat", json.loads(line)["messages"])] = i
    dropped, left_out = [], []
    for line in (result.path / "quarantine" / "records.jsonl").read_text().splitlines():
        row = json.loads(line)
        (dropped if row["stage"] == "dedup" else left_out).append(line_of[row["record_id"]])
    accept = result.manifest.get("acceptance") or {}
    return {"dropped": dropped, "left_out": left_out, "snapshot_id": result.snapshot_id,
            "samples": sum(result.manifest["counts"]["samples"].values()), "acceptance_status": accept.get("verdict", {}).get("status")}


def child(mode: str, folder: Path, workers: int, sample: int) -> None:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Entry points imported before the clock starts; what they import lazily is counted.
    if mode.startswith("datatrove"):
        import datatrove.pipeline.dedup.minhash  # noqa: F401
        import datatrove.pipeline.filters  # noqa: F401
        import datatrove.pipeline.formatters  # noqa: F401
        import datatrove.pipeline.readers  # noqa: F401
        import datatrove.pipeline.tokens  # noqa: F401
        import datatrove.pipeline.writers  # noqa: F401
    else:
        import mlops.data.build  # noqa: F401
        import mlops.data.dedup  # noqa: F401
    b_r = bands() if mode == "datatrove-pipeline" else None  # datasketch's choice, outside datatrove's clock
    with tempfile.TemporaryDirectory(prefix=f"peer-{mode}-") as tmp:
        work = Path(tmp)
        cpu0, wall0 = cpu_seconds(), time.perf_counter()
        if mode == "datatrove-pipeline":
            out = pipeline.run_datatrove_pipeline(folder, work, *b_r, SHINGLE)
        elif mode == "ours-pipeline":
            out = pipeline.run_ours_pipeline(folder, work, workers, THRESHOLD, NUM_PERM, SHINGLE)
        elif mode == "ours-extras":
            out = pipeline.run_ours_extras(folder, work, sample)
        elif mode.startswith("datatrove"):
            out = run_datatrove(folder, work, keep_digits=mode == "datatrove-digits")
        elif mode == "ours-build":
            out = run_ours_build(folder, work)
        elif mode == "ours-lsh":
            out = run_ours_lsh(folder, work)
        else:
            out = run_ours_dedup(folder, work, mode.removeprefix("ours-"))
        out.update(cpu_s=cpu_seconds() - cpu0 - out.pop("bookkeeping_s", 0.0), wall_s=time.perf_counter() - wall0,
                   peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print("RESULT " + json.dumps(out))


def cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


# ------------------------------------------------------------------ the run


def measure(folder: Path, mode: str, groups: list[int], args: argparse.Namespace) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_RUN_ID", None)
    load = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, __file__, "--child", mode, "--folder", str(folder), "--workers",
                           str(args.workers), "--extras-sample", str(args.extras_sample)], env=env,
                          capture_output=True, text=True, cwd=folder)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{mode} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    r = json.loads(lines[-1].removeprefix("RESULT "))
    n = len(groups)
    r.update(mode=mode, load_before=load, records=n, per_core=n / r["cpu_s"], per_s=n / r["wall_s"],
             **quality(groups, set(r.get("dropped", [])), set(r.get("left_out", []))))
    judged = (f"{r['drops']:>6} {r['wrong']:>5} {r['precision']:>9.4f} {r['recall']:>7.4f}" if "dropped" in r
              else f"{'-':>6} {'-':>5} {'-':>9} {'-':>7}")  # the extra steps: no dedup to judge
    print(f"  {LABELS[mode]:>23} {r['wall_s']:>7.1f} {r['cpu_s']:>7.1f} {r['per_core']:>9.0f} {r['per_s']:>8.0f} "
          f"{judged} {r['peak_rss_mb']:>6.0f} {load:>5.2f}", flush=True)
    return r


def report(runs: dict[str, dict]) -> None:
    peer, ours, build = runs["datatrove"], runs["ours-lsh"], runs.get("ours-build")
    print()
    for mode in ("ours-lsh", "ours-disk", "ours-memory"):
        if mode not in runs:
            continue
        r = runs[mode]
        ratio = r["per_core"] / peer["per_core"]
        as_good = r["precision"] >= peer["precision"] and r["recall"] >= peer["recall"]
        verdict = "met" if ratio >= 1.0 and as_good else "MISSED"
        judged = "goal >= 1.0x at the same or better precision and recall" if mode == "ours-lsh" else "not judged"
        print(f"dedup records/s per core, {LABELS[mode]} / datatrove: {ratio:.2f}x (precision "
              f"{r['precision']:.4f} vs {peer['precision']:.4f}, recall {r['recall']:.4f} vs {peer['recall']:.4f}; "
              f"{judged}: {verdict if mode == 'ours-lsh' else ('would be ' + verdict)})")
    if "datatrove-digits" in runs:
        d = runs["datatrove-digits"]
        print(f"  datatrove with digits kept (our normalisation keeps them): {d['per_core'] / peer['per_core']:.2f}x "
              f"its default's speed, precision {d['precision']:.4f}, recall {d['recall']:.4f}; ours (build's LSH) / it: "
              f"{ours['per_core'] / d['per_core']:.2f}x")
    if build:
        ratio = build["cpu_s"] / peer["cpu_s"]
        print(f"whole build CPU time / datatrove dedup-only CPU time: {build['cpu_s']:.1f} / {peer['cpu_s']:.1f} s "
              f"= {ratio:.2f}x (goal <= 2x: {'met' if ratio <= 2 else 'MISSED'}); wall {build['wall_s']:.1f} s "
              f"(2 workers) vs {peer['wall_s']:.1f} s (1 worker) = {build['wall_s'] / peer['wall_s']:.2f}x")
        print(f"  the build's own dedup against the planted truth: precision {build['precision']:.4f}, recall "
              f"{build['recall']:.4f} ({len(build['left_out'])} records rejected before dedup, left out); "
              f"snapshot {build['snapshot_id']}, {build['samples']} samples, acceptance {build['acceptance_status']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=30000)
    parser.add_argument("--modes", nargs="+", default=DEFAULT_MODES, choices=MODES)
    parser.add_argument("--workers", type=int, default=2, help="data.workers of our builds (default 2)")
    parser.add_argument("--extras-sample", type=int, default=1000,
                        help="records the model-based extra steps (semantic dedup, perplexity) are timed on")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.folder, args.workers, args.extras_sample)
        return
    sys.path.insert(0, str(REPO))
    from importlib import metadata

    modes = ["datatrove", "ours-lsh", *[m for m in args.modes if m not in ("datatrove", "ours-lsh")]]
    b, r = bands()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs); "
          f"datatrove {metadata.version('datatrove')}, xxhash {metadata.version('xxhash')}, datasketch "
          f"{metadata.version('datasketch')}")
    print(f"{args.records} records; {SHINGLE}-word shingles, {NUM_PERM} permutations, LSH {b} bands x {r} rows, "
          f"threshold {THRESHOLD}")
    print(f"  {'contender':>23} {'wall s':>7} {'CPU s':>7} {'rec/s/core':>9} {'rec/s':>8} {'drops':>6} {'wrong':>5} "
          f"{'precision':>9} {'recall':>7} {'RSS MB':>6} {'load':>5}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
        folder = Path(tmp)
        (folder / "texts").mkdir()
        (folder / "pipeline").mkdir()
        groups = generate(folder, args.records)
        pipe_groups, junk = pipeline.generate(folder, args.records) if set(modes) & set(PIPELINE_MODES) else ([], set())
        runs = {mode: measure(folder, mode, pipe_groups if mode in PIPELINE_MODES else groups, args) for mode in modes}
    report(runs)
    pipeline.report(runs, junk)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{time.perf_counter() - started:.0f} s in all")
    if args.json:
        for r in runs.values():
            r.pop("dropped", None)
            r.pop("left_out", None)
        args.json.write_text(json.dumps(runs, indent=2, default=str))


if __name__ == "__main__":
    main()
