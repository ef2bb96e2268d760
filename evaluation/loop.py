"""The next round, opened by the data: `mlops loop check MODEL` (cron-friendly).

A round opens when the recorded release policy (`registry.loop`) says so, for any of:
- increment: the harvested, reviewed increment (`mlops data harvest`) holds `min_increment` accepted records;
- alert: `mlops monitor` raises an alert on the model (when `on_alert`);
- age: the production version has held production for longer than `max_age_days`;
- pairs (`mode: dpo` or `auto`): the harvested, reviewed preference pairs (`mlops data harvest --pairs` into the
  same increment folder) number `min_pairs` accepted.
What the round trains follows `registry.loop.mode`: sft (the accepted corrections, as chat records), dpo (the
accepted pairs: a preference snapshot, then `train.objective=dpo` from the production version's weights, whose
reference is those same weights), or auto (dpo once `min_pairs` pairs are accepted, else sft).
An open round builds the next snapshot from the accepted records, mixed with the production version's own
snapshot (`history_ratio`) and deduplicated against it (the build's history mode, as `mlops data harvest accept
--build`), and, when `launch_training` is on, launches the training run through MLflow Projects (`mlproject`,
entry point `train`, from the production version's weights). The decision and every input are logged as an
MLflow run (stage `loop`). The trigger never registers, requests or promotes: a trained round goes through every
gate like any other.

    check(model, increment, build=..., launch=..., ...)  -> the decision (pure orchestration, parts injected)
    gather(model, increment, ...)                        -> what the decision reads (ledger, increment, monitor)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlops.errors import MLOpsError

DAY = 86400.0
EXIT_NOTHING_TO_BUILD = 4


@dataclass
class LoopInputs:
    model: str
    increment: str
    accepted: int = 0  # reviewed rows accepted with a correction: the records the next snapshot learns from
    pending: int = 0
    production: str | None = None
    production_since: float | None = None
    age_days: float | None = None
    history_snapshot: str | None = None
    pairs: int = 0  # reviewed preference pairs accepted: what a DPO round learns from
    pairs_pending: int = 0
    objective: str = "sft"  # what the round trains (round_objective), set once the round opens
    alerts: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def decide(inputs: LoopInputs, policy) -> list[str]:
    """Why a round opens now (empty: it does not): the policy's rules over the inputs."""
    reasons = []
    mode = policy.mode
    if mode in ("dpo", "auto") and inputs.pairs >= policy.min_pairs:
        reasons.append(f"pairs: {inputs.pairs} accepted preference pairs >= registry.loop.min_pairs "
                       f"{policy.min_pairs}")
    if mode != "dpo" and inputs.accepted >= policy.min_increment:
        reasons.append(f"increment: {inputs.accepted} accepted records >= registry.loop.min_increment "
                       f"{policy.min_increment}")
    if policy.on_alert and inputs.alerts:
        signals = ", ".join(sorted({f"v{a['version']} {a['signal']} vs {a['reference']}" for a in inputs.alerts}))
        reasons.append(f"alert: {signals}")
    if inputs.age_days is not None and inputs.age_days > policy.max_age_days:
        reasons.append(f"age: v{inputs.production} has been in production {inputs.age_days:.1f} days > "
                       f"registry.loop.max_age_days {policy.max_age_days:g}")
    return reasons


def round_objective(inputs: LoopInputs, policy) -> str:
    """sft or dpo: what an open round trains, by `registry.loop.mode`."""
    mode = policy.mode
    if mode == "auto":
        return "dpo" if inputs.pairs >= policy.min_pairs else "sft"
    return mode


def count_pairs(increment: Path) -> tuple[int, int]:
    """(accepted pairs, pending pairs) of the increment's harvested pairs (none harvested: 0, 0)."""
    from mlops.data.harvest_pairs import PAIRS, read_pairs

    if not (increment / PAIRS).is_file():
        return 0, 0
    rows = [row for _, row in read_pairs(increment)]
    return sum(r.get("accepted") is True for r in rows), sum(r.get("accepted") is None for r in rows)


