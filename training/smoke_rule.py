"""The smoke rule: a run whose plan exceeds `train.smoke.required_above_hours` starts only after a passed smoke
run of the same config (`--smoke true`: a few dozen steps that must lower the loss at a set speed), because a
smoke run catches half of what would waste a long job within minutes.

A smoke run records the config hash of the real run it vets (`mlops.smoke_of_config`); it passed when its verdict
tag says so (`mlops.smoke=passed`). `train.smoke.skip_reason` starts the run without one, and the reason is
recorded on the run (`mlops.smoke_skipped`).
"""

from __future__ import annotations

from mlops.errors import ConfigError

SMOKE_OF = "mlops.smoke_of_config"  # on a smoke run: the config hash of the run it vets
SMOKE_SKIPPED = "mlops.smoke_skipped"  # on a long run started without a passed smoke: why


def passed_smoke(config_hash: str) -> str | None:
    """The newest FINISHED smoke run of this config, or None."""
    from mlops.lineage import Tag
    from mlops.run_store import latest_run

    return latest_run({SMOKE_OF: config_hash, Tag.SMOKE: "passed"})  # its verdict (training.final)


def smoke_tags(cfg, world_size: int, base_path: str, config_hash: str, *, smoke: bool) -> dict[str, str]:
    """Tags for the run's lineage: a smoke run names the config it vets; a long run without a passed smoke is
    refused (ConfigError naming the command) unless `train.smoke.skip_reason` says why, which is recorded."""
    if smoke:
        return {SMOKE_OF: config_hash}
    s = cfg.train.smoke
    if s.required_above_hours is None:
        return {}
    hours = planned_hours(cfg, world_size, base_path)
    if hours <= s.required_above_hours or passed_smoke(config_hash):
        return {}
    if s.skip_reason:
        return {SMOKE_SKIPPED: s.skip_reason[:500]}
    raise ConfigError(
        f"this run plans {hours:.1f} h on this machine, above train.smoke.required_above_hours="
        f"{s.required_above_hours:g}, and no smoke run of its config ({config_hash[:12]}) has passed. Nothing was "
        "started. Fix: run the same command with `--smoke true` first (`mlops train run --config <yaml> --smoke true "
        "<same overrides>`: a few dozen steps that must lower the loss), or set train.smoke.skip_reason=\"<why>\" "
        "(recorded on the run)."
    )


def planned_hours(cfg, world_size: int, base_path: str) -> float:
    """Wall hours (with the plan's margin) of this config on this machine's devices, speed measured."""
    from training import hardware
    from training.planner import plan_job

    plan = plan_job(cfg, hw=hardware.local(measure=True), gpus=world_size, base_path=base_path)
    return float(plan["wall_time_with_margin_s"]) / 3600
