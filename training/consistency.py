"""Checks before compute that a run is what it claims: the snapshot was tokenized with the base model's
tokenizer and chat template, every rank runs the same software (the field guides: environments that differ
slightly between nodes show up as random hangs, long after the job started), and the device can run the mode."""

from __future__ import annotations

import importlib.metadata
import platform

from mlops.errors import ConfigError, MLOpsError

# Written by `write_snapshot` for token ids that came without a tokenizer (synthetic and test snapshots): they
# claim no tokenizer, so there is nothing to compare.
NO_TOKENIZER = "none"
PACKAGES = ("torch", "deepspeed", "transformers", "peft", "bitsandbytes", "accelerate", "safetensors")


def check_tokenizer(manifest: dict, snapshot_id: str, base: dict) -> None:
    """Refuse a snapshot whose vocabulary or chat template differs from the base model's, naming both hashes."""
    from mlops.data.tokenize import tokenizer_info

    theirs = manifest.get("tokenizer") or {}
    if theirs.get("vocab_hash", NO_TOKENIZER) == NO_TOKENIZER:
        return
    ours = tokenizer_info(base["path"], base["name"], base["id"])
    for key, what in (("vocab_hash", "vocabulary"), ("chat_template_hash", "chat template")):
        if theirs.get(key) != ours[key]:
            raise ConfigError(
                f"snapshot {snapshot_id} was tokenized with another {what} than base model {base['name']}: "
                f"snapshot {key} {str(theirs.get(key))[:16]} (tokenizer {theirs.get('name')}), base model "
                f"{key} {ours[key][:16]}. Its token ids would mean other words to this model. Fix: rebuild the "
                f"snapshot with this base model (`mlops data build` with base_model={base['name']}), or set "
                "base_model to the model the snapshot was built for."
            )


def check_mode_on_device(t, precision: str, device: str) -> None:
    """Refuse QLoRA where bitsandbytes cannot quantize on this device, before any folder or run exists."""
    if t.mode != "qlora":
        return
    from training.qlora import device_can_quantize

    ok, reason = device_can_quantize(device, precision)
    if not ok:
        raise ConfigError(
            f"train.mode=qlora cannot run on {device}: {reason}. Fix: install bitsandbytes==0.50.2 with a backend "
            "for this device (CPU and CUDA have one), or set train.mode=lora (the same adapters over an unquantized "
            "base)."
        )


def fingerprint() -> dict[str, str]:
    """What must match on every rank: Python, the CUDA build, the packages that compute, and the image tag."""
    import os

    import torch

    from mlops.lineage import IMAGE_TAG_ENV

    # The pinned tag only: the derived one hashes the kernel version too, which may differ between healthy nodes.
    image = os.environ.get(IMAGE_TAG_ENV, "").strip() or "unpinned"
    out = {"python": platform.python_version(), "cuda": str(torch.version.cuda), "image": image}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def compare(prints: list[dict[str, str]]) -> str | None:
    """None when every rank agrees; else which package differs and on which ranks."""
    problems = []
    for key in sorted({k for p in prints for k in p}):
        groups: dict[str, list[int]] = {}
        for rank, p in enumerate(prints):
            groups.setdefault(p.get(key, "absent"), []).append(rank)
        if len(groups) > 1:
            problems.append(f"{key}: " + ", ".join(f"{v} on rank{'s' if len(r) > 1 else ''} "
                                                  f"{','.join(map(str, r))}" for v, r in groups.items()))
    return "; ".join(problems) or None


class EnvironmentMismatch(MLOpsError):
    """Ranks run different software: refused before the first collective that could hang on it."""


def check_ranks(world) -> None:
    """Every rank gathers every rank's fingerprint; all raise the same error when they differ."""
    if world.size == 1:
        return
    import torch.distributed as dist

    prints: list = [None] * world.size
    dist.all_gather_object(prints, fingerprint())
    problem = compare(prints)
    if problem:
        raise EnvironmentMismatch(
            f"the ranks of this run do not share one environment: {problem}. Fix: install the same versions on "
            "every node (one image tag, one lock file), then rerun."
        )
