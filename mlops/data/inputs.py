"""What a build reads, hashed before any work: sources, eval sets, earlier snapshots, tokenizer, config.

The build key covers all of it. A build whose key already names a complete snapshot does no work.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlops.config import canonical, require_section
from mlops.data.config import DataConfig
from mlops.data.decontam import resolve_eval_sets
from mlops.data.format import atomic_write_json, file_sha256, read_manifest
from mlops.data.records import BadInputError, source_format
from mlops.data.snapshot import resolve_snapshot
from mlops.errors import ConfigError, MLOpsError
from mlops.lineage import PIPELINE_VERSION

BUILDS = ".builds"


@dataclass
class Inputs:
    cfg: Any
    data: DataConfig
    seed: int
    home: Path
    root: Path
    model: dict
    tokenizer: dict
    sources: list[dict]
    eval_files: list[dict]
    eval_unmatched: list[str]
    priors: list[tuple[str, Path]]
    history: tuple[str, Path] | None
    pipeline_hash: str
    key: str = ""
    extra: dict = field(default_factory=dict)
    blocklist: Any = None  # mlops.data.blocklist.Blocklist, compiled before any record is read


def _resolve(home: Path, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else home / p


def describe_sources(data: DataConfig, home: Path) -> list[dict]:
    if not data.sources:
        raise ConfigError("data.sources is empty, so there is nothing to build. Fix: list at least one input file.")
    out = []
    for i, src in enumerate(data.sources):
        path = _resolve(home, src.path)
        if not path.is_file():
            raise ConfigError(
                f"data.sources[{i}].path '{src.path}' does not exist (looked at {path}). "
                "Fix: correct the path (relative paths are under the project home) or generate the sample "
                "data with `mlops data sample`."
            )
        try:
            fmt = source_format(path, src.format)
        except BadInputError as err:
            raise ConfigError(f"data.sources[{i}]: {err}") from None
        out.append({"name": src.path, "path": path, "format": fmt, "domain": src.domain or data.default_domain,
                    "sha256": file_sha256(path), "bytes": path.stat().st_size})
        sidecar = path.with_name(path.name + ".provenance.json")
        if sidecar.is_file():  # where the source came from (a harvest names its requests); goes into the manifest
            out[-1]["provenance"] = json.loads(sidecar.read_text(encoding="utf-8"))
    return out


def load_blocklist(data: DataConfig, home: Path):
    """The compiled blocklist (or None): a bad file fails here, before any record is processed."""
    spec = data.filters.blocklist
    if spec is None:
        return None
    from mlops.data.blocklist import load

    return load(spec.path, _resolve(home, spec.path), spec.case_sensitive)


def perplexity_model(name: str | None, base: dict) -> dict:
    """The scoring model of data.filters.perplexity (a catalog entry: name, id, path); unset: the base model."""
    if name is None:
        return base
    from mlops.base_models import ensure_base_model

    try:
        return ensure_base_model(name)
    except MLOpsError as err:
        raise ConfigError(f"data.filters.perplexity.model '{name}': {err}") from None


def pipeline_hash(data: DataConfig, seed: int) -> str:
    blob = json.dumps({"data": canonical(data), "seed": seed, "pipeline_version": PIPELINE_VERSION},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def prepare(cfg: Any) -> Inputs:
    from mlops.base_models import ensure_base_model
    from mlops.data.tokenize import tokenizer_info
    from mlops.paths import project_home, snapshots_dir

    data: DataConfig = require_section(cfg, "data")
    home = project_home()
    root = _resolve(home, data.output_dir) if data.output_dir else snapshots_dir()
    model = ensure_base_model(cfg.base_model)
    tokenizer = tokenizer_info(model["path"], model["name"], model["id"])
    sources = describe_sources(data, home)
    files, unmatched = resolve_eval_sets(data.decontam.eval_sets, home)
    eval_files = [{"name": str(p.relative_to(home)) if p.is_relative_to(home) else str(p), "path": p,
                   "sha256": file_sha256(p)} for p in files]
    priors = [(sid, resolve_snapshot(sid, root)) for sid in data.dedup.against_snapshots]
    priors = [(p.name, p) for _, p in priors]
    history = None
    if data.mix.history is not None:
        path = resolve_snapshot(data.mix.history.snapshot, root)
        history = (path.name, path)
        if history[0] not in [sid for sid, _ in priors]:
            priors.append(history)  # what the history holds is already seen by the model
    inputs = Inputs(cfg, data, cfg.run.seed, home, root, model, tokenizer, sources, eval_files, unmatched,
                    priors, history, pipeline_hash(data, cfg.run.seed), blocklist=load_blocklist(data, home))
    if data.filters.perplexity.enabled:
        inputs.extra["perplexity_model"] = perplexity_model(data.filters.perplexity.model, model)
    inputs.key = build_key(inputs)
    return inputs


def build_key(inputs: Inputs) -> str:
    key = {
        "pipeline": inputs.pipeline_hash,
        "tokenizer": inputs.tokenizer["hash"],
        "sources": [s["sha256"] for s in inputs.sources],
        "eval_sets": [[e["name"], e["sha256"]] for e in inputs.eval_files],
        "priors": [sid for sid, _ in inputs.priors],
    }
    if inputs.blocklist is not None:  # the list's content, not only its path (absent: earlier keys still hold)
        key["blocklist"] = inputs.blocklist.sha256
    if "perplexity_model" in inputs.extra:  # its weights decide what the filter keeps
        key["perplexity_model"] = inputs.extra["perplexity_model"]["id"]
    blob = json.dumps(key, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def cached_snapshot(inputs: Inputs) -> Path | None:
    """The snapshot an identical earlier build produced, if it is still complete."""
    record = inputs.root / BUILDS / f"{inputs.key}.json"
    try:
        snapshot_id = json.loads(record.read_text())["snapshot_id"]
    except (OSError, ValueError, KeyError):
        return None
    folder = inputs.root / snapshot_id
    return folder if read_manifest(folder) is not None else None


def remember_build(inputs: Inputs, snapshot_id: str) -> None:
    folder = inputs.root / BUILDS
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / f"{inputs.key}.json", {"snapshot_id": snapshot_id, "key": inputs.key})


def source_entries(inputs: Inputs) -> list[dict]:
    return [{k: v for k, v in s.items() if k != "path"} for s in inputs.sources]
