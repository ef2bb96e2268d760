"""Training alerts (issue 41): the trainer's own signals for Prometheus (training/signals.py) and the rules of
deploy/prometheus/training-alerts.yml, checked with promtool and each tripped from the series of real runs.

Two real tiny runs feed the rule tests: a healthy one, and one whose faults come from the run itself: a
validation split unlike the training data (its validation loss rises while the training loss falls),
train.debug.spike_at_step with the trainer's own spike guard off (a real grad-norm spike), and a snapshot reader
that turns slow for the last steps (a data stall the trainer measures itself). Their logged metrics, read back
from MLflow, are replayed through training.signals.Signals on a clock of MINUTES_PER_STEP minutes per logged
step, and its textfile is scraped every minute as node_exporter would serve it: those scrapes are promtool's input
series. A tiny run lasts seconds and the rules think in minutes and hours, so the clock is all the replay changes,
except the one series a comment says is scaled.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import statistics
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "training-alerts.yml"
ALERTS = ("TrainingThroughputDropped", "TrainingDataStall", "TrainingHung", "TrainingGradNormSpike",
          "TrainingValLossRising")
MINUTES_PER_STEP = 2
FLUSHED = ("loss", "grad_norm", "tokens_per_s", "data_wait_s", "step_time_s")
MICRO = 4  # sequences a step, in one micro step (the tiny default's 2 x 2 sequences, in one forward)
HEALTHY_STEPS = 15  # 30 minutes of replay: two passes make the first hour
FAULT_STEPS, SPIKE_STEP, STALL_FROM = 32, 18, 24
STORE_ENV = ("MLFLOW_TRACKING_URI", "MLOPS_HOME", "MLOPS_REGISTRY_DB", "MLFLOW_REGISTRY_URI")


@dataclass
class RealRun:
    status: str
    labels: dict  # run_id, experiment, config_hash: the labels of every gauge
    steps: dict  # step -> that step's logged window means (log_every=1), from MLflow
    vals: dict  # step -> {"val_loss": ...}, from MLflow
    textfile: str  # the trainer's own textfile after the run
    warnings: list  # what training.signals logged during the run


# ----------------------------------------------------------------- the real runs


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool, or a skip; CI installs it (.ci/run), so there a missing promtool fails."""
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("promtool is missing in CI: .ci/run installs Debian's prometheus package, which ships it")
        pytest.skip("promtool is not installed (apt-get install prometheus); CI runs these tests")
    return path


@pytest.fixture(scope="module")
def real(tmp_path_factory, tiny_model) -> dict[str, RealRun]:
    """The healthy run and the faulty run, trained once for the module."""
    from training.testing import make_snapshot

    root = tmp_path_factory.mktemp("alerts")
    with _own_home(root) as mp, _one_thread():
        # Its Pushgateway is a closed port: every push fails, and the run must not mind.
        healthy = _train(root, "healthy", make_snapshot(), tiny_model, **{
            "train.max_steps": HEALTHY_STEPS, "train.eval_every": 3, "train.signals.pushgateway": _closed_port()})
        _slow_reader(mp, STALL_FROM)
        faults = _train(root, "faults", _drifted_snapshot(), tiny_model, **{
            "train.max_steps": FAULT_STEPS, "train.eval_every": 2, "train.lr": 3e-3,
            "train.debug.spike_at_step": SPIKE_STEP, "train.guards.spike_factor": "null"})
    return {"healthy": healthy, "faults": faults}


