"""The end of a run: consolidate the last checkpoint (zero_to_fp32), merge LoRA, save an HF folder with
tokenizer, chat template and deployment profile, log it as the run's `model`, mark the run FINISHED.

The model is rebuilt from the checkpoint rather than taken from the live engine, so what is released is
exactly what the checkpoint holds.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

from mlops.errors import MLOpsError
from training.config import ADAPTER_MODES
from training.guards import TrainingStopped


def consolidated_state(ckpt: Path, zero_stage: int) -> dict:
    """fp32 weights of a checkpoint: zero_to_fp32 for ZeRO >= 1, the module states for ZeRO-0."""
    import torch

    if zero_stage >= 1:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(str(ckpt.parent), tag=ckpt.name)
    state = torch.load(ckpt / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    return state["module"]


# The dtype each serving engine is handed (the profile names the engine): `hf` loads float32 (it is the reference
# the quantization gate measures against), `llamacpp` converts the folder to the profile's GGUF type (a float32
# source loses nothing before that), `vllm` serves the dtype the run trained in (None: train.precision's).
FINAL_DTYPES = {"hf": "float32", "llamacpp": "float32", "vllm": None}
PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def final_dtype(engine: str, precision: str) -> str:
    """The torch dtype name the final model is saved in for a profile's engine and the run's precision."""
    return FINAL_DTYPES.get(engine, "float32") or PRECISION_DTYPES[precision]


def base_for_final(base_path: str, t, seed: int, precision: str):
    """The model the checkpoint's weights load into: LoRA and full as in training; QLoRA's 4-bit base
    re-quantized as the run quantized it, dequantized to float32, under fresh adapters."""
    from training.engine import build_model

    if t.mode != "qlora":
        return build_model(base_path, t, seed)
    import torch
    from peft import LoraConfig, get_peft_model

    from training.qlora import dequantized_base

    model = dequantized_base(base_path, precision)
    torch.manual_seed(seed)
    lora = LoraConfig(r=t.lora.r, lora_alpha=t.lora.alpha, lora_dropout=t.lora.dropout,
                      target_modules=list(t.lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def build_final_model(base_path: str, t, seed: int, ckpt: Path, out: Path, *, max_context: int | None,
                      precision: str | None = None) -> Path:
    """Write `out` as a complete HF folder (merged weights in the profile's dtype, tokenizer, chat template,
    deployment profile). `precision` is the run's (default: the one its checkpoint recorded)."""
    import torch
    from transformers import AutoTokenizer

    from mlops.profile import default_profile
    from training.checkpoint import read_manifest

    precision = precision or (read_manifest(ckpt) or {}).get("precision") or "fp32"
    model = base_for_final(base_path, t, seed, precision)
    state = consolidated_state(ckpt, t.zero_stage)
    if t.mode == "qlora":
        from training.qlora import without_quant_state

        state = without_quant_state(state)
    missing, unexpected = model.load_state_dict(state, strict=False)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    lost = sorted(trainable & set(missing))
    if lost or unexpected:
        raise MLOpsError(
            f"checkpoint {ckpt} does not match the model: missing {lost[:5]}, unexpected {list(unexpected)[:5]}. "
            "Fix: consolidate a checkpoint written by this config (same mode, LoRA settings and base model)."
        )
    if t.mode in ADAPTER_MODES:
        model = model.merge_and_unload()  # in float32: QLoRA's delta lands on the dequantized base unrounded
    dtype = final_dtype(t.serve_engine, precision)
    model = model.to(getattr(torch, dtype))
    model.config.dtype = dtype
    model.config.use_cache = True
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    AutoTokenizer.from_pretrained(base_path, trust_remote_code=False).save_pretrained(staging)
    context = max_context or int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
    default_profile(staging, max_context=context, engine=t.serve_engine, quantization=t.serve_quantization).save(staging)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(staging, out)
    return out


def output_root(cfg) -> Path:
    from mlops.paths import project_home

    root = Path(cfg.run.output_dir).expanduser()
    return root if root.is_absolute() else project_home() / root


