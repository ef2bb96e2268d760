"""One gated batch at a time: set aside the records that failed their own checks (mlops.data.checks), then
write the rest to the split shards, or quarantine them as a batch with its GE report when the suite fails.
Also copies history samples (incremental mode)."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mlops.data.checks import Checked, batch_frame
from mlops.data.dedup import IndexWriter
from mlops.data.format import SPLITS, ShardWriter, SnapshotReader, atomic_write_json
from mlops.data.gate import GateResult, SuiteSpec
from mlops.data.inputs import Inputs
from mlops.data.mixing import history_take
from mlops.data.quarantine import Quarantine, entry
from mlops.errors import ConfigError, MLOpsError


class GateError(MLOpsError):
    """A batch failed its expectation suite and the policy is to fail."""


def split_of(record_id: str, seed: int, fraction: float) -> str:
    """Held out by record id: the same record lands in the same split in every build with this seed."""
    digest = hashlib.sha256(f"{seed}:{record_id}".encode()).digest()
    return "validation" if int.from_bytes(digest[:8], "little") / 2**64 < fraction else "train"


def _stats() -> Counter:
    return Counter()


class Packer:
    """Greedy packing: consecutive samples share a sequence while they fit; none is split."""

    def __init__(self, writer: ShardWriter) -> None:
        self.writer = writer
        self._ids: list[np.ndarray] = []
        self._masks: list[np.ndarray] = []
        self._metas: list[Mapping[str, Any]] = []
        self._len = 0

    def add(self, input_ids: np.ndarray, loss_mask: np.ndarray, meta: Mapping[str, Any]) -> None:
        if self._len + len(input_ids) > self.writer.seq_len:
            self.flush()
        self._ids.append(np.asarray(input_ids))
        self._masks.append(np.asarray(loss_mask))
        self._metas.append(meta)
        self._len += len(input_ids)

    def flush(self) -> None:
        if not self._ids:
            return
        records = [r for m in self._metas for r in m.get("records", [m.get("id")])]
        weights: dict[str, int] = {}
        for m, ids in zip(self._metas, self._ids, strict=True):
            weights[m.get("domain", "")] = weights.get(m.get("domain", ""), 0) + len(ids)
        meta = {
            "id": "p-" + hashlib.sha256("|".join(records).encode()).hexdigest()[:16],
            "domain": max(sorted(weights), key=lambda d: weights[d]),
            "source": self._metas[0].get("source", ""),
            "records": records,
        }
        self.writer.add(np.concatenate(self._ids), np.concatenate(self._masks), meta)
        self._ids, self._masks, self._metas, self._len = [], [], [], 0


class BatchWriter:
    def __init__(self, inputs: Inputs, staging: Path, suite: SuiteSpec, targets: dict[str, float],
                 quarantine: Quarantine) -> None:
        data = inputs.data
        self.inputs = inputs
        self.data = data
        self.staging = staging
        self.suite = suite
        self.targets = targets
        self.rejects = quarantine
        self.counters: Counter[str] = Counter()
        pad_id = inputs.tokenizer["pad_id"]
        self.writers = {s: ShardWriter(staging / s, data.seq_len, pad_id, data.shard_size) for s in SPLITS}
        self.packers = {s: Packer(w) for s, w in self.writers.items()} if data.pack else {}
        self.batches: list[dict] = []
        self.index = IndexWriter(staging / ".work", data.dedup.num_perm)
        # split -> domain|source -> Counter(records, tokens, loss_tokens)
        self.by_domain: dict[str, dict[str, Counter]] = {s: defaultdict(_stats) for s in SPLITS}
        self.by_source: dict[str, dict[str, Counter]] = {s: defaultdict(_stats) for s in SPLITS}
        self.history: dict[str, Any] | None = None
        self.indexes: dict[str, dict] = {}
        # whole sequence length (chat template included, before truncation) -> records, for the acceptance report
        self.seq_tokens: Counter[int] = Counter()

    def gate_and_write(self, number: int, rows: list[dict], passed: list[Checked], rejected: list[Checked],
                       result: GateResult | None) -> None:
        self.seq_tokens.update(c.n_tokens for c in (*passed, *rejected) if c.n_tokens >= 0)
        for c in rejected:
            self.counters[f"record.{c.reason}"] += 1
            self.rejects.record(rows[c.position]["record"], "record", c.reason, c.detail, c.excerpt)
        self.counters["record.truncated"] += sum(c.truncated for c in passed)
        kept = [rows[c.position] for c in passed]
        info = {"batch": number, "records": len(kept), "rejected_records": len(rejected), "suite": self.suite.key,
                "domains": dict(sorted(Counter(row["record"].domain for row in kept).items())),
                "status": "passed" if result is None or result.success else "quarantined"}
        if result is None or result.success:
            self.write(kept, passed)
            self.batches.append(info)
            return
        info["failed"] = result.failed
        folder = self.quarantine(number, kept, batch_frame(rows, passed, self.targets), result.report)
        info["report"] = folder.relative_to(self.staging).as_posix() + "/validation.json"
        self.batches.append(info)
        if self.data.gate.on_batch_failure == "fail":
            keep = self.inputs.root / ".failed" / f"{self.inputs.key}-batch-{number:05d}"
            keep.parent.mkdir(parents=True, exist_ok=True)
            if keep.exists():
                import shutil

                shutil.rmtree(keep)
            os.replace(folder, keep)
            reasons = "; ".join(
                f"{f['expectation']}" + (f" on '{f['column']}'" if f.get("column") else "")
                + (f" ({f['unexpected_count']} unexpected, e.g. {f['examples'][:1]})" if f.get("unexpected_count")
                   else f" (observed {f.get('observed_value')})")
                for f in result.failed
            )
            raise GateError(
                f"batch {number} ({len(kept)} records, first {kept[0]['record'].source} line "
                f"{kept[0]['record'].line}) failed expectation suite {self.suite.key}: {reasons}. "
                f"The GE report and the batch are in {keep}. Fix: correct those records at their source, or set "
                "data.gate.on_batch_failure=quarantine to build without this batch."
            )

    def quarantine(self, number: int, rows: list[dict], frame, report: dict) -> Path:
        folder = self.staging / "quarantine" / "batches" / f"batch-{number:05d}"
        folder.mkdir(parents=True)
        limit = self.data.excerpt_chars
        with (folder / "records.jsonl").open("w", encoding="utf-8") as fh:
            for row, values in zip(rows, frame.to_dict("records"), strict=True):
                line = {**entry(row["record"], "gate", "batch_failed", limit=limit), **values}
                fh.write(json.dumps(line, ensure_ascii=False, sort_keys=True, default=str) + "\n")
        atomic_write_json(folder / "validation.json", report)
        return folder

    def write(self, rows: list[dict], checked: list[Checked]) -> None:
        for row, c in zip(rows, checked, strict=True):
            ids, mask = c.ids, c.mask
            record = row["record"]
            split = split_of(record.record_id, self.inputs.seed, self.data.validation_fraction)
            meta = {"id": record.record_id, "domain": record.domain, "source": record.source,
                    "records": [record.record_id]}
            if self.packers:
                self.packers[split].add(ids, mask, meta)
            else:
                self.writers[split].add(ids, mask, meta)
            for table, key in ((self.by_domain, record.domain), (self.by_source, record.source)):
                table[split][key].update(records=1, tokens=len(ids), loss_tokens=int(mask.sum()))
            self.index.add(row["exact"], row["sig"])

    def add_history(self) -> None:
        """Incremental mode: mix in train samples of the named snapshot at the configured ratio."""
        if self.inputs.history is None:
            return
        for packer in self.packers.values():
            packer.flush()
        sid, path = self.inputs.history
        self.index.add_prior(path)
        reader = SnapshotReader(path, "train")
        theirs = reader.manifest.get("tokenizer", {}).get("hash")
        if reader.seq_len != self.data.seq_len or theirs != self.inputs.tokenizer["hash"]:
            raise ConfigError(
                f"history snapshot {sid} has seq_len={reader.seq_len} and tokenizer {str(theirs)[:12]}; this "
                f"build uses seq_len={self.data.seq_len} and tokenizer {self.inputs.tokenizer['hash'][:12]}. "
                "Fix: mix only snapshots built with the same base model tokenizer and data.seq_len."
            )
        new_train = self.writers["train"].total
        ratio = self.data.mix.history.ratio
        take = history_take(new_train, ratio, len(reader))
        rng = np.random.default_rng([self.inputs.seed, 7])
        chosen = set(rng.choice(len(reader), size=take, replace=False).tolist()) if take else set()
        domains: Counter[str] = Counter()
        for index, meta in enumerate(reader.iter_meta()):
            if index not in chosen:
                continue
            sample = reader.get(index)
            n = int(sample.attention_mask.sum())
            self.writers["train"].add(sample.input_ids[:n], sample.loss_mask[:n],
                                      {**meta, "source": f"snapshot:{sid}", "history": True})
            domains[meta.get("domain", "")] += 1
            self.by_source["train"][f"snapshot:{sid}"].update(
                records=len(meta.get("records", [1])), tokens=n, loss_tokens=int(sample.loss_mask.sum()))
        total = new_train + take
        self.history = {"snapshot": sid, "target_ratio": ratio, "available": len(reader), "samples": take,
                        "new_samples": new_train, "achieved_ratio": take / total if total else 0.0,
                        "domains": dict(sorted(domains.items()))}

    def close(self) -> None:
        for packer in self.packers.values():
            packer.flush()
        self.indexes = {s: w.close() for s, w in self.writers.items()}
