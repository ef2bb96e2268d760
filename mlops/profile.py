"""Deployment profile: how a model version is served to users (system prompt, template, sampling, context).

A profile travels inside the model's HF folder as `deployment_profile.yaml`, is stored with each model version,
and is logged with each eval run, so a model is judged exactly the way it will be served.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml
from pydantic import Field, field_validator

from mlops.config import StrictModel, canonical_json
from mlops.errors import ConfigError, MLOpsError

PROFILE_FILE = "deployment_profile.yaml"
SCHEMA_VERSION = 1
QUANTIZATIONS = ("f16", "q8_0", "q4_k_m")  # GGUF types llama.cpp serves (llama-quantize's F16, Q8_0, Q4_K_M)
# Fields added after profiles were first stored: they enter the hash only when set, so a profile stored
# before them keeps its hash (and its evals stay evidence), while choosing an engine or a quantization changes it.
LATER_FIELDS = {"engine": "hf", "quantization": None}


class SamplingParams(StrictModel):
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 means greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(256, ge=1, description="default completion length")
    seed: int | None = Field(1234, description="sampling seed")


def known_quantization(value: str | None) -> str | None:
    """A GGUF type this stack serves, or None; anything else fails naming the choices (config validators)."""
    if value is not None and value not in QUANTIZATIONS:
        from mlops.errors import did_you_mean

        raise ValueError(f"unknown quantization '{value}': {did_you_mean(value, QUANTIZATIONS)}")
    return value


class DeploymentProfile(StrictModel):
    schema_version: int = Field(SCHEMA_VERSION, description="profile schema version")
    system_prompt: str | None = Field(None, description="system message prepended to every chat")
    chat_template_hash: str = Field(description="sha256 of the tokenizer's chat template")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    max_context: int = Field(2048, ge=16, description="tokens of prompt plus completion")
    stop: list[str] = Field(default_factory=list, description="stop strings, at most 4")
    engine: str = Field("hf", description="the inference engine production serves this version on: hf (float32, "
                        "the reference), llamacpp (GGUF on CPU), vllm (GPU)")
    quantization: str | None = Field(None, description="the weights as served: none (as trained) or a GGUF type "
                                     f"on llamacpp ({', '.join(QUANTIZATIONS)})")

    @field_validator("quantization")
    @classmethod
    def _known_quantization(cls, value: str | None) -> str | None:
        return known_quantization(value)

    @field_validator("stop")
    @classmethod
    def _at_most_four(cls, value: list[str]) -> list[str]:
        if len(value) > 4 or any(not s for s in value):
            raise ValueError("stop holds at most 4 non-empty strings (the OpenAI API limit)")
        return value

    def profile_hash(self) -> str:
        data = self.model_dump(mode="json")
        for key, default in LATER_FIELDS.items():
            if data.get(key) == default:
                data.pop(key)
        return hashlib.sha256(canonical_json(data).encode()).hexdigest()[:16]

    def deployment_form(self) -> str:
        """How the weights are served, for reports: 'hf (as trained)', 'llamacpp q8_0'."""
        return f"{self.engine} {self.quantization or '(as trained)'}"

    def as_reference(self) -> DeploymentProfile:
        """The same profile on the reference engine with the weights as trained (the quantization gate's baseline)."""
        return self.model_copy(update={"engine": "hf", "quantization": None})

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=True)

    def save(self, folder: Path) -> Path:
        from mlops.files import atomic_write_text

        return atomic_write_text(Path(folder) / PROFILE_FILE, self.to_yaml())

    def save_as(self, path: Path) -> Path:
        from mlops.files import atomic_write_text

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write_text(path, self.to_yaml())


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


def default_profile(model_dir: Path, *, system_prompt: str | None = None, max_context: int = 2048,
                    engine: str = "hf", quantization: str | None = None) -> DeploymentProfile:
    return DeploymentProfile(
        system_prompt=system_prompt,
        chat_template_hash=chat_template_hash(template_of(model_dir)),
        max_context=max_context,
        stop=["<|im_end|>"],
        engine=engine,
        quantization=quantization,
    )


def load_profile(model_dir: Path) -> DeploymentProfile:
    """The profile stored in a model folder; a folder without one gets the default for its template."""
    path = Path(model_dir) / PROFILE_FILE
    if not path.exists():
        return default_profile(model_dir)
    return read_profile(path)


def read_profile(path: Path) -> DeploymentProfile:
    """A profile from a YAML file (a model folder's own, or one proposed for an eval)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"deployment profile file '{path}' does not exist. Fix: pass the path of a profile YAML.")
    try:
        return DeploymentProfile.model_validate(yaml.safe_load(path.read_text()))
    except Exception as err:
        raise ConfigError(f"deployment profile {path} is invalid: {err}. Fix: correct or delete that file.") from None


class ProfileMismatchError(MLOpsError):
    """An eval would judge the model under a profile other than the one being released."""


def profile_differences(released: DeploymentProfile, used: DeploymentProfile) -> list[str]:
    """Human-readable field differences between two profiles (empty when they are the same)."""
    a, b = released.model_dump(mode="json"), used.model_dump(mode="json")
    diffs = []
    for key in sorted(set(a) | set(b)):
        if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
            diffs += [
                f"{key}.{k}: {a[key].get(k)!r} -> {b[key].get(k)!r}"
                for k in sorted(set(a[key]) | set(b[key]))
                if a[key].get(k) != b[key].get(k)
            ]
        elif a.get(key) != b.get(key):
            diffs.append(f"{key}: {a.get(key)!r} -> {b.get(key)!r}")
    return diffs


def choose_eval_profile(
    released: DeploymentProfile, proposed: DeploymentProfile | None, *, force: bool
) -> tuple[DeploymentProfile, list[str]]:
    """The profile to evaluate under and its differences from the released one.

    Evaluating under another profile than the released one is refused unless forced; the caller labels a
    forced run with the returned differences.
    """
    if proposed is None:
        return released, []
    if proposed == released.as_reference():  # the version as trained on the reference engine: always allowed
        return proposed, []
    diffs = profile_differences(released, proposed)
    if diffs and not force:
        raise ProfileMismatchError(
            f"the eval profile differs from the deployment profile released with this model "
            f"({'; '.join(diffs)}). A model is judged the way it is served. Fix: drop --profile, store the new "
            "profile with a new model version, or pass --force-profile to run anyway (the run is labelled forced)."
        )
    return proposed, diffs


def check_template(profile: DeploymentProfile, model_dir: Path) -> str | None:
    """None when the folder's chat template matches the profile's hash, else the reason it does not."""
    actual = chat_template_hash(template_of(model_dir))
    if actual != profile.chat_template_hash:
        return (
            f"the tokenizer's chat template hash {actual[:12]} differs from the profile's "
            f"{profile.chat_template_hash[:12]}"
        )
    return None
