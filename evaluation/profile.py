"""Deployment profile: how a model version is served to users (system prompt, template, sampling, context).

A profile travels inside the model's HF folder as `deployment_profile.yaml`, is stored with each model version,
and is logged with each eval run, so a model is judged exactly the way it will be served.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml
from pydantic import Field

from mlops.config import StrictModel, canonical_json
from mlops.errors import ConfigError

PROFILE_FILE = "deployment_profile.yaml"
SCHEMA_VERSION = 1


class SamplingParams(StrictModel):
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 means greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(256, ge=1, description="default completion length")
    seed: int | None = Field(1234, description="sampling seed")


class DeploymentProfile(StrictModel):
    schema_version: int = Field(SCHEMA_VERSION, description="profile schema version")
    system_prompt: str | None = Field(None, description="system message prepended to every chat")
    chat_template_hash: str = Field(description="sha256 of the tokenizer's chat template")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    max_context: int = Field(2048, ge=16, description="tokens of prompt plus completion")
    stop: list[str] = Field(default_factory=list, description="stop strings, at most 4")

    def profile_hash(self) -> str:
        return hashlib.sha256(canonical_json(self).encode()).hexdigest()[:16]

    def save(self, folder: Path) -> Path:
        path = Path(folder) / PROFILE_FILE
        path.write_text(yaml.safe_dump(self.model_dump(mode="json"), sort_keys=True))
        return path


def chat_template_hash(template: str | None) -> str:
    return hashlib.sha256((template or "").encode()).hexdigest()


def template_of(model_dir: Path) -> str | None:
    """The chat template saved with a tokenizer (own file in transformers 5, or tokenizer_config.json)."""
    model_dir = Path(model_dir)
    jinja = model_dir / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    config = model_dir / "tokenizer_config.json"
    if config.exists():
        return json.loads(config.read_text()).get("chat_template")
    return None


def default_profile(model_dir: Path, *, system_prompt: str | None = None, max_context: int = 2048) -> DeploymentProfile:
    return DeploymentProfile(
        system_prompt=system_prompt,
        chat_template_hash=chat_template_hash(template_of(model_dir)),
        max_context=max_context,
        stop=["<|im_end|>"],
    )


def load_profile(model_dir: Path) -> DeploymentProfile:
    """The profile stored in a model folder; a folder without one gets the default for its template."""
    path = Path(model_dir) / PROFILE_FILE
    if not path.exists():
        return default_profile(model_dir)
    try:
        return DeploymentProfile.model_validate(yaml.safe_load(path.read_text()))
    except Exception as err:
        raise ConfigError(f"deployment profile {path} is invalid: {err}. Fix: correct or delete that file.") from None
