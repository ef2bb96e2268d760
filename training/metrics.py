"""What a run costs and how fast it goes: parameter counts, FLOPs, memory plan, MFU, windowed metrics.

FLOPs per token for a matmul weight: forward 2, backward 2 for the input gradient and 2 more for the weight
gradient. A trainable weight costs 6, a frozen one (LoRA's base model) 4: its weight gradient is never formed.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass

_PEAK_CACHE: dict[tuple[str, int], float] = {}


@dataclass(frozen=True)
class ParamCounts:
    total: int
    trainable: int
    matmul_trainable: int  # weights of Linear layers (incl. the LM head) that train
    matmul_frozen: int

    @property
    def frozen(self) -> int:
        return self.total - self.trainable


def count_params(model) -> ParamCounts:
    import torch

    seen: set[int] = set()
    total = trainable = mm_train = mm_frozen = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    counted: set[int] = set()
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Linear) and weight is not None and id(weight) not in counted:
            counted.add(id(weight))
            if weight.requires_grad:
                mm_train += weight.numel()
            else:
                mm_frozen += weight.numel()
    return ParamCounts(total, trainable, mm_train, mm_frozen)


def flops_per_token(counts: ParamCounts, *, layers: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 per trainable and 4 per frozen matmul weight, plus attention scores."""
    attention = 12 * layers * hidden * seq_len  # QK^T and AV, forward and backward
    return 6 * counts.matmul_trainable + 4 * counts.matmul_frozen + attention


def memory_plan(counts: ParamCounts, *, zero_stage: int, world: int, micro: int, seq_len: int, layers: int,
                hidden: int, heads: int, vocab: int, bytes_per: int = 4) -> dict[str, float]:
    """Estimated peak bytes per process: weights, gradients, AdamW state, activations (fp32)."""
    weights = counts.total * bytes_per
    grads = counts.trainable * bytes_per / (world if zero_stage >= 2 else 1)
    # AdamW keeps two moments; ZeRO >= 1 also keeps a flat fp32 copy of the trainable partition.
    optim = counts.trainable * bytes_per * (2 if zero_stage == 0 else 3) / (world if zero_stage >= 1 else 1)
    # Per layer (Korthikanti et al. 2022, doubled for fp32), plus logits, their softmax and gradient.
    activations = (micro * seq_len * hidden * layers * (34 + 5 * heads * seq_len / hidden) * bytes_per / 2
                   + 3 * micro * seq_len * vocab * bytes_per)
    total = weights + grads + optim + activations
    return {"weights": weights, "gradients": grads, "optimizer": optim, "activations": activations, "total": total}


def checkpoint_bytes(counts: ParamCounts, *, mode: str, zero_stage: int) -> int:
    """Bytes one checkpoint takes on disk across all ranks (LoRA saves only trainable weights)."""
    module = (counts.trainable if mode == "lora" else counts.total) * 4
    optim = counts.trainable * 4 * (2 if zero_stage == 0 else 3)
    return int(module + optim + 64 * 1024)


def measured_peak_flops(device: str = "cpu") -> float:
    """fp32 matmul FLOP/s of this machine at the current thread count (measured once per process)."""
    import torch

    key = (device, torch.get_num_threads())
    if key in _PEAK_CACHE:
        return _PEAK_CACHE[key]
    n = 1024
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    for _ in range(3):
        a @ b
    if device != "cpu":
        torch.cuda.synchronize()
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < 0.5:
        a @ b
        runs += 1
    if device != "cpu":
        torch.cuda.synchronize()
    _PEAK_CACHE[key] = 2 * n**3 * runs / (time.perf_counter() - started)
    return _PEAK_CACHE[key]


def peak_memory_bytes(device: str = "cpu") -> float:
    if device != "cpu":
        import torch

        return float(torch.cuda.max_memory_allocated())
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


class Window:
    """Sums per-step values between two logging points; `flush` returns their means and rates."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.sums: dict[str, float] = {}
        self.tokens = 0
        self.seconds = 0.0

    def add(self, *, tokens: int, seconds: float, **values: float) -> None:
        self.steps += 1
        self.tokens += tokens
        self.seconds += seconds
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)

    def flush(self, *, flops_per_token: float, peak_flops: float, device: str) -> dict[str, float]:
        if not self.steps:
            return {}
        out = {k: v / self.steps for k, v in self.sums.items()}
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        out.update(
            tokens_per_s=rate,
            step_time_s=self.seconds / self.steps,
            mfu=rate * flops_per_token / peak_flops if peak_flops else 0.0,
            peak_memory_bytes=peak_memory_bytes(device),
        )
        self.reset()
        return {k: v for k, v in out.items() if math.isfinite(v)}


class NullTracker:
    """What ranks other than 0 log to: nothing. Only rank 0 talks to the tracking store."""

    def __init__(self, run_id: str = "none") -> None:
        self.run_id = run_id

    # Spelled out, method by method: a misspelled call must fail here as it would on a real tracker.
    def log_params(self, params) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        pass

    log = log_metrics

    def set_tags(self, tags) -> None:
        pass

    def delete_tags(self, keys) -> None:
        pass

    def log_artifact(self, path, artifact_path=None) -> None:
        pass

    def log_dict(self, obj, name) -> None:
        pass

    def log_text(self, text, name) -> None:
        pass

    def log_input(self, name, digest, source, context="training") -> None:
        pass

    def log_hf_model(self, hf_dir, name="model", metadata=None) -> None:
        return None

    def flush(self) -> None:
        pass

    def close(self, status="FINISHED", reason=None) -> None:
        pass
