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
    largest_trainable: int = 0  # the largest trainable tensor (the optimizer's temporaries follow it); 0: unknown

    @property
    def frozen(self) -> int:
        return self.total - self.trainable


def count_params(model) -> ParamCounts:
    import torch

    seen: set[int] = set()
    total = trainable = mm_train = mm_frozen = largest = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += _numel(p)
        if p.requires_grad:
            trainable += _numel(p)
            largest = max(largest, _numel(p))
    counted: set[int] = set()
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Linear) and weight is not None and id(weight) not in counted:
            counted.add(id(weight))
            if weight.requires_grad:
                mm_train += _numel(weight)
            else:
                mm_frozen += _numel(weight)
    return ParamCounts(total, trainable, mm_train, mm_frozen, largest)


def _numel(p) -> int:
    """Elements of a parameter, also when ZeRO-3 has partitioned it (its local tensor is then empty) and when
    bitsandbytes packs it in 4 bits (two weights per stored byte: the matrix's shape is in its quant state)."""
    shape = getattr(getattr(p, "quant_state", None), "shape", None)
    if shape is not None:
        return math.prod(shape)
    return int(getattr(p, "ds_numel", p.numel()))


def decoder_layer_params(counts: ParamCounts, config) -> int:
    """One decoder layer's matmul weights (the LM head aside): what ZeRO-3 gathers at a time."""
    matmul = counts.matmul_trainable + counts.matmul_frozen
    return max(0, matmul - config.vocab_size * config.hidden_size) // max(1, config.num_hidden_layers)


def flops_per_token(counts: ParamCounts, *, layers: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 per trainable and 4 per frozen matmul weight, plus attention scores.

    Attention: QK^T and AV cost 4 * hidden FLOPs per (query, key) pair forward, 12 with backward. Under the
    causal mask a token of a `seq_len` sequence sees (seq_len + 1) / 2 keys on average, and causal kernels
    (SDPA, flash) skip the masked half, so counting the full square would overstate the work by 2x."""
    attention = 12 * layers * hidden * (seq_len + 1) / 2
    return 6 * counts.matmul_trainable + 4 * counts.matmul_frozen + attention


def forward_flops_per_token(counts: ParamCounts, *, layers: int, hidden: int, seq_len: int) -> float:
    """Forward-only FLOPs per token (2 per matmul weight, causal attention forward): DPO's reference pass."""
    return 2 * (counts.matmul_trainable + counts.matmul_frozen) + 4 * layers * hidden * (seq_len + 1) / 2


def dpo_shape(t) -> tuple[int, bool, bool]:
    """(sequences per sample, reference forward in every step, reference pass once before training) of a run:
    a DPO pair is two sequences; its reference runs per step with the adapters off, or once up front."""
    reference = t.dpo_reference()
    return (2 if reference else 1), reference == "adapters_off", reference == "precomputed"


PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
REDUCE_BUCKET = 500_000_000  # DeepSpeed 0.19.8's ZeRO-0 all-reduce bucket (fixed), in elements
MIN_BUCKET = 1 << 20  # below ~1M elements per collective, call overhead dominates (gloo and nccl alike)
OFFLOADS = ("none", "optimizer", "optimizer_and_params")
DEEPSPEED_REUSE_DISTANCE = 1_000_000_000  # DeepSpeed's stage3_max_reuse_distance default, in elements
ZERO_SIZE_KEYS = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                  "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance")


