"""Tiny-model configs for tests and benchmarks (the snapshots themselves come from `training.synthetic`)."""

from __future__ import annotations

from training.synthetic import make_pair_snapshot, make_snapshot, pattern_samples  # noqa: F401 - the tests' entry point


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


def run_tiny(cfg, **kwargs):
    """`training.trainer.train` with an in-memory tracker: (result, tracker)."""
    from mlops.tracking import MemoryTracker
    from training.trainer import train

    tracker = MemoryTracker()
    return train(cfg, tracker, **kwargs), tracker


def check_bitwise_resume(make_cfg, folder, **common) -> None:
    """A run killed after step 5 and resumed matches an uninterrupted one bitwise, step by step (8 steps)."""
    from mlops.lineage import Tag
    from training.drill import compare, read_trace
    from training.trainer import SimulatedCrash

    reference, _ = run_tiny(make_cfg("ref", **common))
    try:
        run_tiny(make_cfg("cut", **common, **{"train.debug.crash_after_step": 5}))
    except SimulatedCrash:
        pass
    else:
        raise AssertionError("the run meant to crash after step 5 finished")
    resumed, tracker = run_tiny(make_cfg("cut", **common))
    assert tracker.tags[Tag.RESUMED_FROM].endswith("step-00000004")
    step, detail = compare(read_trace(folder / "ref" / "trace.jsonl"), read_trace(folder / "cut" / "trace.jsonl"), 8)
    assert step is None, detail
    assert resumed.metrics["val_loss"] == reference.metrics["val_loss"]
