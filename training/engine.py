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
    chosen = backend if backend != "auto" else ("nccl" if gpu else "gloo")
    import deepspeed

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend=chosen)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if gpu:
        torch.cuda.set_device(local)
    return World(dist.get_rank(), dist.get_world_size(), local, f"cuda:{local}" if gpu else "cpu", chosen)


def build_model(base_path: str, cfg, seed: int):
    """The trainable model: a peft LoRA wrapper over the base, or the whole base for full fine-tuning."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)  # LoRA's A matrices are random: the same on every rank and every rerun
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32, trust_remote_code=False)
    model.config.use_cache = False
    if cfg.mode == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                          target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    return model


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


def ds_config(cfg, world: World, *, micro: int, accum: int, universal: bool = False) -> dict:
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": micro * accum * world.size,
        "gradient_clipping": float(cfg.grad_clip),  # DeepSpeed defaults it to 1.0: always spell it out
        "zero_optimization": {"stage": int(cfg.zero_stage)},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
        "checkpoint": {"load_universal": universal},
    }
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
    return engine, optimizer, scheduler


def grad_norm_before_step(engine) -> float:
    """The global L2 grad norm at the accumulation boundary, before the optimizer step (same on all ranks)."""
    import torch

    if engine.zero_optimization():
        # ZeRO-1/2 keep this rank's reduced partition; the optimizer's own norm all-reduces the pieces.
        return float(engine.optimizer.scaled_global_norm())
    grads = [p.grad for p in engine.module.parameters() if p.requires_grad and p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
