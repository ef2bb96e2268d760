"""Data snapshots on Ray: the same build with data.executor=local and =ray, side by side in one run.

For each size (generated support chats with ~10% planted near duplicates, mlops.data.labelled_dedup), the
build runs in a fresh child process with:
  local            the process pool, data.workers=2
  ray-1node        a running one-node Ray cluster (`ray start --head --num-cpus=2`)
  ray-2nodes       a running two-node cluster on this machine (1 CPU each: the same 2 cores, more overhead)
  ray-private      no cluster: the build starts its own Ray (data.ray.address unset), start-up included
Printed per run: records/s, the driver's peak RSS and the largest worker's (sampled every 0.25 s over the build's
and the cluster's processes), driver and worker CPU seconds, the snapshot id (the same for every executor), and
near-dedup precision and recall against the planted groups. Then the ratios and a cost model for 10M and 100M
records: seconds per record on the driver (d, serial: reading, the LSH index, shard writing) and in the workers
(c, parallel), so w workers take between n*max(d, c/w) (fully pipelined) and n*(d + c/w).

Since issue 30 the per-record cleaning and dedup run on the workers (mlops.data.sharded), so the cost model takes
d and c as marginal costs between the smallest and the largest size (start-up, imports and the tokenizer load drop
out) and prints the driver's serial share of the per-record total, d / (d + c/w), for w = 2..128.

`--lsh-sizes` measures the sharded dedup stage alone (band tasks and the cluster task over a local pool of 2, the
same task code as a build) on generated signatures with planted exact and near duplicates across partitions:
peak RSS of its driver and workers per size, and precision and recall against the plants. It shows memory at 1M
records and more where a whole build would take hours on a small machine.

Goals: ray-1node <= 1.3x the time of local; worker RSS flat as records grow (largest/smallest size <= 1.2x);
dedup precision >= 0.99 at every size; the driver's share at w = 32 <= 10% (issue 30).

Usage: .venv/bin/python benchmarks/bench_data_ray.py [--sizes 20000 200000] [--modes local ray-1node ...]
       .venv/bin/python benchmarks/bench_data_ray.py --lsh-sizes 100000 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODES = ["local", "ray-1node", "ray-2nodes", "ray-private"]
CHILD = r"""
import json, os, resource, sys, time
from mlops.config import load_config
from mlops.data.build import build_snapshot
from mlops.tracking import MemoryTracker
cfg = load_config(sys.argv[1], sys.argv[2:])
started = time.perf_counter()
result = build_snapshot(cfg, MemoryTracker(), force=True)
seconds = time.perf_counter() - started
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
m = result.manifest
print(json.dumps({"seconds": seconds, "path": str(result.path), "snapshot_id": result.snapshot_id,
                  "samples": sum(m["counts"]["samples"].values()), "kept": m["counters"].get("cleaning.kept", 0),
                  "driver_rss_mb": me.ru_maxrss / 1024, "driver_cpu_s": me.ru_utime + me.ru_stime,
                  "child_cpu_s": kids.ru_utime + kids.ru_stime}))