@contextmanager
def _own_home(root: Path):
    """A project home for the module's runs (`mlops_home` is per test). MLflow's set_tracking_uri writes
    MLFLOW_TRACKING_URI, which monkeypatch does not undo when it was absent: the store env is put back by hand."""
    import mlflow

    before = {name: os.environ.get(name) for name in STORE_ENV}
    (root / "home").mkdir()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MLOPS_HOME", str(root / "home"))
            mp.setenv("MLOPS_LEDGER_KEY_DIR", str(root / "ledger-keys"))
            for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_REGISTRY_URI"):
                mp.delenv(name, raising=False)
            mlflow.set_tracking_uri(None)
            yield mp
    finally:
        mlflow.set_tracking_uri(None)
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _one_thread():
    """One torch thread: two threads of a tiny model wait on each other whenever a neighbour takes a core, which
    would make the runs' throughput mostly a measure of the machine's other work."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _train(root: Path, name: str, snapshot: str, tiny_model: dict, **extra) -> RealRun:
    """A real run on the MLflow store, logging every step; its metrics read back from MLflow."""
    from mlflow.tracking import MlflowClient

    from mlops.config import load_config
    from mlops.tracking import tracking_uri
    from training.prepare import prepare
    from training.testing import tiny_overrides
    from training.trainer import train

    textfile = root / f"{name}.prom"
    overrides = {"run.log_every": 1, "train.micro_batch_size": MICRO, "train.grad_accum": 1, "train.final_model": False,
                 "train.checkpoint_every": 1000, "train.checkpoint.dir": str(root / name),
                 "train.signals.textfile": str(textfile), **extra}
    cfg = load_config(None, tiny_overrides(snapshot, base_model=tiny_model["path"], **overrides))
    prep = prepare(cfg, 1)
    with _signals_log() as warnings:
        result = train(cfg, prepared=prep)
    client = MlflowClient(tracking_uri())
    history = {key: {m.step: m.value for m in client.get_metric_history(result.run_id, key)}
               for key in (*FLUSHED, "val_loss")}
    steps = {step: {key: history[key][step] for key in FLUSHED} for step in sorted(history["loss"])}
    vals = {step: {"val_loss": value} for step, value in sorted(history["val_loss"].items())}
    labels = {"run_id": result.run_id, "experiment": cfg.run.experiment, "config_hash": prep.config_hash}
    return RealRun(result.status, labels, steps, vals, textfile.read_text(), warnings)


@contextmanager
def _signals_log():
    records: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("training.signals")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def _drifted_snapshot() -> str:
    """The tiny training split with a validation split of random tokens the training split never holds: the more
    the model learns the training split, the less probability those tokens get, so the validation loss rises
    while the training loss falls (to the rule, this is what overfitting looks like)."""
    import numpy as np

    from mlops.data.format import write_snapshot
    from training.synthetic import pattern_samples

    rng = np.random.default_rng(3)
    validation = [{"input_ids": rng.integers(20000, 30000, size=32).tolist(), "id": f"drift-{i:02d}"}
                  for i in range(16)]
    folder = write_snapshot({"train": pattern_samples(64, 32, seed=1), "validation": validation}, seq_len=32,
                            pad_id=0, config_hash="alerts-drifted-validation")
    return folder.name


def _slow_reader(mp, from_step: int) -> None:
    """From `from_step` on, reading a training batch takes three times the previous step's compute (0.3 to 1 s):
    slow storage, inside the loader's own timing, so the trainer measures the wait itself."""
    from mlops.data.format import SnapshotReader

    real_order = SnapshotReader.global_order
    last = {"at": None, "slept": 0.0}

    def global_order(self, seed, start=0):
        now, slept = time.perf_counter(), 0.0
        if self.split == "train" and start // MICRO + 1 >= from_step and last["at"] is not None:
            slept = min(1.0, max(0.3, 3 * (now - last["at"] - last["slept"])))
            time.sleep(slept)
        last.update(at=now, slept=slept)
        return real_order(self, seed, start)

    mp.setattr(SnapshotReader, "global_order", global_order)


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


# ----------------------------------------------------------------- replay and promtool


def timeline(run: RealRun, steps: int, *, slow_after: int | None = None, factor: float = 1.0) -> list[tuple]:
    """`steps` logged steps, one every MINUTES_PER_STEP minutes, taken from the run's in order and again from its
    first when they run out (step numbers go on): [(minute, step, window means, validation or None)]. After
    minute `slow_after`, tokens/s is multiplied by `factor`."""
    real = sorted(run.steps)
    events = []
    for i in range(steps):
        source, minute = real[i % len(real)], (i + 1) * MINUTES_PER_STEP
        means = dict(run.steps[source])
        if slow_after is not None and minute > slow_after:
            means["tokens_per_s"] *= factor
        events.append((minute, i + 1, means, run.vals.get(source)))
    return events


