"""The reference of a full-fine-tune DPO run: every pair's log-probabilities under the starting weights, computed
once before the first step and stored beside the checkpoints (`reference_logps.npz`). A resumed run reads them
back (the weights it resumes with have moved, so they can never be recomputed then), which also keeps a resume
bitwise: the reference a step sees does not depend on when the process started."""

from __future__ import annotations

import json
import time

import numpy as np

from mlops.errors import MLOpsError
from training.dpo import sequence_logps

FILE = "reference_logps.npz"
SPLITS = ("train", "validation")


class Precomputed:
    """Reference log-probabilities looked up by pair index: arrays[split] is [pairs, 2] (chosen, rejected)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    def logps(self, model, mb, device: str, split: str):
        import torch

        rows = self.arrays[split][np.asarray(mb.pair_indices, dtype=np.int64)]
        return torch.from_numpy(np.concatenate([rows[:, 0], rows[:, 1]]))


def reference_key(prep) -> dict:
    """What the stored log-probabilities depend on: another value of any of these needs another reference."""
    return {"snapshot_id": prep.snapshot_id, "base_model_id": prep.base.get("id"), "precision": prep.precision,
            "max_seq_len": prep.train.max_seq_len, "mode": prep.train.mode}


def ensure_reference(run) -> Precomputed:
    """The stored reference when it matches this run, else computed now (all ranks), written by rank 0."""
    import torch.distributed as dist

    path = run.prep.ckpt_dir / FILE
    key = reference_key(run.prep)
    stored = _read(path)
    if stored is not None and stored[0] == key:
        return Precomputed(stored[1])
    if run.prep.resume_from is not None:
        found = "is missing" if stored is None else f"was computed for {stored[0]}, not {key}"
        raise MLOpsError(f"this DPO run resumes from {run.prep.resume_from.name}, and its reference log-probabilities "
                         f"({path}) {found}. They come from the starting weights, which the checkpoint no longer "
                         "holds. Fix: restore the file from the run's artifacts (reference/), or start over with "
                         "train.checkpoint.resume=never.")
    started = time.perf_counter()
    arrays = {split: compute(run, split) for split in SPLITS}
    if run.rank0:
        _write(path, key, arrays)
        run.tracker.log_metrics({"dpo_reference_s": time.perf_counter() - started}, 0)
    dist.barrier()
    return Precomputed(arrays)


def compute(run, split: str) -> np.ndarray:
    """[pairs, 2] log-probabilities of one split under the current weights; each rank scores a strided share."""
    import torch
    import torch.distributed as dist

    from training.data_loader import validation_batches
    from training.pairs import open_split, to_pair_tensors
    from training.steps import same_count

    reader = run.reader if split == "train" else run.val_reader
    if split == "validation" and reader is None:
        reader = open_split(run.prep.snapshot_dir, split, "dpo")
    out = torch.zeros((len(reader), 2), dtype=torch.float64)
    batches = list(validation_batches(reader, micro=run.prep.micro, world=run.world.size, rank=run.world.rank,
                                      limit=None, max_len=run.t.max_seq_len, collate=to_pair_tensors))
    if run.t.zero_stage == 3:
        batches = same_count(batches, run.world.device)  # every forward gathers the shards: all ranks in step
    module, dev = run.engine.module, run.world.device
    module.eval()
    with torch.no_grad():
        for mb in batches:
            if mb is None:
                module(input_ids=torch.zeros((1, 2), dtype=torch.long, device=dev))
                continue
            logits = module(input_ids=mb.input_ids.to(dev), attention_mask=mb.attention_mask.to(dev)).logits
            logps = sequence_logps(logits, mb.labels.to(dev))[0].double().cpu()
            m = len(mb.pair_indices)
            out[mb.pair_indices, 0], out[mb.pair_indices, 1] = logps[:m], logps[m:]
    module.train()
    out = out.to(dev)
    dist.all_reduce(out)  # each pair was scored by exactly one rank; the others hold zeros there
    return out.cpu().numpy()


def _read(path) -> tuple[dict, dict[str, np.ndarray]] | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            return json.loads(str(data["key"])), {s: np.array(data[s]) for s in SPLITS}
    except (OSError, KeyError, ValueError):
        return None


def _write(path, key: dict, arrays: dict[str, np.ndarray]) -> None:
    import os

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, key=np.array(json.dumps(key, sort_keys=True)), **arrays)
    os.replace(tmp, path)
