"""`mlops data build`: sources -> records -> clean -> mix -> tokenized, gated batches -> shards + manifest.

Streaming throughout: records flow through in chunks, cleaned records are spilled per domain to disk,
batches are tokenized in worker processes and shards are flushed as they fill. Everything is written in a
staging folder that becomes `.mlops/snapshots/<id>/` only after its manifest is written (format.publish).
The id is a content hash, and a build whose inputs and config were built before returns at once.

Failure is clean: a bad row or record is quarantined alone (with `data.on_bad_record: skip`); an error,
SIGTERM or Ctrl-C stops the worker processes and removes the staging folder before it propagates, workers
of a SIGKILLed build exit by themselves (mlops.data.parallel), and the next build sweeps staging folders
whose build died. A build that keeps fewer than `data.min_records` records fails and publishes nothing.

`data.executor` picks where the per-record work runs: a local process pool (mlops.data.parallel) or Ray tasks
on a cluster (mlops.data.ray_executor). Reading, cleaning and dedup run as per-partition and per-band tasks
(mlops.data.sharded); mixing, tokenizing, gating and writing run as one task per group of batches
(mlops.data.batchtasks). This process plans them, sums their reports and assembles the pieces: it never reads a
record. Either executor maps tasks in input order, duplicate clusters keep their smallest (source, line) key and
the mix follows from counts and the seed alone, so the snapshot (id, manifest counters, quarantine, shard bytes)
depends neither on the executor nor on the worker count.
"""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlops.data import acceptance, clean, tokenize
from mlops.data.batches import BatchWriter, GateError
from mlops.data.batchtasks import write_group
from mlops.data.checks import RecordPolicy
from mlops.data.format import (
    hash_files,
    publish,
    read_manifest,
    snapshot_id_for,
    staging_dir,
    sweep_stale_staging,
)
from mlops.data.gate import SUITES, GateParams
from mlops.data.inputs import Inputs, cached_snapshot, prepare, remember_build
from mlops.data.manifest import assemble_manifest, log_build
from mlops.data.mixing import plan_mix
from mlops.data.parallel import OrderedPool, open_executor
from mlops.data.quarantine import Quarantine
from mlops.data.sharded import CleanSummary, run_cleaning
from mlops.errors import MLOpsError

__all__ = ["BuildResult", "EmptySnapshotError", "GateError", "Terminated", "build_snapshot"]


class EmptySnapshotError(MLOpsError):
    """The build kept fewer records than data.min_records; nothing was published."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so every cleanup runs and the run is marked KILLED."""


