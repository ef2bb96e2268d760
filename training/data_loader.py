"""Snapshot -> deterministic per-rank micro batches, resumable from a global sample index.

The snapshot reader defines one global order of samples (epoch-aware, seeded). Optimizer step `s` consumes
global indices `[s*G, (s+1)*G)` where G is the global batch; inside a step, micro step `j` of rank `r` takes
the slice starting at `s*G + (j*W + r)*m`. The data position is therefore a single integer, and the same
integer resumes at any world size (the global batch, not the per-rank split, decides what a step sees).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlops.errors import ConfigError, MLOpsError

IGNORE_INDEX = -100


@dataclass
class MicroBatch:
    input_ids: object  # torch.LongTensor [m, seq]
    attention_mask: object
    labels: object
    tokens: int  # real tokens (attention mask) in this micro batch
    sample_ids: list[str]
    loss_tokens: int = 0  # predicted positions with a label (after the causal shift)
    pair_indices: list[int] | None = None  # DPO: the pairs' positions in their split (rows: chosen..., rejected...)


@dataclass
class StepBatch:
    step: int  # the optimizer step these batches feed (1-based)
    start: int  # first global sample index of the step
    micro: list[MicroBatch]
    step_sample_ids: list[str] = field(default_factory=list)  # every rank's samples, in global order
    wait_s: float = 0.0


def resolve_snapshot_id(name: str | None) -> str:
    """A concrete snapshot id; `latest` is the newest complete snapshot. Raises before any compute."""
    from mlops.data.snapshot import list_snapshots, resolve_snapshot

    if not name:
        raise ConfigError(
            "train.snapshot is not set. Fix: pass a snapshot id with `train.snapshot=<id>` "
            "(see `mlops data list`) or `train.snapshot=latest`."
        )
    if name == "latest":
        found = list_snapshots()
        if not found:
            raise ConfigError(
                "train.snapshot=latest but there is no complete data snapshot yet. "
                "Fix: build one with `mlops data build --config configs/data/sample.yaml`."
            )
        return found[0]["snapshot_id"]
    return resolve_snapshot(name).name


def open_snapshot(snapshot_id: str, *, verify: bool = True) -> tuple[Path, dict]:
    """(folder, manifest) of a snapshot, its hashes verified; MLOpsError otherwise."""
    from mlops.data.format import read_manifest
    from mlops.data.review import require_review
    from mlops.data.snapshot import resolve_snapshot, verify_snapshot

    folder = resolve_snapshot(snapshot_id)
    if verify:
        verify_snapshot(folder)
    manifest = read_manifest(folder) or {}
    require_review(folder, manifest)  # data.accept.require_review: a completed human review first
    return folder, manifest


def to_tensors(samples: list, max_len: int | None = None) -> MicroBatch:
    """Stack samples, cut to the last real token of the batch (or `max_len`), labels -100 off the loss mask.

    Snapshot rows are padded to the snapshot's seq_len; trailing padding changes nothing for a causal model
    (no real token attends to it, no label lies on it), so it is dropped instead of computed.
    """
    import torch

    attn_np = np.stack([s.attention_mask for s in samples])
    real = np.flatnonzero(attn_np.any(axis=0))
    length = int(real[-1]) + 1 if real.size else 1
    if max_len:
        length = min(length, max_len)
    ids = torch.from_numpy(np.stack([s.input_ids[:length] for s in samples]).astype(np.int64))
    attn = torch.from_numpy(attn_np[:, :length].astype(np.int64))
    loss = np.stack([s.loss_mask[:length] for s in samples]).astype(bool) & attn_np[:, :length].astype(bool)
    labels = ids.clone()
    labels[~torch.from_numpy(loss)] = IGNORE_INDEX
    return MicroBatch(ids, attn, labels, int(attn.sum()), [s.sample_id for s in samples],
                      int((labels[:, 1:] != IGNORE_INDEX).sum()))


class RankBatches:
    """Yields the micro batches of each optimizer step for one rank, from any global position."""

    def __init__(self, reader, *, seed: int, micro: int, accum: int, world: int, rank: int, start: int = 0,
                 max_len: int | None = None, collate=to_tensors):
        if len(reader) < micro * world:
            raise MLOpsError(
                f"the training split has {len(reader)} samples, fewer than one micro step across all ranks "
                f"({micro} x {world}). Fix: use a larger snapshot or a smaller train.micro_batch_size."
            )
        self.reader = reader
        self.seed, self.micro, self.accum, self.world, self.rank = seed, micro, accum, world, rank
        self.global_batch = micro * accum * world
        if start % self.global_batch:
            raise MLOpsError(
                f"data position {start} is not at an optimizer-step boundary of global batch {self.global_batch}. "
                "Fix: resume with the global batch the checkpoint was written with (train.global_batch_size)."
            )
        self.position = start
        self.max_len = max_len
        self.collate = collate  # to_tensors, or training.pairs.to_pair_tensors for a preference snapshot

    @property
    def epoch(self) -> int:
        return self.position // len(self.reader)

    def next_step(self, *, all_ids: bool = False) -> StepBatch:
        started = time.perf_counter()
        order = self.reader.global_order(self.seed, self.position)
        indices = [next(order)[1] for _ in range(self.global_batch)]
        micro = []
        for j in range(self.accum):
            offset = (j * self.world + self.rank) * self.micro
            micro.append(self.collate([self.reader.get(i) for i in indices[offset : offset + self.micro]], self.max_len))
        step_ids: list[str] = []
        if all_ids:
            mine = {(j * self.world + self.rank) * self.micro: mb.sample_ids for j, mb in enumerate(micro)}
            for offset in range(0, self.global_batch, self.micro):
                step_ids += mine.get(offset) or [self.reader.get(i).sample_id for i in indices[offset : offset + self.micro]]
        batch = StepBatch(self.position // self.global_batch + 1, self.position, micro, step_ids)
        self.position += self.global_batch
        batch.wait_s = time.perf_counter() - started
        return batch


def validation_batches(reader, *, micro: int, world: int, rank: int, limit: int | None,
                       max_len: int | None = None, collate=to_tensors) -> Iterator[MicroBatch]:
    """This rank's share of the validation split, in file order (no shuffling: every eval sees the same)."""
    count = len(reader) if limit is None else min(limit, len(reader))
    mine = list(range(rank, count, world))
    for i in range(0, len(mine), micro):
        yield collate([reader.get(k) for k in mine[i : i + micro]], max_len)
