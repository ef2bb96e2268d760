"""Smoke stage: a greedy chat generation on a base model, logged as a lineage-tagged run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from mlops.config import config_hash, resolved_yaml
from mlops.lineage import Tag, collect_lineage, enforce_release

DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence."


@dataclass(frozen=True)
class Generation:
    prompt: str
    text: str
    new_tokens: int
    seconds: float


def generate_chat(model_dir: Path | str, prompt: str, max_new_tokens: int = 32) -> Generation:
    """Greedy generation through the model's own chat template (the deployment form of a prompt)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, trust_remote_code=False).eval()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            **ids,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    new = out[0, ids["input_ids"].shape[1] :]
    text = tokenizer.decode(new, skip_special_tokens=True)
    return Generation(prompt, text, int(new.shape[0]), time.perf_counter() - started)


def run_smoke(cfg, prompt: str = DEFAULT_PROMPT, max_new_tokens: int = 32) -> tuple[str, Generation]:
    """Generate on the configured base model inside a tracked run; returns (run_id, generation)."""
    from mlops.base_models import ensure_base_model
    from mlops.tracking import tracked_run

    lineage = collect_lineage(config_hash(cfg), cfg.run.seed, base_model=cfg.base_model)
    enforce_release(lineage, cfg.run.release)
    entry = ensure_base_model(cfg.base_model)
    lineage = collect_lineage(
        config_hash(cfg), cfg.run.seed, base_model=entry["name"], base_model_id=entry["id"],
        extra={Tag.STAGE: "smoke", Tag.RELEASE: str(cfg.run.release).lower()},
    )
    with tracked_run(cfg.run.experiment, run_name=cfg.run.run_name or "smoke", tags=lineage.as_tags()) as run:
        run.log_text(resolved_yaml(cfg), "config/resolved.yaml")
        run.log_params({"base_model": entry["name"], "max_new_tokens": max_new_tokens, "decoding": "greedy"})
        generation = generate_chat(entry["path"], prompt, max_new_tokens)
        run.log_dict(
            {"prompt": generation.prompt, "completion": generation.text, "new_tokens": generation.new_tokens},
            "smoke/generation.json",
        )
        run.log_metrics(
            {"new_tokens": generation.new_tokens, "tokens_per_s": generation.new_tokens / generation.seconds}, 0
        )
        return run.run_id, generation
