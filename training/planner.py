"""`mlops train plan`: what a job costs before it holds a machine. Parameters, tokens, FLOPs, peak memory per rank
and wall time for a config on named hardware, and a verdict: fits or not (and what would make it fit), finishes
before a deadline or not.

Nothing is loaded: the model is built on the meta device from its config.json (LoRA adapters included), so a 70B
plan takes seconds. The formulas are the ones the in-run plan uses (training.metrics): one per quantity.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, replace

from mlops.errors import ConfigError
from training.hardware import USABLE, Hardware
from training.metrics import dpo_shape

MARGIN = 1.2  # the field guides' 20% reserve on wall time: restarts, evaluation, checkpoints, stragglers
LORA_MODES = ("lora", "qlora")
# bitsandbytes NF4 with double quantization: 4 bits per weight, an 8-bit absmax per block of 64 weights, and an
# fp32 constant (plus an fp32 offset) per 256 of those blocks. Without double quantization the absmax is fp32.
NF4_BYTES = 0.5 + 1 / 64 + 8 / (64 * 256)


@dataclass(frozen=True)
class Shape:
    """The levers a verdict may move; everything else about the job is fixed."""

    mode: str
    precision: str
    zero_stage: int
    offload: str
    checkpointing: bool
    micro: int
    world: int

    def overrides(self, other: Shape) -> list[str]:
        keys = {"mode": "train.mode", "precision": "train.precision", "zero_stage": "train.zero_stage",
                "offload": "train.offload", "checkpointing": "train.activation_checkpointing",
                "micro": "train.micro_batch_size", "world": "--gpus"}
        out = []
        for name, key in keys.items():
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                value = str(theirs).lower() if isinstance(theirs, bool) else theirs
                out.append(f"{key} {value}" if key.startswith("--") else f"{key}={value}")
        return out


def _declared(base_path: str) -> dict:
    """The base model's config.json as written (empty when there is none, e.g. a GGUF-only folder)."""
    import json
    from pathlib import Path

    path = Path(base_path) / "config.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path} is not readable JSON ({err}). Fix: restore the base model's config.json (import "
                          "it again: `mlops base-model import`), or point base_model at another folder.") from None


def _architecture_fix(model_type: object, base_path: str, declared: dict, why: str) -> ConfigError:
    import transformers

    said = f"config.json says model_type={model_type!r}" if model_type else "config.json names no model_type"
    custom = " Its own modelling code (auto_map) is not run: trust_remote_code stays off." \
        if declared.get("auto_map") else ""
    return ConfigError(
        f"base model {base_path}: {said}, {why} (transformers "
        f"{transformers.__version__}).{custom} Fix: point base_model at a causal LM whose model_type transformers "
        "knows (e.g. llama, mistral, qwen2), or upgrade transformers if the architecture is newer than this "
        "release (pip install -U transformers)."
    )


def _config(base_path: str):
    """transformers' config for the base model; ConfigError naming the model_type when it knows none."""
    from transformers import CONFIG_MAPPING, AutoConfig

    declared = _declared(base_path)
    model_type = declared.get("model_type")
    if declared and not (isinstance(model_type, str) and model_type in CONFIG_MAPPING):
        why = "an architecture transformers does not know" if model_type else "so its architecture is unknown"
        raise _architecture_fix(model_type, base_path, declared, why)
    try:
        return AutoConfig.from_pretrained(base_path, trust_remote_code=False)
    except ValueError as err:  # a folder without config.json that transformers cannot read either
        raise ConfigError(f"base model {base_path}: transformers cannot read its config ({str(err).splitlines()[0]})."
                          " Fix: point base_model at a Hugging Face model folder with a config.json.") from None


def meta_model(base_path: str, t):
    """The model as training would build it (LoRA wrapper included), on the meta device: shapes, no weights."""
    import torch
    from transformers import AutoModelForCausalLM

    config = _config(base_path)
    config.quantization_config = None  # a GGUF/quantized origin would otherwise ask for its loader
    with torch.device("meta"):
        try:
            model = AutoModelForCausalLM.from_config(config)
        except ValueError:  # an encoder or seq2seq model: no causal-LM class for its config
            raise _architecture_fix(config.model_type, base_path, _declared(base_path),
                                    "an architecture with no causal-LM class (AutoModelForCausalLM)") from None
        if t.mode in LORA_MODES:  # QLoRA's base is quantized at load; its shapes and adapters are LoRA's
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=t.lora.r, lora_alpha=t.lora.alpha, lora_dropout=t.lora.dropout,
                              target_modules=list(t.lora.target_modules), task_type="CAUSAL_LM")
            model = get_peft_model(model, lora)
    return model