def count_increment(increment: Path) -> tuple[int, int, str | None]:
    """(accepted records, pending rows, a note): accepted means reviewed true with a correction to learn."""
    from mlops.data.harvest import INCREMENT, read_increment

    if not (increment / INCREMENT).is_file():
        return 0, 0, (f"no harvested increment at {increment} yet (`mlops data harvest --since <time> --out "
                      f"{increment}` makes one)")
    rows = [row for _, row in read_increment(increment)]
    accepted = sum(r.get("accepted") is True and bool((r.get("correction") or "").strip()) for r in rows)
    return accepted, sum(r.get("accepted") is None for r in rows), None


def check(model: str, increment: Path | str, *, policy, inputs: LoopInputs, build: Callable[[LoopInputs], dict],
          launch: Callable[[LoopInputs, dict], dict] | None = None) -> dict:
    """The decision, and what it did: build the next snapshot and (policy permitting) launch its training."""
    reasons = decide(inputs, policy)
    out: dict[str, Any] = {"model": model, "decision": "open" if reasons else "wait", "reasons": reasons,
                           "inputs": asdict(inputs), "policy": policy.model_dump(mode="json"), "objective": None, "snapshot": None,
                           "training": None, "promotes": False}
    if not reasons:
        return out
    inputs.objective = out["objective"] = round_objective(inputs, policy)
    if inputs.objective == "dpo" and inputs.pairs == 0:
        out["decision"] = "due"
        out["notes"] = [f"a DPO round is due, but {increment} holds no accepted preference pair to learn from. Fix: "
                        f"`mlops data harvest --pairs --since <time> --out {increment}`, review pairs.jsonl (set "
                        "\"accepted\": true), then run `mlops loop check` again."]
        return out
    if inputs.objective == "sft" and inputs.accepted == 0:
        out["decision"] = "due"
        out["notes"] = [f"a round is due, but {increment} holds no accepted record to learn from. Fix: harvest "
                        "(`mlops data harvest`) and review the increment (set \"accepted\": true with a "
                        "correction), then run `mlops loop check` again."]
        return out
    out["snapshot"] = build(inputs)
    if policy.launch_training:
        out["training"] = launch(inputs, out["snapshot"]) if launch else {"launched": False,
                                                                          "why": "no launcher"}
    else:
        out["training"] = {"launched": False, "why": "registry.loop.launch_training is off"}
    return out


# --------------------------------------------------------------------------- reading the stores


def gather(model: str, increment: Path, *, policy, monitor_days: int, now: float | None = None,
           url: str | None = None, monitor: Callable | None = None) -> LoopInputs:
    """What `decide` reads: the increment's counts, the production version (its age and snapshot) from the
    verified ledger, and the monitor's alerts (a window without traffic is a note, not an alert)."""
    from evaluation.monitor import NoTraffic, champion_periods
    from registry.resolve import require_model

    now = time.time() if now is None else now
    inputs = LoopInputs(model, str(increment))
    inputs.accepted, inputs.pending, note = count_increment(increment)
    inputs.pairs, inputs.pairs_pending = count_pairs(increment)
    inputs.notes += [note] if note and policy.mode != "dpo" else []
    state = require_model(model, url=url)
    inputs.production = state.aliases.get("production")
    if inputs.production:
        periods = champion_periods(state.entries)
        since = periods[-1][1] if periods and periods[-1][0] == inputs.production else None
        inputs.production_since = since
        inputs.age_days = None if since is None else (now - since) / DAY
        inputs.history_snapshot = state.versions[inputs.production].evidence.get("snapshot_id")
    else:
        inputs.notes.append(f"'{model}' has no production version: no age to judge, no history to mix")
    if policy.on_alert:
        from evaluation.monitor_cli import monitor_model

        try:
            inputs.alerts = (monitor or monitor_model)(model, days=monitor_days, now=now)["alerts"]
        except NoTraffic as err:
            inputs.notes.append(f"monitor: {err}".split(" Fix:")[0])
    return inputs