@contextmanager
def sigterm_raises() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(f"terminated by signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class BuildResult:
    snapshot_id: str
    path: Path
    manifest: dict
    noop: bool


def _init_workers(cfg_json: str, eval_index, model_path: str | dict, blocklist=None) -> None:
    clean.init_worker(cfg_json, eval_index, blocklist)
    tokenize.init_worker(model_path)


class Build:
    def __init__(self, inputs: Inputs, staging: Path) -> None:
        self.inputs = inputs
        self.data = inputs.data
        self.staging = staging
        self.work = staging / ".work"
        self.work.mkdir(parents=True)
        (staging / "reports").mkdir()
        self.quarantine = Quarantine(staging / "quarantine", self.data.excerpt_chars)
        self.counters: Counter[str] = Counter()
        self.issues: list[dict] = []
        self.per_source = {s["name"]: Counter() for s in inputs.sources}
        self.shard_hashes: dict[str, str] = {}  # the workers' sha256 of the shards they wrote

    # ----------------------------------------------------------------- stage A: clean and dedup (on the workers)

    def clean(self, pool: OrderedPool) -> tuple[CleanSummary, dict[str, int], dict[str, list[Path]]]:
        summary, available, paths = run_cleaning(self, pool)
        self.counters.update(summary.counters)
        with (self.staging / "reports" / "decontam.jsonl").open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(h, ensure_ascii=False, sort_keys=True) + "\n" for h in summary.decontam_hits)
        return summary, available, paths

    def dedup_params(self) -> dict:
        d = self.data.dedup
        return {"num_perm": d.num_perm, "shingle": d.shingle, "threshold": d.threshold, "scheme": "affine32"}

    # ----------------------------------------------------------------- stage D: mix, tokenize, gate, write (workers)

    def batches(self, pool: OrderedPool, plan, paths: dict[str, list[tuple[Path, int]]], writer: BatchWriter) -> None:
        data = self.data
        policy = RecordPolicy(data.seq_len, data.gate.min_tokens, data.overlong, data.excerpt_chars)
        gate = (self.suite, self.gate_params(plan.targets), plan.targets, policy)
        tasks = writer.plan(paths, plan.take, gate)
        for task, sums in pool.map_pairs(write_group, tasks):
            writer.add_group(task, sums)

    def run(self) -> dict:
        inputs, data = self.inputs, self.data
        cfg_json = data.model_dump_json()
        try:
            eval_index = self.eval_index()
            if data.executor == "local":  # loaded once here so forked workers inherit them; Ray workers load theirs
                tokenize.preload(inputs.model["path"])
                import great_expectations  # noqa: F401

            started = time.time()
            # Ray workers may run where the model folder is not: they get its tokenizer files instead of its path.
            model = tokenize.portable(inputs.model["path"]) if data.executor == "ray" else inputs.model["path"]
            with open_executor(data, _init_workers, (cfg_json, eval_index, model, inputs.blocklist)) as pool:
                cleaner, available, paths = self.clean(pool)
                self.require_records(sum(available.values()), "after cleaning")
                plan = plan_mix(available, data.mix.ratios)
                self.counters.update({f"mix.dropped_domain.{d}": n for d, n in plan.dropped_domains.items()})
                self.counters.update({f"mix.not_selected.{d}": available[d] - plan.take.get(d, 0)
                                      for d in available if d in plan.take})
                writer = BatchWriter(inputs, self.staging, SUITES.get(self.suite), plan.targets, self.quarantine)
                self.batches(pool, plan, paths, writer)
                self.counters.update(writer.counters)
                written = sum(b["records"] for b in writer.batches if b["status"] == "passed")
                self.require_records(written, "after the per-record checks and the batch gate")
                writer.add_history(pool)
            writer.close()
        finally:
            self.quarantine.close()
        writer.finish_index(self.dedup_params())
        self.shard_hashes = writer.files
        shutil.rmtree(self.work)
        return assemble_manifest(self, cleaner, plan, writer, eval_index, time.time() - started)

    def require_records(self, kept: int, when: str) -> None:
        """Fewer than data.min_records: fail with where the records went (nothing is published)."""
        if kept >= self.data.min_records or (kept and self.data.accept.sufficiency == "warn"):
            return  # warn: the acceptance report carries the shortfall
        read = sum(c["records"] + c["issues"] for c in self.per_source.values())
        lost = Counter({k: v for k, v in self.counters.items()
                        if k.split(".")[0] in ("bad_input", "filter", "decontam", "dedup", "record", "error")
                        and k != "dedup.near_candidates" and not k.startswith("dedup.prior_records")})
        reasons = ", ".join(f"{k} {v}" for k, v in lost.most_common(5)) or "no rejections"
        raise EmptySnapshotError(
            f"the build kept {kept} record(s) {when}, fewer than data.min_records={self.data.min_records} "
            f"({self.data.min_records - kept} short), from {read} row(s) read in {len(self.per_source)} source(s) "
            f"(top reasons: {reasons}); nothing was published. Fix: check data.sources and the reasons above; relax "
            "the step that rejects most, or lower data.min_records (data.accept.sufficiency=warn publishes with a "
            "warning)."
        )

    @property
    def suite(self) -> str:
        """Pair batches have their own suite (data.pairs.suite): their frame has the pair columns."""
        return self.data.pairs.suite if self.data.record_type == "preference" else self.data.gate.suite

    def gate_params(self, targets: dict[str, float]) -> GateParams:
        data = self.data
        pairs = {}
        if data.record_type == "preference":
            pairs = {"max_identical_share": data.pairs.max_identical_share,
                     "min_length_ratio": data.pairs.min_length_ratio, "max_length_ratio": data.pairs.max_length_ratio}
        return GateParams(
            max_dup_ratio=data.gate.max_dup_ratio, min_loss_share=data.gate.min_loss_share,
            tolerance=data.mix.tolerance, max_truncated_share=data.gate.max_truncated_share,
            domains=sorted(targets) if data.mix.ratios else [], **pairs,
        )

    def eval_index(self):
        from mlops.data.decontam import EvalIndex

        index = EvalIndex(self.data.decontam)
        for entry in self.inputs.eval_files:
            entry["items"] = index.add_file(entry["path"], entry["name"])
        return index


def build_snapshot(cfg: Any, tracker: Any = None, *, force: bool = False) -> BuildResult:
    """Build (or find) the snapshot for `cfg`; logs to `tracker` when given (MemoryTracker in tests).

    `force` rebuilds even when these inputs were built before, and replaces a published snapshot of the same
    id whose files no longer verify."""
    with sigterm_raises():
        inputs = prepare(cfg)
        cached = None if force else cached_snapshot(inputs)
        if cached is not None:
            manifest = read_manifest(cached)
            acceptance.recheck(manifest, inputs.data.accept, inputs.data.min_records)
            result = BuildResult(cached.name, cached, manifest, noop=True)
        else:
            inputs.root.mkdir(parents=True, exist_ok=True)
            sweep_stale_staging(inputs.root)
            staging = staging_dir(inputs.root)
            try:
                build = Build(inputs, staging)
                manifest = build.run()
                manifest["base_model_ref"] = str(cfg.base_model)
                files = hash_files(staging, known=build.shard_hashes)
                manifest["files"] = files
                manifest["snapshot_id"] = snapshot_id_for(files, inputs.tokenizer["hash"], inputs.pipeline_hash)
                acceptance.enforce(manifest, inputs.root / ".failed")  # a failing report publishes nothing
                path = publish(staging, inputs.root, manifest, replace_invalid=force)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            remember_build(inputs, path.name)
            result = BuildResult(path.name, path, read_manifest(path), noop=False)
        if inputs.data.accept.require_review:
            from mlops.data.review import mark_required

            mark_required(result.path)
        if tracker is not None:
            log_build(tracker, result)
        return result
