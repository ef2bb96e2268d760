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

Goals: ray-1node <= 1.3x the time of local; worker RSS flat as records grow (largest/smallest size <= 1.2x);
dedup precision >= 0.99 at every size.

Usage: .venv/bin/python benchmarks/bench_data_ray.py [--sizes 20000 200000] [--modes local ray-1node ...]
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
            for proc in self.workers():
                try:
                    self.peak[proc.pid] = max(self.peak.get(proc.pid, 0), proc.memory_info().rss / 2**20)
                    t = proc.cpu_times()
                    self.cpu[proc.pid] = t.user + t.system
                except psutil.Error:
                    pass
            self.done.wait(0.25)


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
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(config)], env=env, cwd=home, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sampler = Sampler([proc.pid], groups, mode)
    sampler.start()
    out, err = proc.communicate()
    sampler.done.set()
    sampler.join()
    if proc.returncode != 0:
        sys.exit(f"{mode} build of {source.name} failed:\n{err[-3000:]}")
    r = json.loads(out.strip().splitlines()[-1])
    worker_cpu = r["child_cpu_s"] if mode == "local" else sum(sampler.cpu.values())
    r.update(mode=mode, load_before=load, worker_rss_mb=max(sampler.peak.values(), default=0.0),
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
    largest = max(sizes)
    for m in modes:
        r = by.get((largest, m))
        if not r:
            continue
        d = r["driver_cpu_s"] / largest
        c = r["worker_cpu_s"] / largest
        print(f"cost model from {m} at {largest} records: driver d={d * 1e3:.2f} ms/record (serial), "
              f"workers c={c * 1e3:.2f} CPU-ms/record (parallel); driver ceiling {1 / d:.0f} records/s")
        for total in (10_000_000, 100_000_000):
            cells = []
            for w in (2, 8, 32, 128):
                fast, slow = total * max(d, c / w) / 3600, total * (d + c / w) / 3600
                cells.append(f"w={w}: {fast:.1f}-{slow:.1f} h")
            print(f"  {total // 1_000_000:>4}M records  " + "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20000, 200000])
    parser.add_argument("--modes", nargs="+", default=MODES[:3], choices=MODES, help="ray-private: also a build "
                        "that starts its own Ray")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
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
