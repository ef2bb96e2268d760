"""What a resume may change, applied for real and written down.

A checkpoint's manifest holds the resolved config it was written under. A resume compares it with the new one:
* settings that define the training job (model, mode, LoRA shape, ZeRO stage, data snapshot, seed, sequence
  cut, the global batch) cannot change: the resume is refused with a diff;
* every other setting may change (lr and its schedule, max_steps, optimizer settings, guards, eval and
  checkpoint cadence, logging). Optimizer and schedule changes are pushed into the loaded optimizer and
  scheduler, which DeepSpeed restores with the old values.
Each resume is appended to `resume.json` in the checkpoint folder (step, checkpoint, runs, old -> new values).
A resume whose hashed settings changed is a new MLflow run (new config hash) that names the run it continues.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from mlops.errors import ConfigError
from training.config import ADAPTER_MODES

LEDGER = "resume.json"
# Dotted prefixes of the settings that define a training job. LoRA settings only count in the adapter modes.
IMMUTABLE = ("base_model", "run.seed", "train.snapshot", "train.mode", "train.lora", "train.zero_stage",
             "train.max_seq_len", "train.deepspeed.extra", "train.precision")
# How a run is resumed, not what it is: never a change.
IGNORED = ("train.checkpoint.resume", "train.checkpoint.dir")
BATCH = "global batch (sequences per optimizer step)"
OPTIMIZER_FIELDS = ("train.lr", "train.lr_schedule", "train.min_lr_ratio", "train.warmup_steps", "train.max_steps",
                    "train.weight_decay", "train.adam_betas", "train.adam_eps")


def flatten(data, prefix: str = "") -> dict:
    if isinstance(data, dict):
        out: dict = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: list(data) if isinstance(data, tuple) else data}


def diff(old: dict, new: dict) -> dict[str, tuple]:
    """{dotted key: (old, new)} over two resolved configs (model_dump(mode="json") form)."""
    a, b = flatten(old), flatten(new)
    keys = sorted(set(a) | set(b))
    return {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k) and not k.startswith(IGNORED)}


def _immutable(key: str, old_cfg: dict, new_cfg: dict) -> bool:
    if key.startswith("train.lora"):
        modes = (old_cfg.get("train", {}).get("mode"), new_cfg.get("train", {}).get("mode"))
        return any(mode in ADAPTER_MODES for mode in modes)
    return any(key == p or key.startswith(p + ".") for p in IMMUTABLE)


def check(prep) -> dict[str, tuple]:
    """Refuse forbidden changes (ConfigError with the diff); return the allowed ones {key: (old, new)}."""
    m, t, where = prep.resume_manifest, prep.train, prep.resume_from
    if bool(m.get("smoke")) != bool(prep.smoke):
        kind = "smoke" if m.get("smoke") else "real"
        raise ConfigError(
            f"checkpoint {where} was written by a {kind} run; smoke runs and real runs never share checkpoints. "
            "Fix: point train.checkpoint.resume at a checkpoint of a run of the same kind, or use `auto`."
        )
    old_cfg = m.get("config")
    new_cfg = prep.cfg.model_dump(mode="json")
    changes = diff(old_cfg, new_cfg) if isinstance(old_cfg, dict) else _legacy_changes(m, prep)
    forbidden = {k: v for k, v in changes.items() if _immutable(k, old_cfg or {}, new_cfg)}
    old_batch, new_batch = m.get("global_batch"), prep.global_batch
    if old_batch is not None and int(old_batch) != new_batch:
        position = int(m.get("data", {}).get("position", 0))
        if not t.checkpoint.replan_batch or position % new_batch:
            forbidden[BATCH] = (int(old_batch), new_batch)
        else:
            changes[BATCH] = (int(old_batch), new_batch)
    if forbidden:
        raise ConfigError(_refusal(where, forbidden, m, prep))
    return {k: v for k, v in changes.items() if k not in forbidden}


def _legacy_changes(m: dict, prep) -> dict[str, tuple]:
    """Checkpoints written before manifests carried the config: compare what they did record."""
    t = prep.train
    recorded = {"train.zero_stage": (m.get("zero_stage"), t.zero_stage),
                "train.snapshot": (m.get("snapshot_id"), prep.snapshot_id),
                "train.mode": (m.get("mode", t.mode), t.mode)}
    return {k: v for k, v in recorded.items() if v[0] != v[1]}


def _refusal(where: Path, forbidden: dict[str, tuple], m: dict, prep) -> str:
    lines = "; ".join(f"{k}: {_show(old)} -> {_show(new)}" for k, (old, new) in forbidden.items())
    hints = []
    if BATCH in forbidden:
        old_batch = forbidden[BATCH][0]
        hints.append(
            f"keep the global batch with train.global_batch_size={old_batch} (it then re-plans grad_accum for "
            f"{prep.world_size} processes), or run with --nproc {m.get('world_size', 1)}; to change the batch on "
            "purpose set train.checkpoint.replan_batch=true (the data position must fall on a step of the new batch)"
        )
    hints.append("restore the checkpoint's values (left of each arrow), or train this config into another folder "
                 "with train.checkpoint.dir=<new folder> (or train.checkpoint.resume=none to start over)")
    return (f"cannot resume from checkpoint {where}: these settings define the training job and cannot change "
            f"within it: {lines}. Fix: " + "; or ".join(hints) + ".")


def _show(value) -> str:
    return json.dumps(value, sort_keys=True) if not isinstance(value, str) else value


def summary(changes: dict[str, tuple]) -> str:
    return "; ".join(f"{k}: {_show(a)} -> {_show(b)}" for k, (a, b) in changes.items())


# --------------------------------------------------------------------------- loading and applying changes


def load(run) -> dict:
    """Load the checkpoint into a training run's engine (every rank), restore its counters, metrics and RNG,
    apply the changed settings and (rank 0) record the resume. Returns the checkpoint's client state."""
    import torch.distributed as dist

    from mlops.errors import MLOpsError
    from training.checkpoint import set_rng_state, to_universal

    prep = run.prep
    started = time.perf_counter()
    load_dir, tag = prep.resume_from.parent, prep.resume_from.name
    if prep.universal:
        if run.rank0:
            to_universal(prep.resume_from)
        dist.barrier()
        load_dir = prep.resume_from.parent / "universal"
    path, state = run.engine.load_checkpoint(str(load_dir), tag=tag, load_module_strict=run.t.mode not in ADAPTER_MODES)
    if path is None:
        raise MLOpsError(f"DeepSpeed could not load checkpoint {prep.resume_from}. Fix: set "
                         "train.checkpoint.resume=none to start over, or point it at another checkpoint.")
    state = state or {}
    rngs = state.get("rng") or []
    if run.world.rank < len(rngs):
        set_rng_state(rngs[run.world.rank])
    run.step = int(state.get("step", 0))
    run.tokens_seen = int(state.get("tokens_seen", 0))
    run.last_metrics = dict(state.get("last_metrics", {}))
    run.val = dict(state.get("val", {}))  # a resume at the last step still reports its val_loss
    run.last_loss = state.get("loss")
    applied = apply(run.engine, run.t, prep.changes)
    run.resume_s = time.perf_counter() - started
    run.saver.last_complete = prep.resume_from
    run.tracker.log_metrics({"resume_load_s": run.resume_s}, run.step)
    if run.rank0:
        m = prep.resume_manifest
        ledger = record(prep.ckpt_dir, {
            "step": run.step, "checkpoint": str(prep.resume_from), "from_run": m.get("run_id"),
            "run": run.tracker.run_id, "from_config_hash": m.get("config_hash"), "config_hash": prep.config_hash,
            "world_size": {"from": m.get("world_size"), "to": prep.world_size},
            "changes": as_record(prep.changes), "applied": applied})
        run.tracker.log_dict({"resumes": ledger}, LEDGER)
        changed = f" with changes: {summary(prep.changes)}" if prep.changes else ""
        print(f"resumed from {prep.resume_from} at step {run.step} in {run.resume_s:.2f} s{changed}", flush=True)
    return state