def resolve_precision(requested: str | None, hw: Hardware) -> str:
    """train.precision, or its default for the device: bf16 where the GPU has it, fp32 on a CPU."""
    if requested is None:
        return "bf16" if hw.gpu and hw.bf16 else "fp32"
    if requested == "fp16" and not hw.fp16:
        raise ConfigError(
            f"train.precision=fp16 cannot run on {hw.name}: fp16 mixed precision needs a GPU (its dynamic loss "
            "scaling is built for CUDA kernels). Fix: set train.precision=bf16 or fp32 (fp32 is the CPU default)."
        )
    if requested == "bf16" and not hw.bf16:
        raise ConfigError(
            f"train.precision=bf16 cannot run on {hw.name}: the device has no bf16. Fix: set train.precision=fp16 "
            "(dynamic loss scaling) or fp32."
        )
    return requested


class Costing:
    """Memory and FLOPs of one model at one sequence length, for any Shape."""

    def __init__(self, model, t, seq_len: int, mean_len: float, hw: Hardware) -> None:
        from training.metrics import count_params, decoder_layer_params

        mc = getattr(model, "config", None)
        self.counts_lora = count_params(model)
        self.layers, self.hidden = mc.num_hidden_layers, mc.hidden_size
        self.heads, self.vocab = mc.num_attention_heads, mc.vocab_size
        self.seq_len, self.mean_len, self.hw, self.t = seq_len, mean_len, hw, t
        self.layer_params = decoder_layer_params(self.counts_lora, mc)

    def counts(self, shape: Shape):
        from training.metrics import ParamCounts

        c = self.counts_lora
        if shape.mode == self.t.mode or {shape.mode, self.t.mode} <= set(LORA_MODES):
            return c  # QLoRA trains the same adapters as LoRA; only the base's storage differs
        # A suggested switch to LoRA: every base weight frozen, adapters on the target modules (r x (in + out)).
        matmul = c.matmul_trainable + c.matmul_frozen
        adapters = self.t.lora.r * 2 * self.hidden * len(self.t.lora.target_modules) * self.layers
        return ParamCounts(c.total + adapters, adapters, adapters, matmul)

    def memory(self, shape: Shape) -> dict[str, float]:
        from training.metrics import memory_plan

        # On CUDA, SDPA takes the flash / memory-efficient kernels (no score matrices); on a CPU the plan keeps
        # them, as the in-run plan always has.
        counts = self.counts(shape)
        rows = dpo_shape(self.t)[0]  # a DPO micro batch of m pairs runs 2m sequences
        plan = memory_plan(counts, zero_stage=shape.zero_stage, world=shape.world, micro=shape.micro * rows,
                           seq_len=self.seq_len, layers=self.layers, hidden=self.hidden, heads=self.heads,
                           vocab=self.vocab, precision=shape.precision, offload=shape.offload,
                           checkpointing=shape.checkpointing, score_matrices=not self.hw.gpu,
                           layer_params=self.layer_params,
                           zero_overrides=self.t.deepspeed.extra.get("zero_optimization"), mode=shape.mode)
        return qlora_memory(plan, counts, shape.precision, self.vocab * self.hidden, self.layer_params) \
            if shape.mode == "qlora" else plan

    def flops_per_token(self, shape: Shape) -> float:
        """Per trained token, with DPO's reference forward when it runs in every step (adapters off)."""
        from training.metrics import flops_per_token

        model = flops_per_token(self.counts(shape), layers=self.layers, hidden=self.hidden, seq_len=round(self.mean_len))
        return model + (self.reference_flops_per_token(shape) if dpo_shape(self.t)[1] else 0.0)

    def reference_flops_per_token(self, shape: Shape) -> float:
        from training.metrics import forward_flops_per_token

        return forward_flops_per_token(self.counts(shape), layers=self.layers, hidden=self.hidden,
                                       seq_len=round(self.mean_len))

    def recompute(self, shape: Shape) -> float:
        """Wall-time factor of activation checkpointing: each token's forward (2 FLOPs per matmul weight) runs
        twice. MFU counts model FLOPs only, so the recomputation shows as time, not as FLOPs."""
        if not shape.checkpointing:
            return 1.0
        c = self.counts(shape)
        model = self.flops_per_token(shape)
        return (model + 2 * (c.matmul_trainable + c.matmul_frozen)) / model

    def limit(self, shape: Shape) -> float:
        """Bytes a rank may use: the device's usable memory; on a CPU, the host's shared by the ranks."""
        return self.hw.memory_bytes * USABLE / (1 if self.hw.gpu else shape.world)

    def fits(self, shape: Shape) -> bool:
        m = self.memory(shape)
        used = m["total"] + (0.0 if self.hw.gpu else m["host"])
        return used <= self.limit(shape)


