"""Model versions: resolve a model ref to a local HF folder with its profile and lineage; register and tag versions.

A model ref is one of:
- `models:/<name>@<alias>`   a registered model version by alias (e.g. `models:/support-bot@production`)
- `models:/<name>/<version>` a registered model version by number
- `runs:/<run_id>/<path>`    a model logged by a run (training logs `runs:/<run>/model`)
- a local HF folder          (config.json inside), or a downloaded MLflow model folder

Reading and registry calls live here; logging to runs stays in `mlops.tracking`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlops.errors import MLOpsError, NotFoundError
from mlops.lineage import Tag

MODELS_RE = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")
RUNS_RE = re.compile(r"^runs:/(?P<run>[0-9a-zA-Z]+)/(?P<path>.+)$")
REF_FORMS = "models:/<name>@<alias>, models:/<name>/<version>, runs:/<run_id>/model or a local HF folder"


@dataclass(frozen=True)
class ResolvedModel:
    """A model ref made concrete: where its HF folder is and where it came from."""

    ref: str
    hf_dir: Path
    kind: str  # "version", "run" or "folder"
    name: str | None = None
    version: str | None = None
    run_id: str | None = None
    run_tags: dict[str, str] = field(default_factory=dict)
    version_tags: dict[str, str] = field(default_factory=dict)

    @property
    def served_name(self) -> str:
        """The model id the server answers to."""
        if self.kind == "version":
            return f"{self.name}/{self.version}"
        if self.kind == "run":
            return f"run-{self.run_id}"
        return self.hf_dir.name

    @property
    def key(self) -> str:
        """A filesystem-safe identity of this model version (caches and eval-run lookups key on it)."""
        if self.kind == "version":
            return f"{self.name}-v{self.version}"
        if self.kind == "run":
            return f"run-{self.run_id}"
        from mlops.base_models import folder_hash

        return f"folder-{folder_hash(self.hf_dir)[:16]}"

    @property
    def snapshot_id(self) -> str | None:
        return self.version_tags.get(Tag.SNAPSHOT_ID) or self.run_tags.get(Tag.SNAPSHOT_ID)

    def profile(self):
        from evaluation.profile import load_profile

        return load_profile(self.hf_dir)


def _client():
    from mlflow import MlflowClient

    from mlops.tracking import tracking_uri

    return MlflowClient(tracking_uri=tracking_uri())


def find_hf_folder(root: Path, depth: int = 3) -> Path:
    """The HF folder inside a downloaded model tree (the pyfunc layout puts it under artifacts/)."""
    if (Path(root) / "config.json").exists():
        return Path(root)  # a plain HF folder: no need to import mlflow's pyfunc machinery
    from mlops.hf_pyfunc import hf_folder_in

    try:
        return hf_folder_in(root)
    except FileNotFoundError:
        if depth <= 0:
            raise
    for child in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        try:
            return find_hf_folder(child, depth - 1)
        except FileNotFoundError:
            continue
    raise FileNotFoundError(f"no HF model folder (config.json) inside {root}")


def _download(uri: str) -> Path:
    import mlflow

    from mlops.tracking import tracking_uri

    # Local artifact stores are returned in place; remote ones are copied once per call.
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, tracking_uri=tracking_uri()))


def _model_version(client, name: str, alias: str | None, version: str | None, ref: str):
    from mlflow.exceptions import MlflowException

    try:
        if alias:
            return client.get_model_version_by_alias(name, alias)
        return client.get_model_version(name, version)
    except MlflowException as err:
        known = _known_versions(client, name)
        raise NotFoundError(
            f"model ref '{ref}' does not exist ({str(err).splitlines()[0]}). {known}"
            f"Fix: pass an existing {REF_FORMS}."
        ) from None


def _known_versions(client, name: str) -> str:
    try:
        versions = client.search_model_versions(f"name='{name}'")
        model = client.get_registered_model(name)
    except Exception:  # noqa: BLE001 - the model itself is unknown
        return f"There is no registered model '{name}'. "
    aliases = ", ".join(f"@{a}" for a in sorted(model.aliases or {})) or "none"
    numbers = ", ".join(sorted((str(v.version) for v in versions), key=int)) or "none"
    return f"Model '{name}' has versions {numbers} and aliases {aliases}. "


def resolve_model_ref(ref: str) -> ResolvedModel:
    """Resolve a ref to a local HF folder plus lineage; a ref that does not exist fails before any work."""
    ref = str(ref).strip()
    if match := MODELS_RE.match(ref):
        client = _client()
        mv = _model_version(client, match["name"], match["alias"], match["version"], ref)
        hf_dir = find_hf_folder(_download(mv.source))
        run_tags = dict(client.get_run(mv.run_id).data.tags) if mv.run_id else {}
        return ResolvedModel(ref, hf_dir, "version", mv.name, str(mv.version), mv.run_id, run_tags, dict(mv.tags))
    if match := RUNS_RE.match(ref):
        client = _client()
        try:
            run = client.get_run(match["run"])
        except Exception as err:  # noqa: BLE001 - MLflow raises several kinds for an unknown run id
            raise NotFoundError(
                f"model ref '{ref}' names run '{match['run']}', which does not exist "
                f"({str(err).splitlines()[0]}). Fix: pass an existing {REF_FORMS}."
            ) from None
        try:
            hf_dir = find_hf_folder(_download(ref))
        except Exception as err:  # noqa: BLE001
            raise NotFoundError(
                f"model ref '{ref}': run {match['run']} has no model at '{match['path']}' ({err}). "
                f"Fix: pass the model's artifact path, usually runs:/<run_id>/model."
            ) from None
        return ResolvedModel(ref, hf_dir, "run", run_id=run.info.run_id, run_tags=dict(run.data.tags))
    folder = Path(ref).expanduser()
    if folder.is_dir():
        try:
            return ResolvedModel(ref, find_hf_folder(folder.resolve()), "folder")
        except FileNotFoundError:
            pass
    raise NotFoundError(f"model ref '{ref}' is neither a model URI nor an HF model folder. Fix: pass {REF_FORMS}.")


def register_model_version(
    run_id: str, name: str, *, artifact_path: str = "model", alias: str | None = None, tags: dict | None = None
) -> str:
    """Register a run's logged model as a new version that carries the run's lineage and deployment profile.

    Returns the new version number.
    """
    import mlflow

    from evaluation.profile import load_profile
    from mlops.tracking import tracking_uri

    client = _client()
    run = client.get_run(run_id)
    hf_dir = find_hf_folder(_download(f"runs:/{run_id}/{artifact_path}"))
    profile = load_profile(hf_dir)
    lineage = {k: v for k, v in run.data.tags.items() if k.startswith("mlops.") and k != Tag.FAILURE_REASON}
    version_tags = {
        **lineage,
        Tag.SOURCE_RUN: run_id,
        Tag.PROFILE_HASH: profile.profile_hash(),
        Tag.PROFILE: profile.to_yaml(),
        **(tags or {}),
    }
    mlflow.set_tracking_uri(tracking_uri())
    mv = mlflow.register_model(f"runs:/{run_id}/{artifact_path}", name, tags={k: str(v) for k, v in version_tags.items()})
    if alias:
        client.set_registered_model_alias(name, alias, mv.version)
    return str(mv.version)


def set_alias(name: str, alias: str, version: str) -> None:
    _client().set_registered_model_alias(name, alias, str(version))


def set_version_tags(model: ResolvedModel, tags: dict[str, Any]) -> bool:
    """Tag a model version (gate results, contamination, eval runs). False for refs that are not versions."""
    if model.kind != "version":
        return False
    client = _client()
    for key, value in tags.items():
        client.set_model_version_tag(model.name, model.version, str(key), str(value)[:5000])
    return True


def version_tags(name: str, version: str) -> dict[str, str]:
    return dict(_client().get_model_version(name, str(version)).tags)


def previous_versions(model: ResolvedModel, tag: str, value: str, limit: int) -> list[str]:
    """Refs of earlier versions of the same model whose `tag` equals `value`, newest first."""
    if model.kind != "version" or limit <= 0:
        return []
    versions = _client().search_model_versions(f"name='{model.name}'")
    older = [v for v in versions if int(v.version) < int(model.version) and v.tags.get(tag) == value]
    older.sort(key=lambda v: int(v.version), reverse=True)
    return [f"models:/{model.name}/{v.version}" for v in older[:limit]]


def require_ref(ref: str | None, what: str) -> str:
    if not ref or not str(ref).strip():
        raise MLOpsError(f"no {what} model given. Fix: pass {REF_FORMS}.")
    return str(ref).strip()


def latest_run(tags: dict[str, str], status: str = "FINISHED", having: tuple[str, ...] = ()) -> str | None:
    """Id of the newest run, in any experiment, carrying all `tags` (and every tag in `having`, any value)."""
    client = _client()
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return None
    clauses = [f"tags.`{k}` = '{v}'" for k, v in tags.items()] + [f"tags.`{k}` LIKE '%'" for k in having]
    clauses.append(f"attributes.status = '{status}'")
    runs = client.search_runs(experiments, " and ".join(clauses), order_by=["attributes.start_time DESC"],
                              max_results=1)
    return runs[0].info.run_id if runs else None


def load_run_json(run_id: str, artifact_path: str) -> dict:
    """A JSON artifact of a run (e.g. an eval run's `eval/summary.json`)."""
    import json

    import mlflow

    from mlops.tracking import tracking_uri

    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_path, tracking_uri=tracking_uri())
    return json.loads(Path(local).read_text())