def zero_sizes(zero_stage: int, hidden: int, layer_params: int, overrides: dict | None = None, *,
               mode: str = "full") -> dict[str, int]:
    """DeepSpeed's ZeRO buffer sizes for one model shape, in elements; `overrides` (train.deepspeed.extra's
    zero_optimization) win. The trainer writes these into the DeepSpeed config and the plan counts them.

    DeepSpeed's defaults (5e8-element buckets, 1e9 live and reuse distance) are sized for no model in
    particular: on a model under 1e9 parameters ZeRO-3 keeps every gathered weight until the step ends (its
    reuse distance spans the whole forward and backward), so the per-rank weight memory was the whole model's.
    Sized from the shape, as transformers' "auto" values do: buckets of hidden^2 (at least MIN_BUCKET), a
    weight stays gathered only while it is reused within one layer's weights, and at most two layers' weights
    are gathered ahead.

    QLoRA keeps DeepSpeed's defaults: its 4-bit base is frozen and never partitioned (see the planner's
    qlora_memory), and with the base's small quantized tensors and the adapters partitioned and fetched one by
    one, ZeRO-3's fetch trace broke between steps (measured: "tracing error at step N", DeepSpeed 0.19.8 with
    bitsandbytes 0.50.2); only the overrides apply."""
    if zero_stage < 1:
        return {}
    bucket = max(MIN_BUCKET, hidden * hidden)
    sizes = {} if mode == "qlora" else {"reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
    if zero_stage == 3 and mode != "qlora":
        sizes.update({"stage3_prefetch_bucket_size": max(MIN_BUCKET, int(0.9 * hidden * hidden)),
                      "stage3_param_persistence_threshold": 10 * hidden,
                      "stage3_max_live_parameters": max(2 * layer_params, bucket),
                      "stage3_max_reuse_distance": layer_params})
    for key, value in (overrides or {}).items():
        if key in ZERO_SIZE_KEYS and (zero_stage == 3 or not key.startswith("stage3_")):
            sizes[key] = int(value)
    return sizes


def memory_plan(counts: ParamCounts, *, zero_stage: int, world: int, micro: int, seq_len: int, layers: int,
                hidden: int, heads: int, vocab: int, precision: str = "fp32", offload: str = "none",
                checkpointing: bool = False, score_matrices: bool = True, layer_params: int = 0,
                gpu: bool | None = None, zero_overrides: dict | None = None, mode: str = "full") -> dict[str, float]:
    """Estimated peak bytes per process on its device (weights, gradients, AdamW state, activations) and in
    host memory (what ZeRO-Offload moves there).

    Precision: fp32 keeps everything in 4 bytes. bf16/fp16 (DeepSpeed mixed precision) keep weights and
    gradients in 2 bytes and an fp32 master copy plus both AdamW moments (12 bytes per trainable weight).
    ZeRO-1 partitions the optimizer state over the ranks, ZeRO-2 the gradients too, ZeRO-3 the weights too
    (a rank then holds its shard plus the gathered layers in flight: the current and the prefetched one).
    Bucket and gather sizes are `zero_sizes`' (the trainer's, with `zero_overrides` applied).
    `score_matrices`: eager attention stores the (heads x seq x seq) scores; SDPA/flash kernels do not.
    `checkpointing` keeps each layer's input and recomputes one layer's activations at a time in backward.
    """
    w = PRECISION_BYTES[precision]
    weights = counts.total * w
    host = 0.0
    sizes = zero_sizes(zero_stage, hidden, layer_params, zero_overrides, mode=mode)
    if zero_stage == 3:
        # DeepSpeed keeps a gathered weight while it is reused within stage3_max_reuse_distance weights (with its
        # 1e9 default, a smaller model stays wholly gathered: measured, SmolLM2 at ZeRO-3 then peaked above
        # ZeRO-0). At the step's peak (the loss's backward) the LM head is gathered beside the prefetched layer.
        lm_head = vocab * hidden
        live = max(2 * layer_params, lm_head + layer_params,
                   min(counts.total, sizes.get("stage3_max_reuse_distance", DEEPSPEED_REUSE_DISTANCE))) * w
        host += weights / world if offload == "optimizer_and_params" else 0.0
        weights = live + (0.0 if offload == "optimizer_and_params" else weights / world)
    grads = counts.trainable * w / (world if zero_stage >= 2 else 1)
    if world > 1:
        # DeepSpeed reduces gradients through a flat bucket in the gradient dtype (ZeRO-0's all-reduce: 5e8
        # elements, fixed; ZeRO-1/2/3: reduce_bucket_size): a second copy of up to that many gradients at the
        # step's peak (measured on SmolLM2 at ZeRO-0: +1.0x its fp32 gradients). ZeRO-3 allocates its bucket
        # whole up front; on a GPU that is all resident, on a CPU only the pages written. `gpu` defaults to "no
        # score matrices", as both callers (the planner and the in-run plan) pass score_matrices=not gpu.
        gpu = (not score_matrices) if gpu is None else gpu
        bucket = sizes.get("reduce_bucket_size", REDUCE_BUCKET)
        grads += (bucket if zero_stage == 3 and gpu else min(counts.trainable, bucket)) * w
    # fp32 AdamW keeps two moments; ZeRO >= 1 also keeps a flat fp32 copy of the trainable partition. Mixed
    # precision always keeps the fp32 master copy beside the moments.
    per_weight = 12 if precision != "fp32" or zero_stage >= 1 else 8
    optim = counts.trainable * per_weight / (world if zero_stage >= 1 else 1)
    if offload != "none":
        host, optim = host + optim, 0.0
    step, step_host = _optimizer_step(counts, zero_stage=zero_stage, world=world, precision=precision,
                                      offload=offload, gpu=(not score_matrices) if gpu is None else gpu, vocab=vocab,
                                      hidden=hidden)
    host += step_host
    # Per layer (Korthikanti et al. 2022, for 2-byte activations; fp32 doubles them), plus the logits in float32
    # (the loss upcasts them in every precision) four times at the peak, in log_softmax's backward: the logits
    # (held by the output), the saved log-probabilities, the incoming gradient and the outgoing one. Measured
    # (benchmarks/bench_train.py, a model whose logits dominate): forward+backward peaks at 4.0x the logits.
    scores = 5 * heads * seq_len / hidden if score_matrices else 0.0
    per_layer = micro * seq_len * hidden * (34 + scores) * w / 2
    kept = layers * micro * seq_len * hidden * w + per_layer if checkpointing else layers * per_layer
    activations = kept + 4 * micro * seq_len * vocab * 4
    backward = weights + grads + optim + activations
    if zero_stage == 3:  # the step starts by releasing every gathered weight: a rank holds its shards then
        weights_at_step = 0.0 if offload == "optimizer_and_params" else counts.total * w / world
    else:
        weights_at_step = weights
    at_step = weights_at_step + optim + step
    return {"weights": weights, "gradients": grads, "optimizer": optim, "activations": activations,
            "step": step, "total": max(backward, at_step), "host": host}


def _optimizer_step(counts: ParamCounts, *, zero_stage: int, world: int, precision: str, offload: str, gpu: bool,
                    vocab: int, hidden: int) -> tuple[float, float]:
    """(device, host) bytes the optimizer step holds beside the weights and the optimizer state: where ZeRO-1/2/3
    and mixed precision peak (benchmarks/bench_train.py records the peak per phase; SmolLM2 at 2 ranks peaked in
    the step at ZeRO-2 and ZeRO-3 in fp32 and bf16, and at ZeRO-0 in bf16).

    - ZeRO-1/2/3 flatten this rank's averaged gradients into one fp32 partition for the optimizer (4 bytes per
      trainable weight / world); ZeRO-3 also keeps its gradient partition buffer (in the gradient dtype) for the
      whole run. ZeRO-0 keeps the module's gradients, and mixed precision an fp32 copy of each beside them.
    - torch AdamW's temporaries (sqrt of the second moment, then its bias-corrected quotient): on a CPU the
      single-tensor path holds two copies of the tensor in hand (ZeRO-1/2/3: the flat partition; ZeRO-0: the
      largest weight); on a GPU the foreach path holds one for the whole group (measured on this CPU: 2.0x a flat
      256 MiB tensor)."""
    part = counts.trainable / (world if zero_stage >= 1 else 1)
    w = PRECISION_BYTES[precision]
    if zero_stage >= 1:
        grads = 4 * part + (w * part if zero_stage == 3 else 0.0)
        in_hand = part
    else:
        grads = counts.trainable * w + (4 * counts.trainable if precision != "fp32" else 0.0)
        in_hand = counts.largest_trainable or min(counts.trainable, vocab * hidden)
    temporaries = 4 * (part if gpu else 2 * in_hand)
    if offload != "none" and zero_stage >= 1:  # the flat fp32 partition and the step live in host memory
        return grads - 4 * part, 4 * part + 4 * 2 * in_hand
    return grads + temporaries, 0.0


def checkpoint_bytes(counts: ParamCounts, *, mode: str, zero_stage: int) -> int:
    """Bytes one checkpoint takes on disk across all ranks (LoRA and QLoRA save only trainable weights)."""
    module = (counts.trainable if mode in ("lora", "qlora") else counts.total) * 4
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

    def charge(self, seconds: float) -> None:
        """Time the run spent between steps on its own work (in-run eval): it counts in step time and tokens/s."""
        self.seconds += seconds

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

    def watch_system(self, interval: float):
        return lambda: None

    def close(self, status="FINISHED", reason=None) -> None:
        pass