def qlora_memory(plan: dict[str, float], counts, precision: str, lm_head: int, layer_params: int) -> dict[str, float]:
    """QLoRA's weights in place of the LoRA plan's. The frozen Linear weights of the decoder layers are stored
    in NF4 (`NF4_BYTES` each); bitsandbytes leaves the LM head unquantized, and embeddings and norms are not
    Linear layers; peft's prepare_model_for_kbit_training upcasts those to fp32 (4 bytes). The adapters keep
    the precision's bytes (their gradients and AdamW state are the LoRA plan's, unchanged). Each quantized
    matrix is dequantized to the compute dtype for its matmul, forward and backward: at most one decoder
    layer's weights in flight. The 4-bit base is never partitioned or offloaded: ZeRO and offload act on the
    adapters' state only."""
    from training.metrics import PRECISION_BYTES

    w = PRECISION_BYTES[precision]
    quantized = max(0, counts.matmul_frozen - lm_head)
    upcast = counts.frozen - quantized
    weights = quantized * NF4_BYTES + upcast * 4 + counts.trainable * w + layer_params * w
    out = {**plan, "weights": weights}
    out["total"] = weights + plan["optimizer"] + max(plan["gradients"] + plan["activations"], plan["step"])
    return out


def levers(shape: Shape, t) -> list[Shape]:
    """Single changes, cheapest first: each trades speed, memory or devices a different way."""
    out = []
    if not shape.checkpointing:
        out.append(replace(shape, checkpointing=True))
    out += [replace(shape, zero_stage=z) for z in (1, 2, 3) if z > shape.zero_stage and shape.world > 1]
    micro = shape.micro
    while micro > 1:
        micro //= 2
        out.append(replace(shape, micro=micro))
    if shape.offload == "none":
        out.append(replace(shape, offload="optimizer", zero_stage=max(shape.zero_stage, 2)))
    if shape.offload != "optimizer_and_params":
        out.append(replace(shape, offload="optimizer_and_params", zero_stage=3))
    if shape.mode == "full":
        out.append(replace(shape, mode="lora"))
    if shape.mode != "qlora":  # a 4-bit base: the last lever before more devices (its base is not partitioned)
        out.append(replace(shape, mode="qlora", zero_stage=0, offload="none"))
    return out


def what_fits(cost: Costing, shape: Shape, t) -> list[Shape]:
    """Up to three single changes that fit; else the cumulative chain of them; else more devices."""
    single = [s for s in levers(shape, t) if cost.fits(s)]
    if single:
        return single[:3]
    chained = shape
    for step in (dict(checkpointing=True), dict(zero_stage=3), dict(micro=1),
                 dict(offload="optimizer", zero_stage=3), dict(offload="optimizer_and_params", zero_stage=3)):
        chained = replace(chained, **step)
        if cost.fits(chained):
            return [chained]
    if cost.hw.gpu:
        for world in (2**k for k in range(1, 13)):
            if world > shape.world and cost.fits(replace(chained, world=world)):
                return [replace(chained, world=world)]
    return []


