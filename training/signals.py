"""The trainer's own signals for Prometheus (train.signals): a textfile for node_exporter's textfile collector
and/or a Pushgateway, rewritten at every log step. deploy/prometheus/training-alerts.yml alerts on them.

Prometheus sees gauges, not steps or evaluations, so what its rules need is kept here: the time the last logged
step ended (a hung or dead trainer leaves it stale), the run's own first-hour throughput (the baseline a slowdown
is measured against) and how many validations in a row raised the validation loss. Publishing is best effort:
a full disk or an unreachable Pushgateway is logged once and never stops or slows training for long.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

PREFIX = "mlops_train_"
LABELS = ("run_id", "experiment", "config_hash")
FIRST_HOUR_S = 3600.0
PUSH_JOB = "mlops_train"
PUSH_TIMEOUT_S = 2.0
PUSH_RETRY_S = 60.0  # after a failed push, skip pushes this long: a dead gateway costs one timeout a minute
GAUGES = {
    "tokens_per_second": "training throughput over the last log window (tokens/s, all ranks)",
    "first_hour_tokens_per_second": "mean of the logged tokens/s over this process's first hour (then frozen)",
    "data_wait_share": "share of step time spent waiting on data over the last log window (0..1)",
    "grad_norm": "mean gradient norm (before clipping) over the last log window",
    "loss": "mean training loss over the last log window",
    "val_loss": "validation loss of the last evaluation",
    "val_loss_rises": "consecutive evaluations whose validation loss was above the one before",
    "step": "the last logged optimizer step",
    "last_step_timestamp_seconds": "unix time the last logged step ended (the start, before the first step)",
    "start_timestamp_seconds": "unix time this trainer process opened its signals",
    "end_timestamp_seconds": "unix time the trainer closed its signals (absent while it runs or after a kill)",
}
_DIRECT = {"tokens_per_s": "tokens_per_second", "grad_norm": "grad_norm", "loss": "loss", "val_loss": "val_loss"}


def open_signals(section, run_id: str, prep, *, clock=time.time) -> Signals | None:
    """The run's signals when train.signals names a textfile or a Pushgateway; None otherwise."""
    if section is None or not (section.textfile or section.pushgateway):
        return None
    if section.textfile and not str(section.textfile).endswith(".prom"):
        log.warning("train.signals.textfile=%s: node_exporter's textfile collector reads only *.prom files",
                    section.textfile)
    labels = {"run_id": run_id, "experiment": prep.cfg.run.experiment, "config_hash": prep.config_hash}
    return Signals(labels, textfile=section.textfile, pushgateway=section.pushgateway, clock=clock)


class Signals:
    """Gauges of one trainer process; `observe` after every log step and validation, `close` at the end."""

    def __init__(self, labels: dict, *, textfile: str | None = None, pushgateway: str | None = None,
                 clock=time.time) -> None:
        from prometheus_client import CollectorRegistry, Gauge

        self.labels, self.textfile, self.pushgateway, self.clock = labels, textfile, pushgateway, clock
        self.registry = CollectorRegistry()
        self.gauges = {name: Gauge(PREFIX + name, doc, LABELS, registry=self.registry) for name, doc in GAUGES.items()}
        self.started = clock()
        self.last_step: int | None = None
        self.first_hour = [0.0, 0]  # sum and count of the tokens/s logged in the first hour
        self.last_val: float | None = None
        self.rises = 0
        self.warned: set[str] = set()
        self.push_after = 0.0
        self._set("start_timestamp_seconds", self.started)
        # Before the first step: a trainer stuck in its first step (a collective, a load) still goes stale.
        self._set("last_step_timestamp_seconds", self.started)
        self._set("val_loss_rises", 0)
        self._publish()

    def observe(self, step: int, metrics: dict) -> None:
        """Take one flush's window means (or one validation's metrics) at `step`, then publish."""
        now = self.clock()
        if self.last_step is None or step > self.last_step:  # a validation at the same step is no new step
            self.last_step = step
            self._set("step", step)
            self._set("last_step_timestamp_seconds", now)
        for key, name in _DIRECT.items():
            if key in metrics:
                self._set(name, metrics[key])
        if "tokens_per_s" in metrics:
            self._first_hour(now, float(metrics["tokens_per_s"]))
        if metrics.get("step_time_s"):
            share = float(metrics.get("data_wait_s", 0.0)) / float(metrics["step_time_s"])
            self._set("data_wait_share", min(1.0, max(0.0, share)))
        if "val_loss" in metrics:
            self._val(float(metrics["val_loss"]))
        self._publish()

    def close(self) -> None:
        """Publish the last values with the end time. The file stays: a killed trainer never gets here, so its
        stale file keeps the hang alert firing; a closed one has ended, which the rules read."""
        self._set("end_timestamp_seconds", self.clock())
        self._publish()

    def _set(self, name: str, value: float) -> None:
        self.gauges[name].labels(**self.labels).set(float(value))

    def _first_hour(self, now: float, rate: float) -> None:
        """The baseline the throughput rule compares with: the run's own speed, frozen after its first hour."""
        total, count = self.first_hour
        if now - self.started <= FIRST_HOUR_S or count == 0:
            self.first_hour = [total + rate, count + 1]
        self._set("first_hour_tokens_per_second", self.first_hour[0] / self.first_hour[1])

    def _val(self, value: float) -> None:
        """Count validations in a row that rose: the "rising for K evaluations" rule is then a threshold."""
        self.rises = self.rises + 1 if self.last_val is not None and value > self.last_val else 0
        self.last_val = value
        self._set("val_loss_rises", self.rises)

    def _publish(self) -> None:
        if self.textfile:
            self._try("textfile", self._write)
        if self.pushgateway and self.clock() >= self.push_after:
            self._try("pushgateway", self._push)

    def _write(self) -> None:
        from prometheus_client import write_to_textfile

        write_to_textfile(str(self.textfile), self.registry)  # a temporary file renamed over it: atomic

    def _push(self) -> None:
        from prometheus_client import push_to_gateway

        try:
            push_to_gateway(self.pushgateway, job=PUSH_JOB, registry=self.registry,
                            grouping_key={"run_id": self.labels["run_id"]}, timeout=PUSH_TIMEOUT_S)
        except Exception:
            self.push_after = self.clock() + PUSH_RETRY_S
            raise

    def _try(self, target: str, publish) -> None:
        """Signals are for watching a run, never a reason to stop it: warn once per target, keep training."""
        try:
            publish()
        except Exception as err:  # noqa: BLE001 - any failure to publish is the same to training: go on
            if target not in self.warned:
                self.warned.add(target)
                log.warning("training signals: could not publish to the %s (%s: %s); training goes on, later "
                            "failures are not logged", target, type(err).__name__, err)
