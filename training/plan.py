"""Plan before spending: FLOPs, peak memory and wall time, logged before the first optimizer step.

The wall-time estimate comes from a short measured warm-up (forward and backward on real batches) taken
before DeepSpeed wraps the model; RNG state is restored and gradients dropped afterwards, so the warm-up
leaves no trace in the run's numbers.
"""

from __future__ import annotations

import time

import numpy as np

from training.metrics import (
    count_params,
    decoder_layer_params,
    dpo_shape,
    flops_per_token,
    forward_flops_per_token,
    measured_peak_flops,
    memory_plan,
)


def lengths(reader, max_len: int | None, probe: int = 256) -> tuple[float, int]:
    """(mean, max) real tokens per sample over the first samples of the split, after any `max_len` cut.
    Batches are cut to their longest sample, so these, not the padded seq_len, drive cost and memory."""
    n = min(probe, len(reader))
    if not n:
        return float(reader.seq_len), reader.seq_len
    real = [int(np.flatnonzero(reader.get(i).attention_mask)[-1]) + 1 if reader.get(i).attention_mask.any() else 0
            for i in range(n)]
    cap = min(max_len or reader.seq_len, reader.seq_len)
    real = [min(r, cap) for r in real]
    return float(np.mean(real)), max(max(real), 1)


def warmup_step_seconds(model, micro_batch, accum: int, device: str, repeats: int = 2, objective=None) -> float:
    """Measured seconds of one optimizer step's forward/backward work (the run's own objective: DPO's includes
    its per-step reference forward), leaving RNG and gradients untouched."""
    import torch

    from training.checkpoint import rng_state, set_rng_state
    from training.dpo import SftObjective

    saved = rng_state()
    model.train()
    objective = objective or SftObjective()
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        objective.micro_loss(model, micro_batch, device)[0].backward()
        times.append(time.perf_counter() - started)
    for p in model.parameters():
        p.grad = None
    set_rng_state(saved)
    if device != "cpu":
        torch.cuda.synchronize()
    return float(min(times[1:])) * accum  # the first pass pays one-off allocation costs


def make_plan(model, prep, reader, micro_batch, device: str, *, measure: bool = True) -> dict:
    t = prep.train
    mc = model.config
    layers, hidden = mc.num_hidden_layers, mc.hidden_size
    mean_len, max_len = lengths(reader, t.max_seq_len)
    counts = count_params(model)
    rows, per_step_reference, reference_pass = dpo_shape(t)
    shape = {"layers": layers, "hidden": hidden, "seq_len": round(mean_len)}
    train_fpt = flops_per_token(counts, **shape)
    reference_fpt = forward_flops_per_token(counts, **shape)
    fpt = train_fpt + (reference_fpt if per_step_reference else 0.0)
    tokens = t.max_steps * prep.global_batch * rows * mean_len
    seq = max_len
    layer_params = decoder_layer_params(counts, mc)
    memory = memory_plan(counts, zero_stage=t.zero_stage, world=prep.world_size, micro=prep.micro * rows, seq_len=seq,
                         layers=layers, hidden=hidden, heads=mc.num_attention_heads, vocab=mc.vocab_size,
                         precision=prep.precision, offload=t.offload, checkpointing=t.activation_checkpointing,
                         layer_params=layer_params, score_matrices=device == "cpu",  # as the planner assumes
                         zero_overrides=t.deepspeed.extra.get("zero_optimization"), mode=t.mode)
    if t.mode == "qlora":  # the 4-bit base's bytes, as the planner counts them before the job
        from training.planner import qlora_memory

        memory = qlora_memory(memory, counts, prep.precision, mc.vocab_size * hidden, layer_params)
    peak = t.peak_flops or measured_peak_flops(device)
    plan = {
        "params_total": counts.total,
        "params_trainable": counts.trainable,
        "params_frozen": counts.frozen,
        "matmul_params_trainable": counts.matmul_trainable,
        "matmul_params_frozen": counts.matmul_frozen,
        "flops_per_token": fpt,
        "tokens_planned": tokens,
        "flops_total": fpt * tokens,
        "peak_flops": peak,
        **{f"memory_{k}_bytes": v for k, v in memory.items()},
    }
    # A precomputed reference is one forward over every pair of both splits, before the first step.
    reference_tokens = _all_rows(reader) * mean_len if reference_pass else 0.0
    if reference_pass:
        plan.update(dpo_reference_tokens=reference_tokens, dpo_reference_flops=reference_fpt * reference_tokens)
    if measure:
        from training.inrun_eval import planned_seconds

        step_s = warmup_step_seconds(model, micro_batch, prep.accum, device, objective=_timing_objective(t))
        rate = prep.global_batch * rows * mean_len / step_s
        evals = planned_seconds(prep.suites, t.eval, t.max_steps, rate)
        reference_s = reference_tokens * reference_fpt / (rate * fpt) if reference_pass else 0.0
        plan.update(warmup_step_s=step_s, inrun_eval_s=evals, dpo_reference_s=reference_s,
                    wall_time_s=step_s * t.max_steps + evals + reference_s)
    return plan


class _NoReference:
    """Stands in for a precomputed reference in the warm-up (it is a lookup, not compute, in every step)."""

    def logps(self, model, mb, device, split):
        import torch

        return torch.zeros(2 * len(mb.sample_ids), dtype=torch.float64)


def _timing_objective(t):
    from training.dpo import objective_for

    return objective_for(t, _NoReference() if t.dpo_reference() == "precomputed" else None)


def _all_rows(reader) -> int:
    """Rows of both splits (the reader is the training split's)."""
    from mlops.data.format import SnapshotReader

    return len(reader) + len(SnapshotReader(reader.folder, "validation"))


def describe(plan: dict) -> str:
    gib = 2**30
    wall = plan.get("wall_time_s")
    return (
        f"plan: {plan['params_trainable']:,} trainable of {plan['params_total']:,} params; "
        f"{plan['flops_total']:.3g} FLOPs over {plan['tokens_planned']:.3g} tokens; "
        f"peak memory ~{plan['memory_total_bytes'] / gib:.2f} GiB/process; "
        + (f"wall time ~{wall / 60:.1f} min (measured warm-up)" if wall is not None else "resumed: no warm-up")
    )