"""


def generate(folder: Path, n: int) -> tuple[Path, dict[str, int]]:
    """`n` chats, ~10% of them light edits of an earlier one; returns the file and record id -> group."""
    from mlops.data.labelled_dedup import dedup_cases
    from mlops.data.records import record_id

    groups: dict[str, int] = {}
    path = folder / f"chats-{n}.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for case in dedup_cases(n, seed=7):
            groups.setdefault(record_id("chat", case.messages), case.group)
            fh.write(json.dumps({"messages": case.messages, "domain": "general"}, ensure_ascii=False) + "\n")
    return path, groups


def dedup_quality(snapshot: Path, source: Path, groups: dict[str, int]) -> dict:
    """Precision and recall of the dedup drops (exact and near) against the planted groups, over the records
    that reached dedup (not filtered earlier), in file order."""
    from mlops.data.records import record_id

    dropped: dict[str, dict] = {}
    other: set[str] = set()
    for line in (snapshot / "quarantine" / "records.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["stage"] == "dedup":
            dropped[row["record_id"]] = row
        else:
            other.add(row["record_id"])
    right = expected = 0
    seen: set[int] = set()
    with source.open(encoding="utf-8") as fh:
        for line in fh:
            rid = record_id("chat", json.loads(line)["messages"])
            if rid in other:
                continue
            group = groups[rid]
            expected += group in seen
            seen.add(group)
    for rid, row in dropped.items():
        right += groups.get(row.get("duplicate_of", ""), -1) == groups[rid]
    drops = len(dropped)
    return {"drops": drops, "wrong": drops - right, "precision": right / drops if drops else 1.0,
            "recall": right / expected if expected else 1.0, "duplicates": expected}


class Sampler(threading.Thread):
    """Peak RSS and CPU seconds of every worker process under the build or the cluster, sampled."""

    def __init__(self, roots: list[int], groups: list[int], mode: str) -> None:
        super().__init__(daemon=True)
        self.roots, self.groups, self.mode = roots, groups, mode
        self.peak: dict[int, float] = {}
        # The roots' own peak, sampled: their ru_maxrss would include the harness's, since Linux keeps it over exec.
        self.root_peak = 0.0
        self.cpu: dict[int, float] = {}
        self.done = threading.Event()

    def workers(self):
        import psutil

        procs = []
        for root in self.roots:
            try:
                procs += psutil.Process(root).children(recursive=True)
            except psutil.Error:
                pass
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) in self.groups:
                    procs += [proc, *proc.children(recursive=True)]
            except (psutil.Error, ProcessLookupError):
                pass
        out = {}
        for proc in procs:
            try:
                cmd = proc.cmdline()
            except psutil.Error:
                continue
            name = cmd[0] if cmd else ""
            ray_worker = name.startswith("ray::") and "Agent" not in name
            pool_worker = self.mode == "local" and proc.ppid() in self.roots and "python" in name
            if ray_worker or pool_worker:
                out[proc.pid] = proc
        return out.values()

    def run(self) -> None:
        import psutil

        while not self.done.is_set():
            for root in self.roots:
                try:
                    self.root_peak = max(self.root_peak, psutil.Process(root).memory_info().rss / 2**20)
                except psutil.Error:
                    pass
            for proc in self.workers():
                try:
                    self.peak[proc.pid] = max(self.peak.get(proc.pid, 0), proc.memory_info().rss / 2**20)
                    t = proc.cpu_times()
                    self.cpu[proc.pid] = t.user + t.system
                except psutil.Error:
                    pass
            self.done.wait(0.25)


def sampled_child(args: list[str], env: dict, groups: list, mode: str, what: str, cwd=None) -> tuple[dict, Sampler]:
    """Run `python -c args...` while a Sampler watches its memory and CPU; its last stdout line is its JSON result."""
    proc = subprocess.Popen([sys.executable, "-c", *args], env=env, cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sampler = Sampler([proc.pid], groups, mode)
    sampler.start()
    out, err = proc.communicate()
    sampler.done.set()
    sampler.join()
    if proc.returncode != 0:
        sys.exit(f"{what} failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1]), sampler


def run_build(work: Path, source: Path, mode: str, address: str | None, groups: list[int]) -> dict:
    home = work / f"home-{mode}"
    home.mkdir(parents=True, exist_ok=True)
    config = home / "data.yaml"
    model = REPO / ".mlops" / "test-cache" / "models" / "tiny"
    data = {"sources": [{"path": str(source)}], "workers": 2, "seq_len": 512, "output_dir": str(home / "snapshots")}
    if mode != "local":
        data["executor"] = "ray"
        data["ray"] = {"address": address} if address else {}
    config.write_text(json.dumps({"base_model": str(model) if model.exists() else "tiny",
                                  "run": {"experiment": "bench", "seed": 1}, "data": data}))
    env = {**os.environ, "MLOPS_HOME": str(home), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO)}
    load = os.getloadavg()[0]
    r, sampler = sampled_child([CHILD, str(config)], env, groups, mode, f"{mode} build of {source.name}", cwd=home)
    worker_cpu = r["child_cpu_s"] if mode == "local" else sum(sampler.cpu.values())
    r.update(mode=mode, load_before=load, worker_rss_mb=max(sampler.peak.values(), default=0.0),
             driver_rss_mb=sampler.root_peak,
             workers_seen=len(sampler.peak), worker_cpu_s=worker_cpu)
    return r


def start_cluster(mode: str):
    from tests.ray_cluster import RayCluster

    nodes, cpus = (1, 2) if mode == "ray-1node" else (2, 1)
    return RayCluster(nodes=nodes, cpus_per_node=cpus, object_store_mb=256).start()


def measure(sizes: list[int], modes: list[str]) -> dict:
    results: dict = {"runs": []}
    clusters = {m: start_cluster(m) for m in modes if m in ("ray-1node", "ray-2nodes")}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
            for n in sizes:
                folder = Path(tmp) / f"n{n}"
                folder.mkdir()
                source, groups = generate(folder, n)
                for mode in modes:
                    c = clusters.get(mode)
                    r = run_build(folder, source, mode, c.address if c else None, c.groups if c else [])
                    r.update(records=n, records_per_s=n / r["seconds"], **dedup_quality(Path(r["path"]), source,
                                                                                        groups))
                    results["runs"].append(r)
                    print(f"  {n:>7} {mode:>11} {r['seconds']:>8.1f} {r['records_per_s']:>7.0f} "
                          f"{r['driver_rss_mb']:>9.0f} {r['worker_rss_mb']:>9.0f} {r['workers_seen']:>3} "
                          f"{r['driver_cpu_s']:>8.1f} {r['worker_cpu_s']:>8.1f} {r['precision']:>9.4f} "
                          f"{r['recall']:>7.4f} {r['load_before']:>5.1f}  {r['snapshot_id']}", flush=True)
    finally:
        for c in clusters.values():
            c.stop()
    return results


def report(results: dict, sizes: list[int], modes: list[str]) -> None:
    runs = results["runs"]
    by = {(r["records"], r["mode"]): r for r in runs}
    print()
    for n in sizes:
        ids = {by[(n, m)]["snapshot_id"] for m in modes if (n, m) in by}
        print(f"{n} records: {'one snapshot id for every executor' if len(ids) == 1 else f'DIFFERENT ids: {ids}'}")
        if (n, "local") in by:
            base = by[(n, "local")]["seconds"]
            for m in modes[1:]:
                if (n, m) in by:
                    ratio = by[(n, m)]["seconds"] / base
                    goal = f" (goal <= 1.3x: {'met' if ratio <= 1.3 else 'MISSED'})" if m == "ray-1node" else ""
                    print(f"  {m:>11} / local time: {ratio:.2f}x{goal}")
    worst = min(r["precision"] for r in runs)
    print(f"dedup precision, lowest of every run: {worst:.4f} (goal >= 0.99: {'met' if worst >= 0.99 else 'MISSED'})")
    if len(sizes) > 1:
        for m in modes:
            small, large = by.get((sizes[0], m)), by.get((sizes[-1], m))
            if small and large and small["worker_rss_mb"]:
                ratio = large["worker_rss_mb"] / small["worker_rss_mb"]
                print(f"  {m:>11} worker RSS {sizes[-1]}/{sizes[0]}: {small['worker_rss_mb']:.0f} -> "
                      f"{large['worker_rss_mb']:.0f} MB = {ratio:.2f}x (goal flat, <= 1.2x: "
                      f"{'met' if ratio <= 1.2 else 'MISSED'})")
    else:
        print("worker RSS flat as records grow: not measured (one size only; goal not judged)")
    largest, smallest = max(sizes), min(sizes)
    for m in modes:
        r, base = by.get((largest, m)), by.get((smallest, m))
        if not r:
            continue
        if base and largest > smallest:  # marginal: what one more record costs, start-up excluded
            n = largest - smallest
            d, c = (r["driver_cpu_s"] - base["driver_cpu_s"]) / n, (r["worker_cpu_s"] - base["worker_cpu_s"]) / n
            how = f"marginal between {smallest} and {largest} records"
        else:
            d, c = r["driver_cpu_s"] / largest, r["worker_cpu_s"] / largest
            how = f"average at {largest} records (start-up included)"
        d, c = max(d, 1e-9), max(c, 1e-9)
        print(f"cost model from {m}, {how}: driver d={d * 1e3:.3f} ms/record (serial), "
              f"workers c={c * 1e3:.2f} CPU-ms/record (parallel); driver ceiling {1 / d:.0f} records/s")
        shares = {w: d / (d + c / w) for w in (2, 8, 32, 128)}
        print("  driver share of the per-record total d/(d+c/w): " + "  ".join(
            f"w={w}: {s:.1%}" for w, s in shares.items()) + f"  (goal at w=32 <= 10%: "
            f"{'met' if shares[32] <= 0.10 else 'MISSED'})")
        for total in (10_000_000, 100_000_000):
            cells = []
            for w in (2, 8, 32, 128):
                fast, slow = total * max(d, c / w) / 3600, total * (d + c / w) / 3600
                cells.append(f"w={w}: {fast:.1f}-{slow:.1f} h")
            print(f"  {total // 1_000_000:>4}M records  " + "  ".join(cells))


LSH_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from mlops.data.lsh import lsh_params
from mlops.data.lshtasks import band_task, cluster_task, partition_segment, plan_dedup
from mlops.data.parallel import OrderedPool
folder, parts = Path(sys.argv[1]), json.loads(sys.argv[2])
bands, rows = lsh_params(0.7, 128)
segments, base = [], 0
for path, count in parts:
    segments.append(partition_segment(base, count, Path(path), True))
    base += count
started = time.perf_counter()
with OrderedPool(2, int) as pool:
    planned = plan_dedup(segments, folder, True, True, bands, rows, 0.7)
    tried = sum(pool.map(band_task, planned))
    drops = list(pool.map(cluster_task, [{"segments": segments, "edges": [t["out"] for t in planned],
                                          "first_new": 0, "exact": True}]))[0]
    seconds = time.perf_counter() - started
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": seconds, "tasks": len(planned), "confirmations": tried, "drops": drops,
                  "driver_rss_mb": me.ru_maxrss / 1024, "driver_cpu_s": me.ru_utime + me.ru_stime,
                  "child_cpu_s": kids.ru_utime + kids.ru_stime}))
"""
PART_ROWS = 60_000  # what a 32 MB partition of chats holds


