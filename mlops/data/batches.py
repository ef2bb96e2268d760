"""Stage D's driver side: plan the groups of batches, sum what their tasks return (mlops.data.batchtasks), then
assemble the splits' indexes, the dedup index and the quarantine from the groups' pieces, by file copies and
without reading a record. Also mixes in history samples (incremental mode) through one more task."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mlops.data.batchtasks import MIX_FILE, group_dir, write_history
from mlops.data.dedup import EXACT_FILE, MINHASH_FILE, PARAMS_FILE
from mlops.data.format import (
    SPLITS,
    SnapshotReader,
    atomic_write_json,
    npy_from_raw,
    write_index,
)
from mlops.data.gate import SuiteSpec
from mlops.data.inputs import Inputs
from mlops.data.mixing import domain_rng, history_take, split_take
from mlops.data.quarantine import Quarantine
from mlops.errors import ConfigError, MLOpsError


class GateError(MLOpsError):
    """A batch failed its expectation suite and the policy is to fail."""


def _stats() -> Counter:
    return Counter()


class BatchWriter:
    def __init__(self, inputs: Inputs, staging: Path, suite: SuiteSpec, targets: dict[str, float],
                 quarantine: Quarantine) -> None:
        data = inputs.data
        self.inputs = inputs
        self.data = data
        self.staging = staging
        self.work = staging / ".work"
        self.suite = suite
        self.targets = targets
        self.rejects = quarantine
        self.counters: Counter[str] = Counter()
        self.pad_id = inputs.tokenizer["pad_id"]
        self.batches: list[dict] = []
        self.groups: list[int] = []  # every group that wrote pieces, in order (the history's last)
        self.shards: dict[str, list[dict]] = {s: [] for s in SPLITS}
        self.files: dict[str, str] = {}  # sha256 of the shard files, as the tasks that wrote them hashed them
        self.index_rows = 0
        # split -> domain|source -> Counter(records, tokens, loss_tokens)
        self.by_domain: dict[str, dict[str, Counter]] = {s: defaultdict(_stats) for s in SPLITS}
        self.by_source: dict[str, dict[str, Counter]] = {s: defaultdict(_stats) for s in SPLITS}
        self.history: dict[str, Any] | None = None
        self.indexes: dict[str, dict] = {}
        # whole sequence length (chat template included, before truncation) -> records, for the acceptance report
        self.seq_tokens: Counter[int] = Counter()

    def plan(self, paths: Mapping[str, list[tuple[Path, int]]], take: Mapping[str, int], gate: tuple) -> list[dict]:
        """Write mix.json (per domain: kept files, their counts and how many each gives the mix) and return the
        group tasks: ceil(shard_size / batch_size) batches each, so a group writes about one shard per split."""
        domains = {}
        for domain, n in sorted(take.items()):
            if n <= 0:
                continue
            files = paths[domain]
            kept = [count for _, count in files]
            chosen = split_take(kept, n, domain_rng(self.inputs.seed, domain))
            domains[domain] = {"files": [str(f) for f, _ in files], "kept": kept, "take": chosen, "total": n}
        total = sum(take.values())
        atomic_write_json(self.work / MIX_FILE, {"domains": domains, "total": total})
        size = self.data.batch_size
        batches = -(-total // size)
        per_group = max(1, self.data.shard_size // size)
        return [{"group": g, "first": first, "last": min(first + per_group, batches), "mix": str(self.work / MIX_FILE),
                 "staging": str(self.staging), "work": str(self.work), "seed": self.inputs.seed,
                 "pad_id": self.pad_id, "gate": gate, "suite": self.suite.key}
                for g, first in enumerate(range(0, batches, per_group))]

    def add_group(self, task: dict, sums: dict) -> None:
        """One group's sums, in group order; its failed batch raises when the policy is to fail."""
        self.groups.append(task["group"])
        self.batches += sums["batches"]
        self.counters.update(sums["counters"])
        self.seq_tokens.update({int(k): v for k, v in sums["seq_tokens"].items()})
        for split in SPLITS:
            self.shards[split] += sums["shards"][split]
            for table, theirs in ((self.by_domain, sums["by_domain"]), (self.by_source, sums["by_source"])):
                for key, values in theirs[split].items():
                    table[split][key].update(values)
        self.index_rows += sums["index_rows"]
        self.files.update(sums["files"])
        if sums["failure"] is not None:
            self._fail(sums["failure"])

    def _fail(self, failure: dict) -> None:
        number = failure["batch"]
        keep = self.inputs.root / ".failed" / f"{self.inputs.key}-batch-{number:05d}"
        keep.parent.mkdir(parents=True, exist_ok=True)
        if keep.exists():
            shutil.rmtree(keep)
        os.replace(failure["folder"], keep)
        reasons = "; ".join(
            f"{f['expectation']}" + (f" on '{f['column']}'" if f.get("column") else "")
            + (f" ({f['unexpected_count']} unexpected, e.g. {f['examples'][:1]})" if f.get("unexpected_count")
               else f" (observed {f.get('observed_value')})")
            for f in failure["failed"]
        )
        raise GateError(
            f"batch {number} ({failure['records']} records, first {failure['source']} line {failure['line']}) "
            f"failed expectation suite {self.suite.key}: {reasons}. The GE report and the batch are in {keep}. "
            "Fix: correct those records at their source, or set data.gate.on_batch_failure=quarantine to build "
            "without this batch."
        )

    def add_history(self, pool: Any) -> None:
        """Incremental mode: mix in train samples of the named snapshot at the configured ratio (one task)."""
        if self.inputs.history is None:
            return
        sid, path = self.inputs.history
        reader = SnapshotReader(path, "train")
        theirs = reader.manifest.get("tokenizer", {}).get("hash")
        if reader.seq_len != self.data.seq_len or theirs != self.inputs.tokenizer["hash"]:
            raise ConfigError(
                f"history snapshot {sid} has seq_len={reader.seq_len} and tokenizer {str(theirs)[:12]}; this "
                f"build uses seq_len={self.data.seq_len} and tokenizer {self.inputs.tokenizer['hash'][:12]}. "
                "Fix: mix only snapshots built with the same base model tokenizer and data.seq_len."
            )
        new_train = sum(s["count"] for s in self.shards["train"])
        ratio = self.data.mix.history.ratio
        take = history_take(new_train, ratio, len(reader))
        group = (self.groups[-1] + 1) if self.groups else 0
        task = {"group": group, "path": str(path), "snapshot": sid, "take": take, "seed": self.inputs.seed,
                "staging": str(self.staging), "work": str(self.work), "pad_id": self.pad_id,
                "shard_size": self.data.shard_size, "num_perm": self.data.dedup.num_perm}
        done = next(iter(pool.map(write_history, [task])))
        self.groups.append(group)
        self.shards["train"] += done["shards"]
        self.files.update(done["files"])
        self.index_rows += done["index_rows"]
        self.by_source["train"][f"snapshot:{sid}"].update(done["by_source"])
        total = new_train + take
        self.history = {"snapshot": sid, "target_ratio": ratio, "available": done["available"], "samples": take,
                        "new_samples": new_train, "achieved_ratio": take / total if total else 0.0,
                        "domains": dict(sorted(done["domains"].items()))}

    def close(self) -> None:
        """Each split's index over the groups' shards, and the groups' rejected records into the quarantine."""
        self.indexes = {s: write_index(self.staging / s, self.data.seq_len, self.pad_id, self.shards[s])
                        for s in SPLITS}
        target = self.rejects._records
        target.flush()
        for group in self.groups:
            with (group_dir(self.work, group) / "records.jsonl").open(encoding="utf-8") as fh:
                shutil.copyfileobj(fh, target)

    def finish_index(self, params: dict) -> None:
        """The dedup index of everything this snapshot kept (and its history's), from the groups' pieces."""
        work = self.work / "index"
        work.mkdir(parents=True, exist_ok=True)
        for piece, final, dtype, shape in (
            ("exact.raw", EXACT_FILE, np.dtype("<u8"), (self.index_rows,)),
            ("sigs.raw", MINHASH_FILE, np.dtype("<u4"), (self.index_rows, self.data.dedup.num_perm)),
        ):
            raw = work / piece
            with raw.open("wb") as out:
                for group in self.groups:
                    with (group_dir(self.work, group) / piece).open("rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
            (self.staging / "dedup").mkdir(parents=True, exist_ok=True)
            npy_from_raw(raw, self.staging / final, dtype, shape)
        (self.staging / PARAMS_FILE).write_text(json.dumps(params, sort_keys=True) + "\n")