def replay(run: RealRun, events: list[tuple], path: Path, *, until: int, close_at: int | None = None) -> list[dict]:
    """Feed the events to Signals as the trainer would, on a clock that starts at 0, and scrape its textfile every
    minute up to `until`: one {series: value} per minute. No close means the trainer hangs or was killed."""
    from training.signals import Signals

    now = [0.0]
    signals = Signals(run.labels, textfile=str(path), clock=lambda: now[0])
    scrapes = []
    for minute in range(until + 1):
        now[0] = minute * 60.0
        for _, step, means, val in (e for e in events if e[0] == minute):
            signals.observe(step, means)
            if val is not None:
                signals.observe(step, val)
        if minute == close_at:
            signals.close()
        scrapes.append(scrape(path.read_text()))
    return scrapes


def scrape(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def run_promtool(promtool: str, tmp_path: Path, name: str, scrapes: list[dict], labels: dict,
                 firing: dict[int, tuple]) -> None:
    """`promtool test rules` on the scraped series: at each minute of `firing`, exactly the alerts named there
    fire (with the run's labels, the rule's severity and its annotations rendered), and no other alert does."""
    rules = {r["alert"]: r for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]}
    series = sorted({key for s in scrapes for key in s})
    inputs = [{"series": key, "values": " ".join("_" if s.get(key) is None else repr(s[key]) for s in scrapes)}
              for key in series]
    checks = [{"eval_time": f"{minute}m", "alertname": alert,
               "exp_alerts": [expected(rules[alert], labels)] if alert in names else []}
              for minute, names in firing.items() for alert in ALERTS]
    doc = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
           "tests": [{"name": name, "interval": "1m", "input_series": inputs, "alert_rule_test": checks}]}
    path = tmp_path / f"{name}.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
    out = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, f"{name}:\n{out.stdout}\n{out.stderr}"


def expected(rule: dict, labels: dict) -> dict:
    def render(text: str) -> str:
        rendered = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels[m.group(1)], text)
        assert "{{" not in rendered, f"the test renders $labels only: {text}"
        return rendered

    return {"exp_labels": {**labels, **rule["labels"]},
            "exp_annotations": {key: render(value) for key, value in rule["annotations"].items()}}


def share(means: dict) -> float:
    return means["data_wait_s"] / means["step_time_s"]


# ----------------------------------------------------------------- the rules


def test_the_rules_file_passes_promtool_check(promtool):
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "SUCCESS: 5 rules found" in out.stdout, out.stdout + out.stderr
    names = [r["alert"] for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]]
    assert sorted(names) == sorted(ALERTS)


def test_a_healthy_run_fires_no_alert_before_or_after_its_first_hour_nor_once_it_ended(promtool, real, tmp_path):
    run = real["healthy"]
    grads = [m["grad_norm"] for m in run.steps.values()]
    assert max(grads) < 5 * statistics.median(grads), f"the healthy run had a grad-norm spike of its own: {grads}"
    # About 3.5 passes of the run (104 minutes), then it ends (close) and its file stays: an ended run is no hang.
    scrapes = replay(run, timeline(run, 52), tmp_path / "healthy.prom", until=130, close_at=104)
    run_promtool(promtool, tmp_path, "healthy", scrapes, run.labels,
                 {minute: () for minute in (20, 45, 70, 85, 100, 128)})


def test_throughput_under_half_of_the_first_hour_fires_once_that_hour_is_over(promtool, real, tmp_path):
    run, faults = real["healthy"], real["faults"]
    # The slowdown is the faulty run's own: its tokens/s once its reader turned slow, over its tokens/s before.
    # The healthy run's tokens/s after the first hour are scaled by that measured ratio (its other gauges as
    # they were: a slowdown that is not the data's, as from a throttled device).
    before = [m["tokens_per_s"] for s, m in faults.steps.items() if 2 <= s < STALL_FROM]
    after = [m["tokens_per_s"] for s, m in faults.steps.items() if s >= STALL_FROM]
    ratio = statistics.median(after) / statistics.median(before)
    assert ratio < 0.5, f"the slow reader cut the real throughput to {ratio:.0%} only: {before} -> {after}"
    scrapes = replay(run, timeline(run, 60, slow_after=60, factor=ratio), tmp_path / "slow.prom", until=120)
    # Not before the hour is over, nor 15 minutes into it (the `for`); by then the 30-minute mean is all slow.
    run_promtool(promtool, tmp_path, "throughput", scrapes, run.labels,
                 {60: (), 75: (), 115: ("TrainingThroughputDropped",)})


