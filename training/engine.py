"""DeepSpeed setup: the process group, the model (LoRA or full), the optimizer, the schedule, the engine.

On CPU the backend is gloo and the optimizer a torch AdamW (DeepSpeed's own Adam ops would compile first).
A process started as plain `python` gets the rendezvous variables DeepSpeed expects, so the same code runs
single-process (tests, sweeps) and under torchrun / the deepspeed launcher.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from mlops.files import free_port
from training.config import ADAPTER_MODES
from training.metrics import zero_sizes

DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    device: str  # "cpu" or "cuda:<local rank>"
    backend: str


def init_world(backend: str = "auto") -> World:
    """Join (or start) the process group; idempotent, so several runs can share one process."""
    import torch
    import torch.distributed as dist

    alone = not all(v in os.environ for v in DIST_VARS) or os.environ.get("WORLD_SIZE") == "1"
    if alone and not dist.is_initialized():
        # A world of one has no peer to agree on a port with: always take a free one. An inherited
        # MASTER_PORT (a parent process that trained in-process) is held by that parent's store.
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(free_port())})
    gpu = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "") != "cpu"
    if not gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        bound_host_heap()
    chosen = backend if backend != "auto" else ("nccl" if gpu else "gloo")
    import deepspeed

    if alone and not gpu:
        import importlib

        ds_comm = importlib.import_module("deepspeed.comm.torch")  # by name: its attribute `torch` is torch itself
        # A world of one has no peer to share memory with: DeepSpeed would still compile its shared-memory
        # allreduce op (~40 s on a fresh machine, the first training of a newcomer's demo) to use it never.
        ds_comm.build_shm_op = lambda: None
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend=chosen)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if gpu:
        torch.cuda.set_device(local)
    return World(dist.get_rank(), dist.get_world_size(), local, f"cuda:{local}" if gpu else "cpu", chosen)


HEAP_MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value, held fixed
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def bound_host_heap() -> bool:
    """Keep freed tensor memory from staying resident on a CPU rank; False where it does not apply.

    glibc raises its mmap threshold (up to 32 MiB) each time a large mmapped block is freed, so later blocks of
    that size come from the heap and stay resident after they are freed. A CPU training step frees and
    reallocates blocks of every size each step (ZeRO's buckets and partitions, activations), and the resident
    size climbed over the first steps to 1.3-1.6x the tensors the plan counts (benchmarks/RESULTS.md, issue 28).
    A fixed threshold returns every large block to the system when it is freed. A user's own MALLOC_* setting
    wins; only glibc has mallopt."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD")):
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD)) and \
        bool(libc.mallopt(_M_TRIM_THRESHOLD, HEAP_MMAP_THRESHOLD))


