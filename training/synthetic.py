"""Small, learnable snapshots for the kill drill, smoke checks of the stack itself, tests and benchmarks.

The sequences follow simple arithmetic rules, so a 2-layer model's loss falls within a few dozen steps;
they are written through the data stage's own `write_snapshot`, never a format of our own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def pattern_samples(count: int, seq_len: int, *, seed: int, vocab: int = 400, offset: int = 100) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        start, stride = int(rng.integers(0, vocab)), int(rng.integers(1, 4))
        length = int(rng.integers(seq_len // 2, seq_len + 1))
        ids = [offset + (start + k * stride) % vocab for k in range(length)]
        out.append({"input_ids": ids, "id": f"s{seed}-{i:05d}"})
    return out


def make_snapshot(root: Path | None = None, *, train: int = 64, validation: int = 16, seq_len: int = 32) -> str:
    """Write a complete snapshot (under `root` or the project's snapshots folder); returns its id."""
    from mlops.data.format import write_snapshot

    folder = write_snapshot(
        {"train": pattern_samples(train, seq_len, seed=1), "validation": pattern_samples(validation, seq_len, seed=2)},
        seq_len=seq_len, root=root, pad_id=0, config_hash=f"pattern-{train}-{validation}-{seq_len}",
    )
    return folder.name


def pair_samples(count: int, seq_len: int, *, seed: int, vocab: int = 400, offset: int = 100) -> list[dict]:
    """Rows of `count` preference pairs (chosen, then rejected): a prompt that starts an arithmetic run, a chosen
    answer that continues it and a rejected one that breaks it. Only the answers carry the loss mask."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        start, stride = int(rng.integers(0, vocab)), int(rng.integers(1, 4))
        prompt_len = int(rng.integers(seq_len // 4, seq_len // 2))
        answer_len = int(rng.integers(2, seq_len - prompt_len + 1))
        run = [offset + (start + k * stride) % vocab for k in range(prompt_len + answer_len)]
        noise = [offset + int(x) for x in rng.integers(0, vocab, size=answer_len)]
        for role, answer in (("chosen", run[prompt_len:]), ("rejected", noise)):
            ids = run[:prompt_len] + answer
            rows.append({"input_ids": ids, "loss_mask": [0] * prompt_len + [1] * answer_len,
                         "id": f"p{seed}-{i:05d}/{role}"})
    return rows


def make_pair_snapshot(root: Path | None = None, *, train: int = 32, validation: int = 8, seq_len: int = 32) -> str:
    """Write a complete preference snapshot (mlops.data.format's pair layout); returns its id."""
    from mlops.data.format import RECORD_TYPE_PREFERENCE, write_snapshot

    folder = write_snapshot(
        {"train": pair_samples(train, seq_len, seed=3), "validation": pair_samples(validation, seq_len, seed=4)},
        seq_len=seq_len, root=root, pad_id=0, config_hash=f"pairs-{train}-{validation}-{seq_len}",
        extra={"record_type": RECORD_TYPE_PREFERENCE},
    )
    return folder.name
