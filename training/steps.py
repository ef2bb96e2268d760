"""One optimizer step (micro steps, guards before the update, a finiteness check after it) and one validation
pass. The step's single all-reduce also carries the stop notice, so every rank stops after the same step."""

from __future__ import annotations

import math
import time

from training.guards import TrainingStopped, check_finite, check_weights
from training.stopping import STOP


def run_step(run, window) -> dict:
    """Forward/backward over the step's micro batches, check loss and grad norm, then update (or stop)."""
    import torch
    import torch.distributed as dist

    from training.engine import grad_norm_before_step

    engine, t, dev = run.engine, run.t, run.world.device
    step = run.step + 1
    started, cpu_started = time.perf_counter(), time.process_time()
    batch = run.batches.next_step(all_ids=run.rank0)
    loss_sum = torch.zeros((), dtype=torch.float64)
    objective = run.objective
    stat_sums = torch.zeros(len(objective.stat_names), dtype=torch.float64)
    tokens = 0
    if t.debug.sigterm_at_step == step and run.rank0:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice reaching one rank mid-step
    for j, mb in enumerate(batch.micro):
        loss, stats = objective.micro_loss(engine, mb, dev)
        if stats is not None:
            stat_sums += stats
        if t.debug.nan_at_step == step:
            loss = loss * float("nan")
        if t.debug.spike_at_step == step:
            loss = loss * 1e4
        engine.backward(loss)
        loss_sum += loss.detach().double().cpu()
        tokens += mb.tokens
        if j < len(batch.micro) - 1:
            engine.step()  # not a boundary: DeepSpeed only counts the micro step
    grad_norm = grad_norm_before_step(engine)
    want_save = bool(t.checkpoint.every_seconds and time.monotonic() - run.last_save >= t.checkpoint.every_seconds)
    stats = torch.cat([torch.tensor([float(loss_sum) / len(batch.micro), float(tokens), float(want_save),
                                     float(STOP.requested)], dtype=torch.float64), stat_sums]).to(dev)
    dist.all_reduce(stats)  # one collective a step (nccl reduces device tensors only)
    stats = stats.cpu()
    loss_value = float(stats[0]) / run.world.size
    ok, reason = check_finite(loss_value, grad_norm)
    if ok:
        ok, reason = run.spike.check(grad_norm)
    if not ok:
        incident(run, step, reason, batch, loss_value, grad_norm)
    lr = float(engine.get_lr()[0])
    if t.debug.inf_lr_at_step == step:
        for group in engine.optimizer.param_groups:
            group["lr"] = float("inf")
    engine.step()
    from training.dpo import step_metrics

    extra = step_metrics(stats[4:], objective.stat_names)
    if t.guards.finite_weights:
        ok, reason, norm = check_weights(engine, dev)
        if not ok:
            incident(run, step, reason, batch, loss_value, grad_norm, applied=True)
        extra["param_norm"] = norm
    run.spike.accept(grad_norm)
    run.step = step
    run.tokens_seen += int(stats[1])
    run.losses.append(loss_value)
    seconds = time.perf_counter() - started
    run.step_tokens += int(stats[1])
    run.step_seconds += seconds
    window.add(tokens=int(stats[1]), seconds=seconds, loss=loss_value, grad_norm=grad_norm, lr=lr,
               data_wait_s=batch.wait_s, **extra)
    if run.trace is not None:
        run.trace.write({"step": step, "loss": loss_value.hex(), "grad_norm": float(grad_norm).hex(), "lr": lr,
                         "position": batch.start, "step_s": seconds,
                         "step_cpu_s": time.process_time() - cpu_started, "samples": batch.step_sample_ids})
    return {"save": stats[2] > 0, "preempt": stats[3] > 0}


def incident(run, step: int, reason: str, batch, loss: float, grad_norm: float, *, applied: bool = False):
    """Stop: write the incident, fail the run, raise. No checkpoint follows, so the last good one stays the
    newest. `applied`: the step was taken (its weights are not finite) rather than refused."""
    import json

    from mlops.lineage import Tag

    run.saver.wait()
    last_good = run.saver.last_complete
    record = {
        "step": step,
        "reason": reason,
        "loss": repr(loss),
        "grad_norm": repr(grad_norm),
        "sample_ids": batch.step_sample_ids,
        "data_position": batch.start,
        "last_metrics": run.last_metrics,
        "last_good_checkpoint": str(last_good) if last_good else None,
        "run_id": run.tracker.run_id,
        "step_applied": applied,
    }
    when = f"after optimizer step {step}, before any checkpoint of it" if applied else f"before optimizer step {step}"
    resume = (f"then rerun with train.checkpoint.dir={last_good.parent}: it resumes from {last_good.name} with the "
              "change applied and recorded in resume.json") if last_good else "then rerun: no checkpoint was written yet"
    message = (f"training stopped {when}: {reason}. Last good checkpoint: {last_good or 'none'}. Fix: inspect the "
               f"incident's sample ids, lower train.lr (now {run.t.lr:g}) or raise train.warmup_steps, {resume}.")
    if run.rank0:
        folder = run.prep.ckpt_dir / "incidents"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"step-{step:08d}.json").write_text(json.dumps(record, indent=2, default=str))
        run.tracker.log_dict(record, "incident.json")
        if run.trace is not None:
            run.trace.flush()
            run.tracker.log_artifact(run.trace.path, "trace")
        run.tracker.set_tags({Tag.STOP_REASON: reason})
        run.tracker.close("FAILED", reason=message[:4000])
    raise TrainingStopped(message)


