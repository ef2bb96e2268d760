"""One typed config tree: YAML plus `key=value` overrides, strict validation, canonical hashing.

Each stage owns a section (`data`, `train`, `eval`, `sweep`, ...) and registers it with the core through
`mlops.stages`; a stage's YAML holds `run`, `base_model` and the sections it needs. The hash covers what is present, minus fields marked `volatile` (output dirs, logging
cadence, tracking location), which change where results go but never what they are.
"""

from __future__ import annotations

import hashlib
import json
import math
import types
import typing
from collections.abc import Sequence
from enum import Enum
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticUndefined

from mlops.errors import ConfigError, did_you_mean

HASH_EXCLUDED = "hash_excluded"


def volatile(default: Any = None, **kwargs: Any) -> Any:
    """A field that does not change the result, so the config hash ignores it."""
    return Field(default, json_schema_extra={HASH_EXCLUDED: True}, **kwargs)


HASH_AT_DEFAULT_OMITTED = "hash_at_default_omitted"


def added_option(default: Any = PydanticUndefined, **kwargs: Any) -> Any:
    """A field added later whose default is what every config did before it: at that default it is left out of
    the hash, so existing configs keep their hash (and their runs, checkpoints and snapshots). A section passes
    `default_factory` instead of a default."""
    return Field(default, json_schema_extra={HASH_AT_DEFAULT_OMITTED: True}, **kwargs)