def finish(run):
    """Final model (rank 0), final metrics, FINISHED; every rank returns the same TrainResult."""
    import torch.distributed as dist

    from mlops.lineage import Tag
    from mlops.model_refs import model_content_id
    from mlops.profile import PROFILE_FILE, load_profile
    from training.results import FINAL, TrainResult

    prep, t, tracker = run.prep, run.t, run.tracker
    ckpt = run.final_checkpoint()
    chosen = selection_tags(run, ckpt)
    loss = run.losses[-1] if run.losses else run.last_loss if run.last_loss is not None else math.nan
    metrics = {"loss": loss, **run.val, "tokens_seen": float(run.tokens_seen), "steps": float(run.step),
               **trajectory(run.losses, run.step_tokens, run.step_seconds)}
    if run.selection.active and run.selection.best_step is not None:
        metrics |= {"selected_step": float(run.selection.best_step),
                    f"selected_{run.selection.metric}": float(run.selection.best_value)}
    if prep.smoke:
        smoke_verdict(run, metrics)
    model_dir = model_uri = None
    if t.final_model and run.rank0:
        if ckpt is None or not ckpt.is_dir():
            raise MLOpsError(f"no complete checkpoint to build the final model from ({ckpt or 'none written'}). Fix: "
                             "rerun the training (the selected checkpoint must stay in its folder until the end).")
        model_dir = build_final_model(prep.base["path"], t, prep.cfg.run.seed, ckpt,
                                      output_root(prep.cfg) / tracker.run_id / "hf", max_context=t.max_context,
                                      precision=prep.precision)
        profile = load_profile(model_dir)
        content_id = model_content_id(model_dir)  # once, here: every later stage reads it from the tags
        model_uri = tracker.log_hf_model(model_dir, metadata={**prep.lineage.as_tags(), **chosen,
                                                              str(Tag.MODEL_ID): content_id})
        tracker.log_artifact(model_dir / PROFILE_FILE, "deployment_profile")
        tracker.set_tags({Tag.PROFILE_HASH: profile.profile_hash(), Tag.PROFILE: profile.to_yaml(),
                          Tag.MODEL_ID: content_id})
    dist.barrier()
    result = TrainResult(tracker.run_id, "FINISHED", run.step, metrics, model_dir, model_uri, ckpt)
    if run.rank0:
        tracker.set_tags(chosen)
        tracker.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)}, run.step)
        if run.trace is not None:
            run.trace.flush()
            tracker.log_artifact(run.trace.path, "trace")
        if t.final_model:
            from training.checkpoint import atomic_json

            # The hash tells a rerun of this exact config (nothing to do) from a changed one (resume and go on).
            atomic_json(prep.ckpt_dir / FINAL, {**result.as_dict(), "config_hash": prep.config_hash,
                                                "selection": run.selection.summary()})
        tracker.close("FINISHED")
    return result


def selection_tags(run, ckpt: Path | None) -> dict[str, str]:
    """The run's (and so its registered version's) record of which checkpoint became the final model, and why
    the run ended early if it did. Without train.select the final model is the last checkpoint."""
    from mlops.lineage import Tag

    sel = run.selection
    tags = {Tag.SELECTED_CHECKPOINT: str(ckpt) if ckpt else ""}
    if sel.active and sel.best_step is not None:
        tags |= {Tag.SELECTED_STEP: str(sel.best_step), Tag.SELECTED_METRIC: sel.label,
                 Tag.SELECTED_VALUE: repr(sel.best_value)}
    else:
        tags |= {Tag.SELECTED_STEP: str(run.step), Tag.SELECTED_METRIC: "last"}
    if sel.stopped:
        tags |= {Tag.EARLY_STOPPED: sel.stopped, Tag.STOP_REASON: sel.stopped}
    return tags


def trajectory(losses: list[float], tokens: int, seconds: float, k: int = 5) -> dict:
    """Mean loss of the first and last k steps of this process's run, and its mean throughput."""
    if not losses:
        return {}
    k = max(1, min(k, len(losses) // 2 or 1))
    return {"loss_first": sum(losses[:k]) / k, "loss_last": sum(losses[-k:]) / k,
            "train_tokens_per_s": tokens / seconds if seconds > 0 else 0.0}


class SmokeFailed(TrainingStopped):
    """The smoke run's verdict; the run is FAILED with the reason."""

    exit_code = 4


def smoke_verdict(run, metrics: dict) -> None:
    """A smoke run passes when the loss fell by the configured fraction and throughput met its floor."""
    from mlops.lineage import Tag

    s = run.t.smoke
    problems = []
    if not metrics.get("loss_last", math.inf) < metrics.get("loss_first", math.nan) * (1 - s.min_loss_drop):
        problems.append(f"the loss did not fall by {s.min_loss_drop:.0%} (first steps {metrics.get('loss_first'):.4f},"
                        f" last steps {metrics.get('loss_last'):.4f}): check train.lr and the data")
    rate = metrics.get("train_tokens_per_s", 0.0)
    if rate < s.min_tokens_per_s:
        problems.append(f"throughput {rate:.0f} tokens/s is under the floor train.smoke.min_tokens_per_s="
                        f"{s.min_tokens_per_s:g}")
    run.tracker.set_tags({Tag.SMOKE: "failed" if problems else "passed"})
    if problems:
        message = "smoke run failed: " + "; and ".join(problems) + ". Fix: address it before a long run."
        run.tracker.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)}, run.step)
        run.tracker.close("FAILED", reason=message)
        raise SmokeFailed(message)