def parse_deadline(text: str | None, now: float | None = None) -> float | None:
    """Seconds from now: a duration (36h, 2d, 90m, 3600s) or an ISO date-time (UTC when no zone is given)."""
    if not text:
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if match:
        return float(match[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"--deadline '{text}' is neither a duration nor a date-time. Fix: pass e.g. --deadline 36h, "
                          "--deadline 2d or --deadline 2026-12-24T18:00.") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp() - (now if now is not None else time.time())


def _tokens_of(snapshot: str | None) -> tuple[dict, str | None]:
    """The snapshot's manifest, or {} with the reason it could not be read."""
    if not snapshot:
        return {}, "no train.snapshot"
    from mlops.errors import MLOpsError
    from training.data_loader import open_snapshot, resolve_snapshot_id

    try:
        _, manifest = open_snapshot(resolve_snapshot_id(snapshot), verify=False)
    except MLOpsError as err:
        return {}, str(err)
    return manifest, None


def check_mfu(mfu: float) -> float:
    """MFU is a share of the device's peak: (0, 1]."""
    if not 0 < mfu <= 1:
        raise ConfigError(f"--mfu {mfu:g} is not a model FLOPs utilisation: it is the share of the device's peak "
                          "FLOP/s the job reaches, so it lies in (0, 1]. Fix: pass e.g. --mfu 0.4 (GPUs reach about "
                          "0.3-0.5), or the `mfu` metric a smoke run logs.")
    return mfu


def _keep_batch(own: int, micro: int, gpus: int) -> str:
    """The overrides that keep the batch `own` on `gpus` devices, or why none can."""
    if own % gpus:
        return f"the batch of {own} cannot be kept on {gpus} devices: it is not a multiple of {gpus}"
    per_device = own // gpus
    fitting = max(m for m in range(1, micro + 1) if per_device % m == 0)
    smaller = f" train.micro_batch_size={fitting}" if fitting != micro else ""
    return f"set train.global_batch_size={own}{smaller} to keep the batch"


def batch_warnings(t, gpus: int, global_batch: int) -> list[str]:
    """The linear learning-rate rule, when the planned global batch is not the one train.lr was set for: the
    config's own at its own layout (train.global_batch_size, else micro batch x grad accum on one device)."""
    own = t.global_batch_size or t.micro_batch_size * t.grad_accum
    if global_batch == own:
        return []
    factor = global_batch / own
    return [f"global batch {global_batch} != {own} the learning rate was set for; by the linear scaling rule "
            f"scale train.lr by {factor:g}x (train.lr={t.lr * factor:.3g}) (or "
            f"{_keep_batch(own, t.micro_batch_size, gpus)})"]


def plan_job(cfg, *, hw: Hardware, gpus: int = 1, tokens: float | None = None, mfu: float | None = None,
             seq_len: int | None = None, deadline_s: float | None = None, base_path: str | None = None) -> dict:
    """The plan of `cfg` on `gpus` devices of `hw`; a dict that `describe` prints and tests read."""
    from mlops.config import require_section

    t = require_section(cfg, "train")
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus} is not a positive number of devices. Fix: pass --gpus 1 or more.")
    mfu = check_mfu(mfu if mfu is not None else hw.mfu)
    micro, accum, global_batch = t.batch_layout(gpus)
    manifest, why = _tokens_of(t.snapshot)
    seq = seq_len or t.max_seq_len or manifest.get("seq_len")
    if not seq:
        raise ConfigError(f"the plan needs a sequence length and has none ({why}, no train.max_seq_len). Fix: pass "
                          "--seq-len, set train.max_seq_len, or name a snapshot with train.snapshot.")
    if manifest.get("seq_len"):
        seq = min(seq, int(manifest["seq_len"]))
    split = manifest.get("counts", {}).get("per_split", {}).get("train", {})
    snapshot_tokens = split.get("tokens")
    # Batches are cut to their longest sample: a snapshot's mean sample length drives compute, its seq_len memory.
    mean_len = min(seq, snapshot_tokens / split["records"]) if snapshot_tokens and split.get("records") else seq
    rows, _, reference_pass = dpo_shape(t)
    if tokens is None:
        tokens = float(t.max_steps * global_batch * rows * mean_len)
    if base_path is None:
        from mlops.base_models import ensure_base_model

        base_path = ensure_base_model(cfg.base_model)["path"]
    precision = resolve_precision(t.precision, hw)
    peak = hw.peak(precision)
    shape = Shape(t.mode, precision, t.zero_stage, t.offload, t.activation_checkpointing, micro, gpus)
    cost = Costing(meta_model(base_path, t), t, int(seq), mean_len, hw)
    counts, memory = cost.counts(shape), cost.memory(shape)
    fpt = cost.flops_per_token(shape)
    rate = peak * (gpus if hw.gpu else 1) * mfu  # CPU ranks share one machine's cores
    train_s = tokens * fpt / rate * cost.recompute(shape)
    evals = _inrun_eval_seconds(t, tokens / train_s)
    # DPO, full fine-tuning: one reference forward over every sequence of the snapshot before the first step.
    # Without a snapshot, the sequences the steps read stand in for the snapshot.
    reference_tokens = (_all_tokens(manifest, mean_len) or tokens) if reference_pass else 0.0
    reference_s = reference_tokens * cost.reference_flops_per_token(shape) / rate
    wall = train_s + evals + reference_s
    fits = cost.fits(shape)
    plan = {
        "hardware": hw.name, "gpus": gpus, "precision": precision, "mode": t.mode, "zero_stage": t.zero_stage,
        "offload": t.offload, "activation_checkpointing": t.activation_checkpointing,
        "micro_batch_size": micro, "grad_accum": accum, "global_batch": global_batch, "seq_len": int(seq),
        "mean_len": mean_len, "params_total": counts.total, "params_trainable": counts.trainable,
        "tokens": tokens, "snapshot_tokens": snapshot_tokens, "steps": math.ceil(tokens / (global_batch * rows * mean_len)),
        "flops_per_token": fpt, "flops_total": fpt * tokens, "peak_flops_per_device": peak, "mfu": mfu,
        "wall_time_s": wall, "wall_time_with_margin_s": wall * MARGIN, "inrun_eval_s": evals,
        "objective": t.objective, "dpo_reference_s": reference_s,
        **{f"memory_{k}_bytes": v for k, v in memory.items()},
        "memory_limit_bytes": cost.limit(shape), "fits": fits,
        "fixes": [] if fits else [{"overrides": shape.overrides(s), "memory_bytes": cost.memory(s)["total"]}
                                  for s in what_fits(cost, shape, t)],
        "warnings": batch_warnings(t, gpus, global_batch),
    }
    if deadline_s is not None:
        plan["deadline_s"] = deadline_s
        plan["meets_deadline"] = wall * MARGIN <= deadline_s
        if not plan["meets_deadline"] and hw.gpu and deadline_s > 0:
            plan["gpus_for_deadline"] = math.ceil(gpus * wall * MARGIN / deadline_s)
    return plan