def apply(engine, t, changes: dict[str, tuple]) -> dict:
    """Push the new optimizer and schedule settings into what load_checkpoint restored (the old ones).
    Returns {field: value now in effect} for the record; {} when nothing relevant changed."""
    if not any(k in OPTIMIZER_FIELDS for k in changes):
        return {}
    from training.engine import lr_lambda

    sched = engine.lr_scheduler
    groups = engine.optimizer.param_groups
    factor = lr_lambda(t)
    step = int(getattr(sched, "last_epoch", 0))
    if sched is not None:
        sched.lr_lambdas = [factor for _ in groups]
        sched.base_lrs = [float(t.lr) for _ in groups]
    for group in groups:
        group["initial_lr"] = float(t.lr)
        group["lr"] = float(t.lr) * factor(step)
        group["betas"] = tuple(t.adam_betas)
        group["eps"] = float(t.adam_eps)
        group["weight_decay"] = float(t.weight_decay)
    if sched is not None:
        sched._last_lr = [g["lr"] for g in groups]
    return {"lr_now": groups[0]["lr"], "peak_lr": float(t.lr), "schedule_step": step}


# --------------------------------------------------------------------------- the ledger


def read_ledger(ckpt_dir: Path) -> list[dict]:
    try:
        data = json.loads((ckpt_dir / LEDGER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return list(data.get("resumes", [])) if isinstance(data, dict) else []


def record(ckpt_dir: Path, entry: dict) -> list[dict]:
    """Append one resume to the folder's ledger; returns the whole ledger."""
    from training.checkpoint import atomic_json

    ledger = [*read_ledger(ckpt_dir), {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **entry}]
    atomic_json(ckpt_dir / LEDGER, {"resumes": ledger})
    return ledger


def as_record(changes: dict[str, tuple]) -> dict:
    return {k: {"from": a, "to": b} for k, (a, b) in changes.items()}