def test_no_step_for_fifteen_minutes_fires_the_hang_alert(promtool, real, tmp_path):
    run = real["healthy"]
    # The run once (30 minutes), then its file stays as it was with no end: a trainer stuck in a step, or killed.
    scrapes = replay(run, timeline(run, HEALTHY_STEPS), tmp_path / "hung.prom", until=60)
    run_promtool(promtool, tmp_path, "hung", scrapes, run.labels, {44: (), 50: ("TrainingHung",)})


def test_a_grad_norm_spike_rising_validation_loss_and_a_data_stall_each_fire_their_alert(promtool, real, tmp_path):
    run = real["faults"]
    grads = {s: m["grad_norm"] for s, m in run.steps.items()}
    median = statistics.median(grads.values())
    assert grads[SPIKE_STEP] > 1000 * median, f"train.debug.spike_at_step gave no grad-norm spike: {grads}"
    assert all(g < 5 * median for s, g in grads.items() if s > SPIKE_STEP), f"a spike of its own after: {grads}"
    vals = {s: v["val_loss"] for s, v in run.vals.items()}
    assert all(vals[s] > vals[s - 2] for s in range(16, FAULT_STEPS + 1, 2)), f"the validation loss fell: {vals}"
    shares = [share(m) for s, m in run.steps.items() if s >= STALL_FROM]
    assert min(shares) > 0.4 and all(share(m) < 0.1 for s, m in run.steps.items() if s < STALL_FROM), shares
    scrapes = replay(run, timeline(run, FAULT_STEPS), tmp_path / "faults.prom", until=70, close_at=64)
    # Step 18 (minute 36) spikes; the validation loss has risen at every evaluation from step 16 (minute 32);
    # the reader is slow from step 24 (minute 48); the run ends at minute 64, and so do its alerts.
    run_promtool(promtool, tmp_path, "faults", scrapes, run.labels, {
        44: ("TrainingGradNormSpike", "TrainingValLossRising"),
        62: ("TrainingDataStall", "TrainingValLossRising"),
        68: (),
    })


# ----------------------------------------------------------------- the signals themselves


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_the_textfile_holds_every_gauge_with_the_runs_labels_and_its_logged_values(real):
    from prometheus_client.parser import text_string_to_metric_families

    from training.signals import GAUGES, PREFIX

    run = real["healthy"]
    assert run.status == "FINISHED"
    families = {f.name: f for f in text_string_to_metric_families(run.textfile)}
    assert sorted(families) == sorted(PREFIX + name for name in GAUGES)
    values = {}
    for name, family in families.items():
        assert family.type == "gauge" and len(family.samples) == 1, family
        assert family.samples[0].labels == run.labels
        values[name[len(PREFIX):]] = family.samples[0].value
    last, val = run.steps[HEALTHY_STEPS], run.vals[HEALTHY_STEPS]["val_loss"]
    assert values["step"] == HEALTHY_STEPS
    assert (values["loss"], values["grad_norm"], values["tokens_per_second"]) == (
        last["loss"], last["grad_norm"], last["tokens_per_s"])  # the run's MLflow metrics, the same numbers
    assert values["data_wait_share"] == pytest.approx(share(last))
    assert values["val_loss"] == val
    rates = [m["tokens_per_s"] for m in run.steps.values()]
    assert values["first_hour_tokens_per_second"] == pytest.approx(statistics.mean(rates))  # a run under an hour
    vals = list(v["val_loss"] for v in run.vals.values())
    rises = 0
    for before, after in zip(vals, vals[1:], strict=False):
        rises = rises + 1 if after > before else 0
    assert values["val_loss_rises"] == rises
    assert time.time() - 600 < values["start_timestamp_seconds"] < values["last_step_timestamp_seconds"]
    assert values["last_step_timestamp_seconds"] <= values["end_timestamp_seconds"] <= time.time()