def _all_tokens(manifest: dict, mean_len: float) -> float:
    """Tokens of both splits (the snapshot's own count, else its rows at the mean length)."""
    per_split = manifest.get("counts", {}).get("per_split", {})
    total = sum(float(s.get("tokens") or 0) for s in per_split.values())
    rows = sum(int(n) for n in (manifest.get("counts", {}).get("samples") or {}).values())
    return total or rows * mean_len


def _inrun_eval_seconds(t, train_tokens_per_s: float) -> float:
    """train.eval's suites, run every N steps, at the plan's own training rate (they are part of the job)."""
    if not t.eval.suites:
        return 0.0
    from training.inrun_eval import check_suites, planned_seconds

    return planned_seconds(check_suites(t.eval, None), t.eval, t.max_steps, train_tokens_per_s)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def _peak_phase(plan: dict) -> str:
    """Where the peak is: the backward (weights, gradients, optimizer state, activations) or the optimizer step
    (weights or their shards, optimizer state, the step's fp32 gradients and AdamW temporaries)."""
    gib = 2**30
    m = {k: plan[f"memory_{k}_bytes"] / gib for k in ("weights", "gradients", "optimizer", "activations", "step")}
    backward = m["weights"] + m["gradients"] + m["optimizer"] + m["activations"]
    where = "in the backward" if backward >= plan["memory_total_bytes"] / gib - 1e-9 else "in the optimizer step"
    return (f"peak {where}; host {plan['memory_host_bytes'] / gib:.1f} GiB\n         backward: weights "
            f"{m['weights']:.1f}, gradients {m['gradients']:.1f}, optimizer {m['optimizer']:.1f}, activations "
            f"{m['activations']:.1f}; step: {m['step']:.1f} of fp32 gradients and AdamW temporaries beside the "
            "optimizer state and the weights it keeps")