def validate(run) -> dict:
    """Validation loss (token-weighted over the split, all ranks) and perplexity; DPO runs: validate_pairs."""
    import torch

    from training.data_loader import validation_batches

    if run.t.objective == "dpo":
        return validate_pairs(run)
    engine, dev = run.engine, run.world.device
    total = torch.zeros(2, dtype=torch.float64)
    engine.eval()
    batches = validation_batches(run.val_reader, micro=run.prep.micro, world=run.world.size,
                                 rank=run.world.rank, limit=run.t.eval_samples, max_len=run.t.max_seq_len)
    if run.t.zero_stage == 3:
        batches = same_count(list(batches), dev)
    with torch.no_grad():
        for mb in batches:
            n = int((mb.labels[:, 1:] != -100).sum()) if mb is not None else 0
            if n == 0 and run.t.zero_stage != 3:
                continue
            ids = mb.input_ids if mb is not None else torch.zeros((1, 2), dtype=torch.long)
            mask = mb.attention_mask if mb is not None else torch.ones_like(ids)
            out = engine.module(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                                labels=(mb.labels if mb is not None else ids).to(dev))
            if n:
                total += torch.tensor([float(out.loss) * n, n], dtype=torch.float64)
    engine.train()
    total = summed_over_ranks(total, dev)
    if total[1] == 0:
        return {}
    val_loss = float(total[0] / total[1])
    return {"val_loss": val_loss, "val_perplexity": math.exp(min(val_loss, 50.0))}


def validate_pairs(run) -> dict:
    """DPO validation over the held-out pairs (all ranks): the mean DPO loss as val_loss, with the pairs' reward
    accuracy, margin, rewards and log-probabilities."""
    import torch

    from training.data_loader import validation_batches
    from training.dpo import step_metrics
    from training.pairs import to_pair_tensors

    engine, dev, objective = run.engine, run.world.device, run.objective
    if not len(run.val_reader):
        return {}
    batches = list(validation_batches(run.val_reader, micro=run.prep.micro, world=run.world.size, rank=run.world.rank,
                                      limit=run.t.eval_samples, max_len=run.t.max_seq_len, collate=to_pair_tensors))
    if run.t.zero_stage == 3:
        batches = same_count(batches, dev)
    # A padding batch runs the same forwards as a real one (ZeRO-3 lockstep) and counts nothing.
    filler = to_pair_tensors([run.val_reader.get(0)], run.t.max_seq_len)
    total = torch.zeros(1 + len(objective.stat_names), dtype=torch.float64)
    engine.eval()
    with torch.no_grad():
        for mb in batches:
            loss, stats = objective.micro_loss(engine.module, mb or filler, dev, "validation")
            if mb is not None:
                total += torch.cat([torch.tensor([float(loss) * len(mb.sample_ids)], dtype=torch.float64), stats])
    engine.train()
    total = summed_over_ranks(total, dev)
    if total[1] == 0:
        return {}
    means = step_metrics(total[1:], objective.stat_names)
    return {"val_loss": float(total[0] / total[1]), **{"val_" + k.removeprefix("dpo_"): v for k, v in means.items()}}


def summed_over_ranks(total, device: str):
    """An evaluation's sums over every rank (nccl reduces device tensors only), back on the CPU."""
    import torch.distributed as dist

    total = total.to(device)
    dist.all_reduce(total)
    return total.cpu()


def same_count(batches: list, device: str) -> list:
    """Under ZeRO-3 every forward gathers the weights from all ranks, so every rank must run as many forwards:
    a rank with fewer validation batches pads with None (a forward that counts nothing)."""
    import torch
    import torch.distributed as dist

    most = torch.tensor([len(batches)], device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return batches + [None] * (int(most.item()) - len(batches))
