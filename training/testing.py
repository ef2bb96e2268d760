"""Tiny-model configs for tests and benchmarks (the snapshots themselves come from `training.synthetic`)."""

from __future__ import annotations

from training.synthetic import make_snapshot, pattern_samples  # noqa: F401 - the tests' entry point


def tiny_overrides(snapshot_id: str, **extra) -> list[str]:
    """Overrides for a fast tiny-model run: a few steps, every 2 steps a checkpoint, no progress bar."""
    base = {
        "base_model": "tiny",
        "run.log_every": 2,
        "train.snapshot": snapshot_id,
        "train.mode": "full",
        "train.max_steps": 8,
        "train.micro_batch_size": 2,
        "train.grad_accum": 2,
        "train.warmup_steps": 2,
        "train.lr": 1e-3,
        "train.checkpoint_every": 2,
        "train.eval_every": 4,
        "train.progress": False,
        "train.peak_flops": 1e11,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]