def describe(plan: dict) -> str:
    gib = 2**30
    lines = [
        f"job      {plan['mode']} fine-tune, {plan['precision']}, ZeRO-{plan['zero_stage']}, offload {plan['offload']}, "
        f"activation checkpointing {'on' if plan['activation_checkpointing'] else 'off'}",
        f"devices  {plan['gpus']} x {plan['hardware']}; micro batch {plan['micro_batch_size']} x grad accum "
        f"{plan['grad_accum']} = global batch {plan['global_batch']} sequences of {plan['seq_len']} tokens",
        f"params   {plan['params_total']:,} ({plan['params_trainable']:,} trainable)",
        f"tokens   {plan['tokens']:.4g} ({plan['steps']:,} steps)"
        + (f"; the snapshot holds {plan['snapshot_tokens']:.4g}" if plan.get("snapshot_tokens") else ""),
        f"compute  {plan['flops_per_token']:.4g} FLOPs/token, {plan['flops_total']:.4g} FLOPs in all",
        f"memory   {plan['memory_total_bytes'] / gib:.1f} GiB per rank of {plan['memory_limit_bytes'] / gib:.1f} GiB "
        f"usable, {_peak_phase(plan)}",
        f"time     {_hours(plan['wall_time_s'])} at MFU {plan['mfu']:.2f} of {plan['peak_flops_per_device']:.3g} FLOP/s "
        f"per device; {_hours(plan['wall_time_with_margin_s'])} with the 20% margin"
        + (f" (in-run eval: {_hours(plan['inrun_eval_s'])})" if plan.get("inrun_eval_s") else "")
        + (f" (DPO reference pass: {_hours(plan['dpo_reference_s'])})" if plan.get("dpo_reference_s") else ""),
    ]
    if plan.get("objective") == "dpo":
        lines.append("dpo      each pair is two sequences (chosen, rejected) in one forward"
                     + ("; the reference is computed once up front" if plan.get("dpo_reference_s")
                        else "; a reference forward with the adapters off runs in every step"))
    if plan["fits"]:
        lines.append("verdict  fits")
    elif plan["fixes"]:
        options = "; or ".join(f"{' '.join(f['overrides'])} ({f['memory_bytes'] / gib:.1f} GiB)" for f in plan["fixes"])
        lines.append(f"verdict  does NOT fit. It would fit with: {options}")
    else:
        lines.append("verdict  does NOT fit, and no ZeRO stage, offload, checkpointing or micro batch makes it fit: "
                     "use more or larger devices, or a smaller model")
    if "meets_deadline" in plan:
        if plan["meets_deadline"]:
            lines.append(f"deadline met ({_hours(plan['deadline_s'])} available)")
        else:
            more = f"; about {plan['gpus_for_deadline']} devices would make it" if plan.get("gpus_for_deadline") else ""
            lines.append(f"deadline MISSED: {_hours(plan['wall_time_with_margin_s'])} needed, "
                         f"{_hours(max(0.0, plan['deadline_s']))} available{more}")
    lines += [f"warning  {w}" for w in plan.get("warnings", [])]
    return "\n".join(lines)


def refuse_unfit(cfg, world_size: int, base_path: str) -> dict:
    """`mlops train run`'s check before compute: the plan on this machine must fit, unless train.allow_unfit."""
    from training import hardware

    hw = hardware.local(measure=False)  # memory decides here, not speed
    t = cfg.train
    plan = plan_job(cfg, hw=hw, gpus=world_size, tokens=1.0, base_path=base_path)
    if plan["fits"] or t.allow_unfit:
        return plan
    gib = 2**30
    fixes = "; or ".join(" ".join(f["overrides"]) for f in plan["fixes"]) or "more or larger devices"
    raise ConfigError(
        f"this job does not fit {world_size} x {hw.name}: the plan needs {plan['memory_total_bytes'] / gib:.1f} GiB "
        f"per rank and {plan['memory_limit_bytes'] / gib:.1f} GiB are usable (`mlops train plan` shows the breakdown)."
        f" Fix: {fixes}; or set train.allow_unfit=true to run anyway (recorded on the run)."
    )