def build_model(base_path: str, cfg, seed: int, *, ds: dict | None = None):
    """The trainable model: a peft LoRA wrapper over the base, or the whole base for full fine-tuning.

    `ds` (the DeepSpeed config) means "for training": under ZeRO-3 the weights are partitioned as they load
    (transformers' HfDeepSpeedConfig makes from_pretrained run inside deepspeed.zero.Init), so no rank ever
    holds the whole model; and train.activation_checkpointing turns on non-reentrant HF gradient checkpointing.
    Weights load in fp32 in every precision: DeepSpeed casts them and keeps the fp32 master copy. QLoRA's base
    loads in 4-bit NF4 instead (training.qlora), in the compute dtype of the precision `ds` enables."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)  # LoRA's A matrices are random: the same on every rank and every rerun
    zero3 = ds is not None and cfg.zero_stage == 3
    if zero3:
        from transformers.integrations import HfDeepSpeedConfig, unset_hf_deepspeed_config

        marker = HfDeepSpeedConfig(ds)  # transformers holds it weakly: alive for the load only
    try:
        if cfg.mode == "qlora":
            from training.qlora import load_base

            model = load_base(base_path, ds_precision(ds), zero_stage=cfg.zero_stage if ds is not None else 0)
        else:
            model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32, trust_remote_code=False)
    finally:
        if zero3:
            # Left set, every later from_pretrained in this process (the final model, built on rank 0 alone)
            # would partition over ranks that never join it.
            del marker
            unset_hf_deepspeed_config()
    model.config.use_cache = False
    checkpointing = ds is not None and cfg.activation_checkpointing
    if cfg.mode == "qlora":
        from training.qlora import prepare_for_training

        model = prepare_for_training(model, activation_checkpointing=checkpointing)
    elif checkpointing:
        # Non-reentrant: works with frozen inputs (LoRA) and keeps the RNG state, so dropout recomputes alike.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.mode in ADAPTER_MODES:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                          target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    return model


def ds_precision(ds: dict | None) -> str:
    """The precision a DeepSpeed config enables (fp32 when it enables none, or for a model built without one)."""
    ds = ds or {}
    for name in ("bf16", "fp16"):
        if (ds.get(name) or {}).get("enabled"):
            return name
    return "fp32"


def lr_lambda(cfg):
    warmup, total, floor = cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / (warmup + 1)
        if cfg.lr_schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if cfg.lr_schedule == "linear":
            return floor + (1 - floor) * (1 - progress)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def ds_config(cfg, world: World, *, micro: int, accum: int, universal: bool = False,
              precision: str = "fp32", shape: tuple[int, int] | None = None) -> dict:
    """The DeepSpeed config; `shape` (hidden size, one decoder layer's weights) sizes ZeRO's buckets and gathers
    (training.metrics.zero_sizes), as the plan counts them; train.deepspeed.extra overrides any of it."""
    zero: dict = {"stage": int(cfg.zero_stage)}
    if shape is not None:
        zero.update(zero_sizes(int(cfg.zero_stage), *shape, mode=cfg.mode))
    gpu = world.device != "cpu"
    if cfg.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": gpu}
    if cfg.offload == "optimizer_and_params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": gpu}
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": micro * accum * world.size,
        "gradient_clipping": float(cfg.grad_clip),  # DeepSpeed defaults it to 1.0: always spell it out
        "zero_optimization": zero,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
        "checkpoint": {"load_universal": universal},
    }
    if cfg.offload != "none":
        # Keep the torch AdamW under offload too: DeepSpeed would otherwise demand its CPUAdam, which compiles
        # first (~75 s) and updates with other numerics than the non-offloaded runs.
        config["zero_force_ds_cpu_optimizer"] = False
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        # Dynamic loss scaling: start at 2^16, halve on overflow (that step is skipped), double after 1000 clean ones.
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}
    return _merge(config, dict(cfg.deepspeed.extra))


def _merge(base: dict, extra: dict) -> dict:
    for key, value in extra.items():
        base[key] = _merge(dict(base.get(key) or {}), value) if isinstance(value, dict) else value
    return base


def initialize(model, cfg, config: dict):
    """(engine, optimizer, scheduler): torch AdamW over the trainable parameters, LambdaLR schedule."""
    import deepspeed
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                                  weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config, model_parameters=params
    )
    if engine.dp_world_size == 1 and engine.zero_optimization_stage() == 0:
        # ZeRO-0 all-reduces every gradient through a flattened copy even alone: dividing by a world of 1 changes
        # no bit, and skipping it saved ~7 ms a step (2.6%) on the tiny model (benchmarks/bench_train.py, step).
        engine.enable_backward_allreduce = False
    return engine, optimizer, scheduler


def grad_norm_before_step(engine) -> float:
    """The global L2 grad norm at the accumulation boundary, before the optimizer step (same on all ranks),
    unscaled: each DeepSpeed optimizer keeps the gradients where its own step reads them."""
    import torch

    opt = engine.optimizer
    if hasattr(opt, "scaled_global_norm"):
        # ZeRO-1/2 keep this rank's reduced partition; the optimizer's own norm all-reduces the pieces.
        return float(opt.scaled_global_norm()) / float(getattr(opt, "loss_scale", 1.0) or 1.0)
    if hasattr(opt, "_get_norm_groups"):
        from deepspeed.runtime.zero.stage3 import combine_grad_norm_groups

        # ZeRO-3: the partitioned, averaged gradients, as its step() measures them.
        return float(combine_grad_norm_groups(opt._get_norm_groups())) / float(opt.loss_scale or 1.0)
    # ZeRO-0 (fp32, or DeepSpeed's bf16/fp16 wrapper): the module's own gradients, summed in fp32.
    grads = [p.grad for p in engine.module.parameters() if p.requires_grad and p.grad is not None]
    if not grads:
        return 0.0
    scale = float(getattr(opt, "cur_scale", 1.0) or 1.0)
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))) / scale
