"""Stop rules: before every optimizer step, non-finite loss or grad norm and grad-norm spikes; after it, that
the weights are still finite (a finite gradient times a huge step size is not).

A rule returns `(ok, reason)` (house style); the trainer stops before the step (or, for the weights, before
any checkpoint of it) when it is not ok.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from mlops.errors import MLOpsError


class TrainingStopped(MLOpsError):
    """A guard stopped the run before an optimizer step; the run is FAILED with the reason and an incident."""

    exit_code = 3


def check_finite(loss: float, grad_norm: float) -> tuple[bool, str]:
    if not math.isfinite(loss):
        return False, f"non-finite loss ({loss})"
    if not math.isfinite(grad_norm):
        return False, f"non-finite grad norm ({grad_norm})"
    return True, ""


def check_weights(engine, device: str) -> tuple[bool, str, float]:
    """(ok, reason, L2 norm of the trainable weights): one fused pass over the weights after the step. Every
    rank holds the whole updated model under ZeRO <= 2; the norms are still all-reduced (one float), so all
    ranks agree on stopping even if one rank's copy went bad alone."""
    import torch
    import torch.distributed as dist

    trainable = [p for p in engine.module.parameters() if p.requires_grad]
    # ZeRO-3 partitions the weights: each rank checks its shard, and the squares add up across ranks.
    sharded = any(hasattr(p, "ds_tensor") for p in trainable)
    params = [(p.ds_tensor if sharded else p).detach().float() for p in trainable]
    if not params:
        return True, "", 0.0
    norms = torch._foreach_norm(params)
    total = torch.linalg.vector_norm(torch.stack(norms)).double().reshape(1)
    if dist.is_initialized() and dist.get_world_size() > 1:
        total = (total**2 if sharded else total).to(device)
        dist.all_reduce(total)  # a sum, not a max: nan propagates through a sum, a max may drop it
        total = total.sqrt() if sharded else total / dist.get_world_size()
    value = float(total.item())
    if not math.isfinite(value):
        return False, f"non-finite weights after the update (weight norm {value})", value
    return True, "", value


class SpikeRule:
    """Stop when the grad norm exceeds `factor` x the running median of the last `window` good steps."""

    def __init__(self, factor: float | None, window: int = 50, warmup: int = 10) -> None:
        self.factor = factor
        self.warmup = warmup
        self.history: deque[float] = deque(maxlen=window)

    def check(self, grad_norm: float) -> tuple[bool, str]:
        if self.factor is None or len(self.history) < max(self.warmup, 1):
            return True, ""
        median = statistics.median(self.history)
        if median > 0 and grad_norm > self.factor * median:
            return False, (
                f"grad norm spike: {grad_norm:.4g} > {self.factor:g} x running median {median:.4g} "
                f"(train.guards.spike_factor)"
            )
        return True, ""

    def accept(self, grad_norm: float) -> None:
        self.history.append(grad_norm)

    def state(self) -> list[float]:
        return list(self.history)

    def restore(self, values: list[float] | None) -> None:
        self.history.clear()
        self.history.extend(values or [])