def snapshot_builder(config, *, ratio: float) -> Callable[[LoopInputs], dict]:
    """Build the next snapshot: the accepted records of the increment, mixed with the production version's snapshot
    and deduplicated against it (what `mlops data harvest accept --build --history` does). A rebuild of the
    same accepted records is the build's own no-op (its content key)."""

    def build(inputs: LoopInputs) -> dict:
        from mlops.data.harvest import accept, increment_config
        from mlops.data.tracked_build import run_build

        if inputs.objective == "dpo":
            return _pair_snapshot(config, inputs)
        accepted = accept(inputs.increment)
        history = inputs.history_snapshot
        cfg = increment_config(config, inputs.increment, history=history, ratio=ratio if history else None)
        result, run_id = run_build(cfg)
        return {"snapshot_id": result.snapshot_id, "data_run_id": run_id, "records": accepted["accepted"],
                "samples": result.manifest["counts"]["samples"], "history": history, "path": str(result.path)}

    return build


def _pair_snapshot(config, inputs: LoopInputs) -> dict:
    """A DPO round's snapshot: the accepted pairs alone, as a preference build (pairs are never mixed with history
    rows: a row drawn alone would split its pair)."""
    from mlops.data.harvest_pairs import accept_pairs, pairs_config
    from mlops.data.tracked_build import run_build

    accepted = accept_pairs(inputs.increment)
    result, run_id = run_build(pairs_config(config, inputs.increment))
    return {"snapshot_id": result.snapshot_id, "data_run_id": run_id, "records": accepted["accepted"],
            "pairs": result.manifest.get("pairs", {}).get("total"), "samples": result.manifest["counts"]["samples"],
            "history": None, "path": str(result.path), "record_type": "preference"}


def mlflow_project_launcher(train_config: str, *, project: Path, experiment: str,
                            extra: list[str] | None = None) -> Callable[[LoopInputs, dict], dict]:
    """Launch `mlflow run mlproject -e train` on the new snapshot, from the production version's weights, without
    waiting for it (the training run reports to MLflow as any other); never twice for one snapshot."""

    def launch(inputs: LoopInputs, snapshot: dict) -> dict:
        from mlops.lineage import Tag
        from mlops.run_store import latest_run

        trained = latest_run({str(Tag.STAGE): "train", str(Tag.SNAPSHOT_ID): snapshot["snapshot_id"]})
        if trained:
            return {"launched": False, "why": f"run {trained} already trained on {snapshot['snapshot_id']}",
                    "run_id": trained}
        import mlflow.projects

        overrides = [f"train.snapshot={snapshot['snapshot_id']}", *(extra or []),
                     *(["train.objective=dpo"] if inputs.objective == "dpo" else []),
                     *([f"base_model=models:/{inputs.model}/{inputs.production}"] if inputs.production else [])]
        submitted = mlflow.projects.run(str(project), entry_point="train", env_manager="local",
                                        experiment_name=experiment, synchronous=False,
                                        parameters={"config": train_config, "overrides": " ".join(overrides)})
        return {"launched": True, "run_id": submitted.run_id, "entry_point": "train", "config": train_config,
                "overrides": overrides}

    return launch


def require_train_config(policy, train_config: str | None) -> None:
    if policy.launch_training and not train_config:
        raise MLOpsError("the recorded policy launches training (registry.loop.launch_training: true) but no "
                         "training config was given. Fix: pass --train-config configs/train/<recipe>.yaml, or an "
                         "admin records a policy with launch_training: false.")


def finite(value: float | None) -> float:
    return -1.0 if value is None or not math.isfinite(value) else float(value)
