"""The training stage's core: `train(cfg, tracker, report=...) -> TrainResult`.

One call is one run, callable repeatedly in one process (sweep trials) and identically under torchrun or
the deepspeed launcher (every rank calls it; only rank 0 talks to the tracker). The order of work:
prepare (every check, no compute; takes the checkpoint folder's lock) -> plan (FLOPs, memory, measured
warm-up) -> DeepSpeed engine -> resume (changed settings applied and recorded) -> steps with guards, metrics,
validation and checkpoints -> final model. A stop notice (SIGTERM) ends the loop after the current step with
a checkpoint (training.stopping).
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Callable

from training.config import ADAPTER_MODES
from training.guards import SpikeRule, TrainingStopped
from training.prepare import Prepared, prepare
from training.results import TrainResult
from training.runs import Heartbeat, already_done, open_tracker
from training.stopping import Preempted
from training.trace import TRACE, TraceLog

log = logging.getLogger(__name__)


class StopTraining(Exception):
    """Raised by a `report` callback to end the run cleanly (a pruned sweep trial, for instance)."""


class SimulatedCrash(BaseException):
    """train.debug.crash_after_step: leave like a killed process (no cleanup, run left RUNNING)."""


def train(cfg, tracker=None, *, report: Callable[[int, dict], None] | None = None,
          prepared: Prepared | None = None) -> TrainResult:
    """Train as configured; returns the result, raises TrainingStopped (NaN/spike) or MLOpsError (bad input).

    `tracker` is the run to log to (only used on rank 0); without one, a run is opened, attached to the
    checkpoint's run when resuming. The run is closed with its final status either way.
    """
    from training.consistency import check_ranks
    from training.engine import init_world

    world = init_world(cfg.train.deepspeed.backend if cfg.train else "auto")
    check_ranks(world)  # before any folder, run or collective that a mismatched rank could hang
    prep = prepared or prepare(cfg, world.size)
    run = None
    try:
        if prep.completed is not None:
            return already_done(prep, tracker, world.rank)
        tracker = open_tracker(prep, world.rank, tracker)
        run = _Run(prep, world, tracker, report)
        return run.execute()
    except (SimulatedCrash, TrainingStopped, Preempted):
        raise  # a simulated kill leaves the run as a kill would; the others closed it with their reason
    except BaseException as err:
        from mlops.errors import MLOpsError

        if run is not None:
            reason = str(err) if isinstance(err, MLOpsError) else f"{type(err).__name__}: {err}"
            if isinstance(err, KeyboardInterrupt):
                reason = "interrupted (a second Ctrl-C: stopped at once, without a checkpoint)"
            tracker.close("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED", reason=reason[:4000])
        raise
    finally:
        if run is not None:
            run.release()
        prep.release()


class _Run:
    def __init__(self, prep: Prepared, world, tracker, report) -> None:
        self.prep, self.world, self.tracker, self.report = prep, world, tracker, report
        self.t = prep.train
        self.rank0 = world.rank == 0
        self.engine = None
        self.step = 0
        self.tokens_seen = 0
        self.last_metrics: dict = {}
        self.val: dict = {}
        self.losses: list[float] = []
        self.step_tokens = 0  # tokens and seconds of the steps this process ran (for throughput)
        self.step_seconds = 0.0
        self.trace = None
        self.heartbeat = None
        self.signals = None  # the Prometheus textfile or Pushgateway (train.signals), rank 0 only
        self.last_loss: float | None = None  # the last step's loss before this process (from the checkpoint)
        from training.selection import Selection

        self.selection = Selection.from_config(self.t.select)
        self.evals: dict = {}  # each metric's latest evaluation {name: {"step", "value"}}, in every checkpoint

    # ----------------------------------------------------------------- setup

    def execute(self) -> TrainResult:
        import torch

        from training.data_loader import RankBatches, to_tensors
        from training.engine import build_model, ds_config, initialize
        from training.pairs import open_split, to_pair_tensors

        prep, t, w = self.prep, self.t, self.world
        seed = prep.cfg.run.seed
        self.reader = open_split(prep.snapshot_dir, "train", t.objective)  # pairs for DPO, rows for SFT
        self.val_reader = open_split(prep.snapshot_dir, "validation", t.objective)
        collate = to_pair_tensors if t.objective == "dpo" else to_tensors
        config = ds_config(t, w, micro=prep.micro, accum=prep.accum, universal=prep.universal,
                           precision=prep.precision, shape=_zero_shape(prep.base["path"], t))
        model = build_model(prep.base["path"], t, seed, ds=config)
        _seed_all(seed + w.rank)
        model.to(w.device)
        resuming = prep.resume_from is not None
        first = RankBatches(self.reader, seed=seed, micro=prep.micro, accum=prep.accum, world=w.size,
                            rank=w.rank, max_len=t.max_seq_len, collate=collate).next_step().micro[0]
        from training.plan import describe, make_plan

        # A ZeRO-3 model is partitioned already: it runs forward only inside the engine, so no warm-up there.
        measure = not resuming and t.zero_stage != 3
        self.plan = make_plan(model, prep, getattr(self.reader, "rows", self.reader), first, w.device, measure=measure)
        self._log_start(config)
        if self.rank0:
            print(describe(self.plan), flush=True)
        self.started = time.perf_counter()
        self.engine, _, _ = initialize(model, t, config)
        self.saver = self._saver()
        self.objective = self._objective()
        if self.rank0:
            from training.signals import open_signals

            self.heartbeat = Heartbeat(self.tracker, t.heartbeat_seconds, t.system_metrics_seconds).start()
            self.signals = open_signals(t.signals, self.tracker.run_id, prep)
        if resuming:
            from training.resume import load

            state = load(self)
        else:
            state = {}
        self.batches = RankBatches(self.reader, seed=seed, micro=prep.micro, accum=prep.accum, world=w.size,
                                   rank=w.rank, start=int(state.get("data", {}).get("position", 0)),
                                   max_len=t.max_seq_len, collate=collate)
        self.spike = SpikeRule(t.guards.spike_factor, t.guards.spike_window, t.guards.spike_warmup)
        self.spike.restore(state.get("spike_history"))
        self.selection.restore(state.get("selection"))
        self.evals = dict(state.get("evals") or {})
        self.resume_to_first_step = None
        self.trace = TraceLog.open(prep.ckpt_dir / TRACE, truncate_after=self.step) if self.rank0 else None
        torch.set_grad_enabled(True)
        return self._loop()

    def _objective(self):
        """SFT's loss, or DPO's with its reference: the starting weights' log-probabilities are computed here,
        before any step or resume moves them (full fine-tuning), or the adapters are switched off per step."""
        from training.dpo import objective_for

        reference = None
        if self.t.dpo_reference() == "precomputed":
            from training.dpo_reference import ensure_reference

            reference = ensure_reference(self)
        return objective_for(self.t, reference)

    def _saver(self):
        from training.saver import Saver

        lineage = self.prep.lineage
        fields = {"run_id": self.tracker.run_id, "config_hash": lineage.config_hash, "snapshot_id": lineage.snapshot_id,
                  "image_tag": lineage.image_tag, "git_commit": lineage.git_commit, "git_dirty": lineage.git_dirty,
                  "base_model": lineage.base_model, "base_model_id": lineage.base_model_id, "seed": lineage.seed,
                  "code_version": lineage.code_version, "mode": self.t.mode, "smoke": self.prep.smoke,
                  "config": self.prep.cfg.model_dump(mode="json")}
        return Saver(self.prep.ckpt_dir, rank=self.world.rank, keep_last=self.t.checkpoint.keep_last,
                     keep_every=self.t.checkpoint.keep_every, exclude_frozen=self.t.mode in ADAPTER_MODES,
                     tracker=self.tracker, lineage=fields, kill_in_save_step=self.t.debug.kill_in_save_step)

    def _log_start(self, config: dict) -> None:
        from mlops.config import canonical, resolved_yaml
        from mlops.lineage import Tag

        prep, tr = self.prep, self.tracker
        tags = prep.lineage.as_tags()
        if prep.resume_from is not None:
            from training.resume import summary

            tags[Tag.RESUMED_FROM] = str(prep.resume_from)
            tags[Tag.RESUME_CHANGES] = summary(prep.changes) or "none"
            # A resumed run is running again: the reasons of the stop it resumes from no longer apply.
            tr.delete_tags([Tag.FAILURE_REASON, Tag.STOP_REASON])
        tr.set_tags(tags)
        flat = {k: v for k, v in canonical(self.t).items() if not isinstance(v, dict | list)}
        resumed = {"resumed_from_step": int(prep.resume_manifest.get("step", 0))} if prep.resume_from else {}
        tr.log_params({**{f"train.{k}": v for k, v in flat.items()}, "base_model": prep.base["name"],
                       "world_size": prep.world_size, "grad_accum_effective": prep.accum,
                       "global_batch": prep.global_batch, "seq_len": self.reader.seq_len, **resumed})
        tr.log_text(resolved_yaml(prep.cfg), "config/resolved.yaml")
        tr.log_dict(config, "config/deepspeed.json")
        tr.log_input(prep.snapshot_id, prep.snapshot_id, str(prep.snapshot_dir))
        tr.log_dict(self.plan, "plan.json")
        # Params, not metrics: constants drawn as charts would open the run's Model metrics page above the loss.
        tr.log_params({f"plan.{k}": f"{float(v):.4g}" for k, v in self.plan.items()})

    # ----------------------------------------------------------------- the loop

    def _loop(self) -> TrainResult:
        from training.metrics import Window
        from training.steps import run_step

        t = self.t
        window = Window()
        bar = self._progress()
        self.last_save = time.monotonic()
        from training.saver import any_rank
        from training.stopping import STOP, stop_on_notice

        if any_rank(STOP.requested):  # the notice came during setup: there is no step to finish
            stop_on_notice(self, step_ran=False)
        try:
            while self.step < t.max_steps and not self.selection.stopped:
                out = run_step(self, window)
                if self.resume_to_first_step is None:
                    # From engine setup (and checkpoint load, on a resume) to the end of the first step.
                    self.resume_to_first_step = time.perf_counter() - self.started
                    self.tracker.log_metrics({"start_to_first_step_s": self.resume_to_first_step}, self.step)
                if bar is not None:
                    bar.update(1)
                # Before a preemption's save: its checkpoint must carry this step's evaluation, as an
                # uninterrupted run's would, so the resumed run selects and stops exactly as that one does.
                verdict, stop = self._evaluate(window)
                if self.step % self.prep.cfg.run.log_every == 0 or self.step == t.max_steps or out["preempt"]:
                    self._flush(window, bar)
                if out["preempt"]:
                    stop_on_notice(self)  # raises Preempted
                chosen = verdict is not None and (verdict.improved or verdict.stop is not None)
                if out["save"] or chosen or self.step % t.checkpoint_every == 0 or self.step == t.max_steps:
                    self._save()
                if t.debug.crash_after_step == self.step:
                    self.saver.wait()
                    raise SimulatedCrash(f"train.debug.crash_after_step={self.step}")
                if stop:
                    return self._stopped(stop)
        finally:
            if bar is not None:
                bar.close()
        self.saver.wait()
        from training.final import finish

        return finish(self)

    def _progress(self):
        if not (self.rank0 and self.t.progress):
            return None
        from tqdm import tqdm

        return tqdm(total=self.t.max_steps, initial=self.step, desc="train", unit="step", mininterval=1.0,
                    dynamic_ncols=True)

    def _flush(self, window, bar) -> None:
        # The window's tokens are every rank's (all-reduced), so MFU is over every rank's device, not one.
        metrics = window.flush(flops_per_token=self.plan["flops_per_token"],
                               peak_flops=self.plan["peak_flops"] * self.world.size, device=self.world.device)
        if metrics:
            metrics["tokens_seen"] = float(self.tokens_seen)
            self.last_metrics = metrics
            self.tracker.log_metrics(metrics, self.step)
            if self.signals is not None:
                self.signals.observe(self.step, metrics)
            if bar is not None:
                bar.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{metrics['tokens_per_s']:.0f}", refresh=False)

    def _evaluate(self, window):
        """The evaluations due at this step (validation loss, in-run eval suites), then the selection rule and
        the report callback. Returns (the selection's verdict or None, a report's stop reason or None)."""
        from training.inrun_eval import due, evaluate

        t, step = self.t, self.step
        measured: dict[str, float] = {}
        if due(step, t.eval_every, t.max_steps):
            from training.steps import validate

            self.val = validate(self)
            measured.update(self.val)
        if self.prep.suites and due(step, t.eval.every, t.max_steps):
            scores = evaluate(self, self.prep.suites, t.eval, self.prep.cfg.run.seed)
            window.charge(scores["train_eval_s"])
            measured.update(scores)
        if not measured:
            return None, None
        self.evals.update({name: {"step": step, "value": value} for name, value in measured.items()})
        self.tracker.log_metrics(measured, step)
        if self.signals is not None:
            self.signals.observe(step, measured)
        verdict = self.selection.observe(step, measured)
        if verdict is not None and self.rank0:
            self.tracker.log_metrics({f"best_{self.selection.metric}": self.selection.best_value}, step)
            if verdict.stop:
                print(verdict.stop, flush=True)
        if "val_loss" not in measured:
            return verdict, None
        reason = None
        if self.report is not None:
            try:
                self.report(step, {**self.val, "loss": self.losses[-1] if self.losses else math.nan})
            except StopTraining as err:
                reason = str(err) or f"stopped by report at step {step}"
        return verdict, _agree(reason, self.world.device)

    def final_checkpoint(self):
        """The checkpoint the final model is built from: the selected best, else the last complete one."""
        if self.selection.active and self.selection.best_step is not None:
            from training.checkpoint import tag_for

            return self.prep.ckpt_dir / tag_for(self.selection.best_step)
        return self.saver.last_complete

    def _save(self) -> None:
        from training.checkpoint import gather_rng

        rngs = gather_rng()
        b = self.batches
        data = {"position": b.position, "epoch": b.epoch, "seed": self.prep.cfg.run.seed,
                "global_batch": self.prep.global_batch}
        client = {"step": self.step, "tokens_seen": self.tokens_seen, "data": data, "rng": rngs,
                  "spike_history": self.spike.state(), "world_size": self.world.size, "val": self.val,
                  "selection": self.selection.state(), "evals": self.evals,
                  "loss": self.losses[-1] if self.losses else self.last_loss,
                  "last_metrics": self.last_metrics, "universal_checkpoint_info": {"universal_checkpoint_version": 0.2}}
        fields = {"tokens_seen": self.tokens_seen, "world_size": self.world.size, "zero_stage": self.t.zero_stage,
                  "precision": self.prep.precision, "data": data, "global_batch": self.prep.global_batch,
                  "eval": self.evals, "selection": self.selection.summary() if self.selection.active else None}
        self.saver.protect = self.final_checkpoint() if self.selection.active else None
        self.saver.save(self.engine, self.step, client, fields)
        self.last_save = time.monotonic()
        self.tracker.log_metrics({"checkpoint_save_s": self.saver.last_save_s}, self.step)

    def _stopped(self, reason: str) -> TrainResult:
        from mlops.lineage import Tag

        self.saver.wait()
        self.tracker.set_tags({Tag.STOP_REASON: reason})
        self.tracker.close("FINISHED")
        metrics = {**self.val, "loss": self.losses[-1] if self.losses else math.nan, "steps": self.step}
        return TrainResult(self.tracker.run_id, "STOPPED", self.step, metrics, stopped=True, reason=reason,
                           checkpoint=self.saver.last_complete)

    # ----------------------------------------------------------------- cleanup

    def release(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.signals is not None:
            self.signals.close()
        if self.trace is not None:
            self.trace.close()
        if self.engine is not None:
            try:
                self.engine.destroy()
            except Exception:  # noqa: BLE001 - best effort: the next run builds a fresh engine
                pass
            self.engine = None
        gc.collect()


def _agree(reason: str | None, device: str) -> str | None:
    """Every rank stops if any rank's report asked to."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if reason else 0.0], device=device)
    dist.all_reduce(flag)
    if flag.item() > 0:
        return reason or "stopped by report on another rank"
    return None


def _zero_shape(base_path: str, t) -> tuple[int, int] | None:
    """(hidden size, one decoder layer's weights) from the model built on the meta device: ZeRO sizes its
    buffers from them before the weights exist (under ZeRO-3 they are partitioned as they load)."""
    if t.zero_stage < 1:
        return None
    from training.metrics import count_params, decoder_layer_params
    from training.planner import meta_model

    meta = meta_model(base_path, t)
    return meta.config.hidden_size, decoder_layer_params(count_params(meta), meta.config)


def _seed_all(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
