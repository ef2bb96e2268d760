"""Stage D of a build, on the workers: each task mixes, checks, gates and writes a group of consecutive batches.

The mixed stream follows from counts alone (mlops.data.mixing), so a task finds its own records. The driver
writes `mix.json` once: per domain, the partitions' kept files in order, how many records each kept and how many
of them the mix takes (a seeded hypergeometric split of the domain's take). Task t handles batches
[first, last): for each it computes which of every domain's chosen records fall in it, reads just those lines
from the kept files (seeking by the offsets stage C wrote), tokenizes and checks each record, validates the
batch with its expectation suite and writes what passed:

    <split>/shard-<t>-<k>.*                   the group's samples of that split (packed within the group)
    .work/groups/<t>/exact.raw, sigs.raw      the kept records' dedup hashes and MinHash rows, in order
    .work/groups/<t>/records.jsonl            records set aside by their own checks (quarantine lines)
    quarantine/batches/batch-<n>/             a batch the suite failed (its records and GE report)

It returns sums only (counters, per-domain and per-source tables, sequence lengths, the batches' infos), so the
driver never reads a record: it concatenates the groups' index pieces and quarantine lines and writes each
split's index. Every output depends on the task alone, so a retried task (Ray) rewrites the same bytes.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import shutil
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mlops.data import clean
from mlops.data.checks import batch_frame, check_batch
from mlops.data.format import (
    PAIR_ROLES,
    SPLITS,
    ShardWriter,
    SnapshotReader,
    atomic_write_json,
    shard_files,
)
from mlops.data.mixing import chosen_positions, domain_rng, mixed_order
from mlops.data.partclean import offsets_file
from mlops.data.quarantine import entry

MIX_FILE = "mix.json"
_TABLES: dict[str, dict] = {}  # mix.json per path: a worker reads it once for all its tasks


def split_of(record_id: str, seed: int, fraction: float) -> str:
    """Held out by record id: the same record lands in the same split in every build with this seed."""
    digest = hashlib.sha256(f"{seed}:{record_id}".encode()).digest()
    return "validation" if int.from_bytes(digest[:8], "little") / 2**64 < fraction else "train"


def group_dir(work: Path, group: int) -> Path:
    return work / "groups" / f"{group:05d}"


class ChosenRecords:
    """Domain d's k-th chosen record, read from the partition files by offset."""

    def __init__(self, table: dict, seed: int) -> None:
        self.table, self.seed = table, seed
        self._starts = {d: np.cumsum([0, *t["take"]]).tolist() for d, t in table["domains"].items()}
        self._chosen: dict[tuple[str, int], np.ndarray] = {}
        self._files: dict[tuple[str, int], tuple[Any, np.ndarray]] = {}

    def get(self, domain: str, k: int) -> dict:
        starts = self._starts[domain]
        part = bisect.bisect_right(starts, k) - 1
        position = int(self._positions(domain, part)[k - starts[part]])
        fh, offsets = self._file(domain, part)
        fh.seek(int(offsets[position]))
        return clean.parse_spill(fh.read(int(offsets[position + 1] - offsets[position])))

    def _positions(self, domain: str, part: int) -> np.ndarray:
        key = (domain, part)
        if key not in self._chosen:
            t = self.table["domains"][domain]
            rng = domain_rng(self.seed, domain, part)
            self._chosen[key] = chosen_positions(t["kept"][part], t["take"][part], rng)
        return self._chosen[key]

    def _file(self, domain: str, part: int) -> tuple[Any, np.ndarray]:
        key = (domain, part)
        if key not in self._files:
            path = Path(self.table["domains"][domain]["files"][part])
            self._files[key] = (path.open("rb"), np.load(offsets_file(path), mmap_mode="r"))
        return self._files[key]

    def close(self) -> None:
        for fh, _ in self._files.values():
            fh.close()