def test_a_failing_pushgateway_does_not_stop_training(real):
    # The healthy run's Pushgateway is a closed port: it finished, its textfile was written, and it said so once.
    run = real["healthy"]
    assert run.status == "FINISHED" and "mlops_train_step" in run.textfile
    assert len(run.warnings) == 1 and "pushgateway" in run.warnings[0] and "training goes on" in run.warnings[0]
    assert real["faults"].warnings == []


def test_an_unwritable_textfile_is_warned_once_and_observe_goes_on(tmp_path, caplog):
    from training.signals import Signals

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    labels = {"run_id": "r1", "experiment": "e", "config_hash": "h"}
    with caplog.at_level(logging.WARNING, logger="training.signals"):
        signals = Signals(labels, textfile=str(blocker / "train.prom"))
        for step in range(1, 6):
            signals.observe(step, {"loss": 1.0 / step, "tokens_per_s": 100.0})
        signals.close()
    warnings = [r for r in caplog.records if r.name == "training.signals"]
    assert len(warnings) == 1 and "textfile" in warnings[0].getMessage()
    blocker.unlink()
    blocker.mkdir()  # the folder is back: the next log step writes the file, with every value kept meanwhile
    signals.observe(6, {"loss": 0.1})
    got = scrape((blocker / "train.prom").read_text())
    assert got['mlops_train_step{config_hash="h",experiment="e",run_id="r1"}'] == 6.0
    assert got['mlops_train_tokens_per_second{config_hash="h",experiment="e",run_id="r1"}'] == 100.0


def test_the_first_hour_baseline_freezes_after_an_hour_and_rises_reset_on_a_fall(tmp_path):
    from training.signals import Signals

    now = [1000.0]
    path = tmp_path / "s.prom"
    signals = Signals({"run_id": "r", "experiment": "e", "config_hash": "h"}, textfile=str(path),
                      clock=lambda: now[0])
    for minute, rate in ((10, 100.0), (50, 200.0), (70, 10.0)):
        now[0] = 1000.0 + minute * 60
        signals.observe(minute, {"tokens_per_s": rate})
    for step, val in enumerate((3.0, 3.5, 3.6, 3.7), start=100):
        signals.observe(step, {"val_loss": val})
    got = {k.split("{")[0]: v for k, v in scrape(path.read_text()).items()}
    assert got["mlops_train_first_hour_tokens_per_second"] == 150.0 and got["mlops_train_tokens_per_second"] == 10.0
    assert got["mlops_train_val_loss_rises"] == 3
    signals.observe(104, {"val_loss": 3.0})
    assert scrape(path.read_text())['mlops_train_val_loss_rises{config_hash="h",experiment="e",run_id="r"}'] == 0


def test_no_signals_without_a_textfile_or_a_pushgateway():
    from training.signals import open_signals

    prep = SimpleNamespace(cfg=SimpleNamespace(run=SimpleNamespace(experiment="e")), config_hash="h")
    assert open_signals(SimpleNamespace(textfile=None, pushgateway=None), "r", prep) is None
    assert open_signals(None, "r", prep) is None


def test_the_pushgateway_gets_the_gauges_grouped_by_run_id(tmp_path):
    from training.signals import PUSH_JOB, Signals

    got = []

    class Gateway(BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802 - http.server's name
            got.append((self.path, self.rfile.read(int(self.headers["Content-Length"])).decode()))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        signals = Signals({"run_id": "r9", "experiment": "e", "config_hash": "h"},
                          pushgateway=f"127.0.0.1:{server.server_port}")
        signals.observe(3, {"loss": 2.0, "grad_norm": 0.5})
    finally:
        server.shutdown()
        server.server_close()
    path, body = got[-1]
    assert path == f"/metrics/job/{PUSH_JOB}/run_id/r9"
    assert 'mlops_train_grad_norm{config_hash="h",experiment="e",run_id="r9"} 0.5' in body