class StrictModel(BaseModel):
    """Base of every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(StrictModel):
    experiment: str = Field("mlops", description="MLflow experiment name")
    run_name: str | None = volatile(None, description="MLflow run name")
    seed: int = Field(1234, description="global random seed")
    release: bool = Field(False, description="strict mode: refuse a mutable image tag or a dirty git tree")
    output_dir: str = volatile(".mlops/runs", description="where run outputs are written")
    log_every: int = volatile(10, ge=1, description="log metrics every N steps")


def _section_types() -> dict[str, type[StrictModel]]:
    # Each stage registers its own section with the core (mlops.stages); the core never imports a stage.
    from mlops.stages import load_stages

    return dict(load_stages().sections)


def _build_root() -> type[StrictModel]:
    from pydantic import create_model

    sections = {name: (cls | None, None) for name, cls in _section_types().items()}
    return create_model(
        "Config",
        __base__=StrictModel,
        run=(RunConfig, Field(default_factory=RunConfig)),
        base_model=(str, Field("tiny", description="base model: a catalog name (`mlops base-model list`), an HF folder, "
                                           "or a registered model to continue from (models:/name/version)")),
        **sections,
    )


_ROOT: type[StrictModel] | None = None


def config_model() -> type[StrictModel]:
    global _ROOT
    if _ROOT is None:
        _ROOT = _build_root()
    return _ROOT


# --------------------------------------------------------------------------- loading


def find_config_file(path: Path, anchors: Sequence[Path] = ()) -> Path:
    """The file itself, or, for a relative path, the same path under the project home or another anchor folder
    (the first that exists; else `path` unchanged, for the caller's error message).

    `mlflow run mlproject` starts entry points inside `mlproject/`, where `configs/x.yaml` would not be found.
    """
    from mlops.paths import project_home

    path = Path(path).expanduser()
    if path.exists() or path.is_absolute():
        return path
    for anchor in (project_home(), *anchors):
        if (anchor / path).exists():
            return anchor / path
    return path


def read_yaml(path: Path) -> dict[str, Any]:
    path = find_config_file(path)
    if not path.exists():
        raise ConfigError(
            f"config file '{path}' does not exist (looked in {Path.cwd()} and the project home). "
            "Fix: pass the path of a YAML config file, e.g. configs/train/tiny.yaml."
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise ConfigError(
            f"config file '{path}' is not valid YAML at {where}: {err.problem}. "
            "Fix: correct the YAML syntax there (indentation, a missing ':' or an unclosed quote)."
        ) from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file '{path}' is not UTF-8 ({err}). Fix: save it as UTF-8.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file '{path}' must hold a mapping of sections, got {type(data).__name__}. "
            "Fix: start the file with keys such as `run:` and `train:`."
        )
    return data


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides; values are parsed as YAML scalars (`1e-4`, `true`, `[1, 2]`)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"override '{item}' is not of the form key=value. Fix: write it like `train.lr=1e-4`."
            )
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        set_dotted(data, key.strip(), value)
    return data


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `a.b.c` in nested dicts, creating the levels on the way."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def load_config(path: Path | str | None = None, overrides: Sequence[str] = (), *, source: str | None = None):
    """Load, override and validate a config; raises ConfigError that names the field and the fix."""
    data = read_yaml(Path(path)) if path else {}
    data = apply_overrides(data, overrides)
    return validate_config(data, source=source or (str(path) if path else "overrides"))


def validate_config(data: dict[str, Any], *, source: str = "config"):
    model = config_model()
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_explain(err, model, source)) from None


def require_section(cfg: Any, name: str) -> Any:
    section = getattr(cfg, name)
    if section is None:
        raise ConfigError(
            f"the config has no `{name}:` section, which this command needs. "
            f"Fix: add a `{name}:` block to the YAML file (see configs/ for examples)."
        )
    return section


def _explain(err: ValidationError, model: type[BaseModel], source: str) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"] if not isinstance(p, int)]
        field = ".".join(loc)
        if e["type"] == "extra_forbidden":
            known = _fields_at(model, loc[:-1])
            lines.append(
                f"unknown key '{field}' in {source}: {did_you_mean(loc[-1], known)}. "
                "Fix: rename or remove it."
            )
        else:
            value = e.get("input")
            desc = _description(model, loc)
            hint = f" ({desc})" if desc else ""
            lines.append(
                f"invalid value for '{field}'{hint} in {source}: {e['msg']}; got {value!r}. "
                f"Fix: set `{field}` to a valid value in the YAML or with `{field}=...`."
            )
    return " ".join(lines)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found:
                return found
    return None


def _walk(model: type[BaseModel] | None, loc: Sequence[str]) -> tuple[type[BaseModel] | None, Any]:
    info = None
    for part in loc:
        if model is None or part not in model.model_fields:
            return None, None
        info = model.model_fields[part]
        model = _model_of(info.annotation)
    return model, info


def _fields_at(model: type[BaseModel], loc: Sequence[str]) -> list[str]:
    target, _ = _walk(model, loc) if loc else (model, None)
    return list(target.model_fields) if target else []


def _description(model: type[BaseModel], loc: Sequence[str]) -> str | None:
    _, info = _walk(model, loc)
    return info.description if info else None


# --------------------------------------------------------------------------- hashing


def canonical(value: Any) -> Any:
    """A JSON-ready form of a config where equivalent spellings coincide."""
    if isinstance(value, BaseModel):
        out = {}
        for name, info in type(value).model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if extra.get(HASH_EXCLUDED):
                continue
            item = getattr(value, name)
            if extra.get(HASH_AT_DEFAULT_OMITTED) and item == info.get_default(call_default_factory=True):
                continue  # a section added later (a default factory) is left out at its defaults, as a field is
            if item is not None:
                out[name] = canonical(item)
        return out
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return _norm_path_str(value) if isinstance(value, str) else value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)
        if value == int(value) and abs(value) < 2**53:
            return int(value)
        return value
    if isinstance(value, PurePath):
        return PurePosixPath(value.as_posix()).as_posix()
    if isinstance(value, Enum):
        return canonical(value.value)
    return str(value)


def _norm_path_str(value: str) -> str:
    # "./data/x.jsonl" and "data/x.jsonl" name the same file.
    if value.startswith("./") and "\n" not in value:
        return PurePosixPath(value).as_posix()
    return value


def canonical_json(cfg: Any) -> str:
    return json.dumps(canonical(cfg), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def config_hash(cfg: Any) -> str:
    """sha256 of the canonical JSON of the resolved config (volatile fields excluded)."""
    return hashlib.sha256(canonical_json(cfg).encode()).hexdigest()


def resolved_yaml(cfg: BaseModel) -> str:
    """The fully resolved config, every default spelled out, as saved with runs and checkpoints."""
    return yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True), sort_keys=True)