class GroupOutput:
    """What one group writes: shards per split, dedup index pieces, quarantine lines, and the sums it returns."""

    def __init__(self, task: dict, cfg: Any) -> None:
        self.task, self.cfg = task, cfg
        self.staging, self.dir = Path(task["staging"]), group_dir(Path(task["work"]), task["group"])
        shutil.rmtree(self.dir, ignore_errors=True)  # a retried task starts clean
        self.dir.mkdir(parents=True)
        prefix = f"shard-{task['group']:05d}-"
        self.writers = {s: ShardWriter(self.staging / s, cfg.seq_len, task["pad_id"], cfg.shard_size, prefix=prefix)
                        for s in SPLITS}
        self.packers = {s: Packer(w) for s, w in self.writers.items()} if cfg.pack else {}
        self.exact, self.sigs = (self.dir / "exact.raw").open("wb"), (self.dir / "sigs.raw").open("wb")
        self.rejects = (self.dir / "records.jsonl").open("w", encoding="utf-8")
        self.sums: dict[str, Any] = {"counters": Counter(), "seq_tokens": Counter(), "batches": [], "index_rows": 0,
                                     "by_domain": {s: defaultdict(Counter) for s in SPLITS},
                                     "by_source": {s: defaultdict(Counter) for s in SPLITS}, "failure": None}

    def batch(self, number: int, rows: list[dict]) -> bool:
        """Check, gate and write one batch; False when the suite failed it and the policy is to fail."""
        suite, params, targets, policy = self.task["gate"]
        passed, rejected, result = check_batch((rows, self.task["gate"]))
        sums = self.sums
        sums["seq_tokens"].update(c.n_tokens for c in (*passed, *rejected) if c.n_tokens >= 0)
        for c in rejected:
            sums["counters"][f"record.{c.reason}"] += 1
            line = entry(rows[c.position]["record"], "record", c.reason, c.detail, c.excerpt, self.cfg.excerpt_chars)
            self.rejects.write(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n")
        sums["counters"]["record.truncated"] += sum(c.truncated for c in passed)
        kept = [rows[c.position] for c in passed]
        info = {"batch": number, "records": len(kept), "rejected_records": len(rejected), "suite": self.task["suite"],
                "domains": dict(sorted(Counter(row["record"].domain for row in kept).items())),
                "status": "passed" if result is None or result.success else "quarantined"}
        sums["batches"].append(info)
        if result is None or result.success:
            self.write(kept, passed)
            return True
        info["failed"] = result.failed
        folder = self.quarantine(number, kept, batch_frame(rows, passed, targets), result.report)
        info["report"] = folder.relative_to(self.staging).as_posix() + "/validation.json"
        if self.cfg.gate.on_batch_failure == "fail":
            first = kept[0]["record"] if kept else rows[0]["record"]
            sums["failure"] = {"batch": number, "records": len(kept), "folder": str(folder), "failed": result.failed,
                               "source": first.source, "line": first.line}
            return False
        return True

    def write(self, rows: list[dict], checked: list) -> None:
        for row, c in zip(rows, checked, strict=True):
            record = row["record"]
            split = split_of(record.record_id, self.task["seed"], self.cfg.validation_fraction)
            if c.rejected is not None:
                self.write_pair(record, split, c)
            else:
                meta = {"id": record.record_id, "domain": record.domain, "source": record.source,
                        "records": [record.record_id]}
                (self.packers[split] if self.packers else self.writers[split]).add(c.ids, c.mask, meta)
                for table, key in ((self.sums["by_domain"], record.domain), (self.sums["by_source"], record.source)):
                    table[split][key].update(records=1, tokens=len(c.ids), loss_tokens=int(c.mask.sum()))
            self.exact.write(np.uint64(row["exact"]).tobytes())
            sig = row["sig"] if row["sig"] is not None else np.zeros(self.cfg.dedup.num_perm, dtype=np.uint32)
            self.sigs.write(np.asarray(sig).astype("<u4").tobytes())
            self.sums["index_rows"] += 1

    def write_pair(self, record: Any, split: str, c: Any) -> None:
        """A pair as two consecutive rows of one split, chosen then rejected (the trainer reads rows 2i, 2i+1).
        Shard sizes are even (config), so a shard never ends between them; packing is off for pairs."""
        writer = self.writers[split]
        tokens = loss = 0
        for role, (ids, mask) in zip(PAIR_ROLES, ((c.ids, c.mask), c.rejected), strict=True):
            meta = {"id": f"{record.record_id}/{role}", "domain": record.domain, "source": record.source,
                    "records": [record.record_id], "pair": record.record_id, "role": role}
            if record.provenance:
                meta["provenance"] = record.provenance
            writer.add(ids, mask, meta)
            tokens, loss = tokens + len(ids), loss + int(mask.sum())
        for table, key in ((self.sums["by_domain"], record.domain), (self.sums["by_source"], record.source)):
            table[split][key].update(records=1, pairs=1, rows=2, tokens=tokens, loss_tokens=loss)

    def quarantine(self, number: int, rows: list[dict], frame, report: dict) -> Path:
        folder = self.staging / "quarantine" / "batches" / f"batch-{number:05d}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        with (folder / "records.jsonl").open("w", encoding="utf-8") as fh:
            for row, values in zip(rows, frame.to_dict("records"), strict=True):
                line = {**entry(row["record"], "gate", "batch_failed", limit=self.cfg.excerpt_chars), **values}
                fh.write(json.dumps(line, ensure_ascii=False, sort_keys=True, default=str) + "\n")
        atomic_write_json(folder / "validation.json", report)
        return folder

    def close(self) -> dict:
        for packer in self.packers.values():
            packer.flush()
        for fh in (self.exact, self.sigs, self.rejects):
            fh.close()
        sums = self.sums
        sums["shards"], sums["files"] = {}, {}
        for split, writer in self.writers.items():
            writer.flush()
            sums["shards"][split] = writer.shards
            sums["files"].update(shard_files(self.staging, split, writer.shards))
        sums["by_domain"] = {s: {k: dict(v) for k, v in t.items()} for s, t in sums["by_domain"].items()}
        sums["by_source"] = {s: {k: dict(v) for k, v in t.items()} for s, t in sums["by_source"].items()}
        return sums


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


def write_group(task: dict) -> dict:
    """Stage D for batches [first, last) (a worker task); see the module docstring."""
    cfg = clean._STATE["cfg"]
    path = task["mix"]
    if path not in _TABLES:
        _TABLES.clear()
        _TABLES[path] = json.loads(Path(path).read_text())
    table = _TABLES[path]
    take = {d: t["total"] for d, t in table["domains"].items()}
    records = ChosenRecords(table, task["seed"])
    out = GroupOutput(task, cfg)
    try:
        for number in range(task["first"], task["last"]):
            start, end = number * cfg.batch_size, min((number + 1) * cfg.batch_size, table["total"])
            rows = [records.get(domain, k) for domain, k in mixed_order(start, end, take)]
            if not out.batch(number, rows):
                break  # the policy is to fail: the driver raises on this group's failure
    finally:
        records.close()
    return out.close()


def write_history(task: dict) -> dict:
    """Incremental mode (a worker task): `take` train samples of the history snapshot, seeded, after the new ones,
    and that snapshot's dedup index as this build's prior piece."""
    from mlops.data.dedup import EXACT_FILE, MINHASH_FILE

    work = group_dir(Path(task["work"]), task["group"])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    reader = SnapshotReader(task["path"], "train")
    writer = ShardWriter(Path(task["staging"]) / "train", reader.seq_len, task["pad_id"], task["shard_size"],
                         prefix=f"shard-{task['group']:05d}-")
    take, sid = task["take"], task["snapshot"]
    rng = np.random.default_rng([task["seed"], 7])
    chosen = set(rng.choice(len(reader), size=take, replace=False).tolist()) if take else set()
    domains: Counter[str] = Counter()
    by_source: Counter[str] = Counter()
    for index, meta in enumerate(reader.iter_meta()):
        if index not in chosen:
            continue
        sample = reader.get(index)
        n = int(sample.attention_mask.sum())
        writer.add(sample.input_ids[:n], sample.loss_mask[:n], {**meta, "source": f"snapshot:{sid}", "history": True})
        domains[meta.get("domain", "")] += 1
        by_source.update(records=len(meta.get("records", [1])), tokens=n, loss_tokens=int(sample.loss_mask.sum()))
    writer.flush()
    folder = Path(task["path"])
    hashes, sigs = np.load(folder / EXACT_FILE, mmap_mode="r"), np.load(folder / MINHASH_FILE, mmap_mode="r")
    with (work / "exact.raw").open("wb") as exact, (work / "sigs.raw").open("wb") as rows:
        for start in range(0, len(hashes), 4096):
            exact.write(np.asarray(hashes[start:start + 4096], dtype="<u8").tobytes())
            block = np.asarray(sigs[start:start + 4096], dtype="<u4")
            if block.shape[1:] != (task["num_perm"],):
                block = np.zeros((len(block), task["num_perm"]), dtype="<u4")
            rows.write(block.tobytes())
    (work / "records.jsonl").touch()
    return {"shards": writer.shards, "files": shard_files(Path(task["staging"]), "train", writer.shards),
            "domains": dict(domains), "by_source": dict(by_source),
            "available": len(reader), "index_rows": len(hashes), "seq_len": reader.seq_len,
            "tokenizer": reader.manifest.get("tokenizer", {}).get("hash")}