def lsh_corpus(folder: Path, n: int) -> tuple[list, dict[int, int]]:
    """Partition folders of random signatures (no two alike) where 5% of rows are near copies (10% of their rows
    changed: Jaccard ~0.9) and 2% exact copies of rows of the partition before; returns the parts and dup -> original."""
    import numpy as np

    from mlops.data.lsh import band_hashes, lsh_params

    bands, rows = lsh_params(0.7, 128)
    rng = np.random.default_rng(7)
    parts, planted, previous, base = [], {}, None, 0
    for number, start in enumerate(range(0, n, PART_ROWS)):
        count = min(PART_ROWS, n - start)
        sigs = rng.integers(0, 2**32, size=(count, 128), dtype=np.uint64).astype("<u4")
        exact = rng.integers(0, 2**63, size=count, dtype=np.uint64)
        src_sigs, src_exact, src_base = previous or (sigs, exact, base)
        picks = np.sort(rng.permutation(count)[: count * 7 // 100])  # in order: an original is final when copied
        for j, row in enumerate(picks.tolist()):
            original = int(rng.integers(0, len(src_sigs) if previous else max(1, row)))
            if src_base + original >= base + row:
                continue
            sigs[row] = src_sigs[original]
            if j % 7 < 2:
                exact[row] = src_exact[original]
            else:
                changed = rng.permutation(128)[:13]
                sigs[row, changed] = rng.integers(0, 2**32, size=13, dtype=np.uint64).astype("<u4")
            planted[base + row] = src_base + original
        part = folder / f"p{number:05d}"
        part.mkdir()
        np.save(part / "sigs.npy", sigs)
        np.save(part / "exact.npy", exact.astype("<u8"))
        np.save(part / "ids.npy", np.arange(base, base + count, dtype="<u8"))
        np.save(part / "bands.npy", band_hashes(sigs, bands, rows))
        parts.append((str(part), count))
        previous, base = (sigs, exact, base), base + count
    return parts, planted


def lsh_quality(parts: list, planted: dict[int, int]) -> dict:
    dropped = {}
    for path, _ in parts:
        drops = Path(path) / "drops.jsonl"
        if drops.exists():
            for line in drops.read_text().splitlines():
                row, _, kept, _ = json.loads(line)
                dropped[int(Path(path).name[1:]) * PART_ROWS + row] = int(kept[2:], 16)
    # An original planted twice, or a copy of a copy, joins one cluster: the root is the smallest original.
    root = {}
    for dup in sorted(planted):
        root[dup] = root.get(planted[dup], planted[dup])
    right = sum(1 for k, v in dropped.items() if root.get(k) == v)
    return {"drops": len(dropped), "precision": right / len(dropped) if dropped else 1.0,
            "recall": right / len(planted) if planted else 1.0}


def measure_lsh(sizes: list[int]) -> None:
    print(f"  {'records':>8} {'tasks':>5} {'seconds':>8} {'driver MB':>9} {'worker MB':>9} {'drv CPU':>8} "
          f"{'wrk CPU':>8} {'drops':>7} {'precision':>9} {'recall':>7} {'load':>5}")
    runs = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-lsh-") as tmp:
            parts, planted = lsh_corpus(Path(tmp), n)
            load = os.getloadavg()[0]
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            out, sampler = sampled_child([LSH_CHILD, tmp, json.dumps(parts)], env, [], "local",
                                         f"the LSH stage at {n} records")
            r = {**out, **lsh_quality(parts, planted), "records": n,
                 "worker_rss_mb": max(sampler.peak.values(), default=0.0), "driver_rss_mb": sampler.root_peak,
                 "load": load}
            runs.append(r)
            print(f"  {n:>8} {r['tasks']:>5} {r['seconds']:>8.1f} {r['driver_rss_mb']:>9.0f} "
                  f"{r['worker_rss_mb']:>9.0f} {r['driver_cpu_s']:>8.1f} {r['child_cpu_s']:>8.1f} {r['drops']:>7} "
                  f"{r['precision']:>9.4f} {r['recall']:>7.4f} {load:>5.1f}", flush=True)
    if len(runs) > 1:
        a, b = runs[0], runs[-1]
        for key in ("driver_rss_mb", "worker_rss_mb"):
            ratio = b[key] / a[key] if a[key] else float("nan")
            print(f"  {key} {b['records']}/{a['records']}: {a[key]:.0f} -> {b[key]:.0f} MB = {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20000, 200000])
    parser.add_argument("--modes", nargs="+", default=MODES[:3], choices=MODES, help="ray-private: also a build "
                        "that starts its own Ray")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--lsh-sizes", type=int, nargs="+", help="measure only the sharded dedup stage at these sizes")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    if args.lsh_sizes:
        print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs); sharded dedup stage only")
        measure_lsh(args.lsh_sizes)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        return
    modes = ["local", *[m for m in args.modes if m != "local"]]  # local first: the ratios' base
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print(f"  {'records':>7} {'executor':>11} {'seconds':>8} {'rec/s':>7} {'driver MB':>9} {'worker MB':>9} "
          f"{'n':>3} {'drv CPU':>8} {'wrk CPU':>8} {'precision':>9} {'recall':>7} {'load':>5}  snapshot")
    started = time.perf_counter()
    results = measure(args.sizes, modes)
    report(results, args.sizes, modes)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}; {time.perf_counter() - started:.0f} s in all (this "
          f"harness itself peaked at {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB RSS)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
