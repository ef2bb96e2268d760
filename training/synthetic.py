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
