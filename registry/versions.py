"""Layer 3 (MLflow's side of a registration): registering and listing model versions. Resolving refs lives in the core (`mlops.model_refs`).

A version carries its run's lineage tags, its content id and its deployment profile (hash and YAML) as tags, so
`describe` can say everything about it without downloading a byte of weights.
"""

from __future__ import annotations

from mlops.lineage import Tag
from mlops.model_refs import ModelDescription, find_hf_folder
from mlops.profile import PROFILE_FILE
from mlops.tracking import call, client, is_missing, unavailable


def _run_profile(run_id: str, artifact_path: str):
    """The deployment profile a training run logged beside its model; the model folder's own as a fallback."""
    from mlops.model_refs import download
    from mlops.profile import load_profile, read_profile

    try:
        return read_profile(download(f"runs:/{run_id}/deployment_profile/{PROFILE_FILE}"))
    except Exception as err:  # the small artifact is missing (older runs): read the model folder's own
        if not (is_missing(err) or isinstance(err, FileNotFoundError)):
            raise unavailable(err, f"the deployment profile of run {run_id}") from err
    return load_profile(find_hf_folder(download(f"runs:/{run_id}/{artifact_path}")))


def register_model_version(run_id: str, name: str, *, artifact_path: str = "model", tags: dict | None = None) -> str:
    """Register a run's logged model as a new MLflow version that carries the run's lineage and deployment profile.

    Returns the new version number. Only `registry.release.register` calls this for governed models (under the
    act lock, then ledgered); it moves no alias.
    """
    import mlflow

    from mlops.model_refs import model_content_id
    from mlops.tracking import use_store

    c = client()
    run = call(f"run {run_id}", c.get_run, run_id, missing=f"run {run_id} does not exist")
    profile = _run_profile(run_id, artifact_path)
    lineage = {k: v for k, v in run.data.tags.items() if k.startswith("mlops.") and k != Tag.FAILURE_REASON}
    if Tag.MODEL_ID not in lineage:  # runs logged before content ids: hash the folder once, here
        from mlops.model_refs import download

        lineage[Tag.MODEL_ID] = model_content_id(find_hf_folder(download(f"runs:/{run_id}/{artifact_path}")))
    version_tags = {
        **lineage,
        Tag.SOURCE_RUN: run_id,
        Tag.PROFILE_HASH: profile.profile_hash(),
        Tag.PROFILE: profile.to_yaml(),
        **(tags or {}),
    }
    use_store()
    str_tags = {k: str(v) for k, v in version_tags.items()}
    mv = _create_retrying(name, lambda: mlflow.register_model(f"runs:/{run_id}/{artifact_path}", name,
                                                              tags=str_tags))
    return str(mv.version)


def _create_retrying(name: str, create, attempts: int = 6):
    """MLflow's create-model race: a peer creating the same registered model at the same moment makes the loser
    fail ("could not read registered model", already exists). The model exists then: retry, with backoff."""
    import random
    import time

    for attempt in range(attempts):
        try:
            return call(f"registered model '{name}'", create)
        except Exception as err:  # noqa: BLE001 - retried only while a peer's create is the likely cause
            text = str(err).lower()
            racing = any(s in text for s in ("could not read registered model", "already exists",
                                             "unique constraint", "duplicate key"))
            if not racing or attempt == attempts - 1:
                raise
            time.sleep(0.05 * (2 ** attempt) * (1 + random.random()))
    raise AssertionError("unreachable")


def version_tags(name: str, version: str) -> dict[str, str]:
    from registry.transition import flush_display

    flush_display()  # this process's pending display copies first
    mv = call(f"model version {name}/{version}", client().get_model_version, name, str(version),
              missing=f"model version {name}/{version} does not exist")
    return dict(mv.tags)


def describe_versions(name: str) -> list[ModelDescription]:
    """Every version of a registered model, newest first, from registry tags alone (no run reads, no downloads)."""
    from registry.transition import flush_display

    flush_display()  # this process's pending display copies first
    c = client()
    model = call(f"registered model '{name}'", c.get_registered_model, name,
                 missing=f"there is no registered model '{name}'")
    by_version: dict[str, list[str]] = {}
    for alias, version in (model.aliases or {}).items():
        by_version.setdefault(str(version), []).append(alias)
    versions = _all_versions(c, name)
    versions.sort(key=lambda v: int(v.version), reverse=True)
    return [ModelDescription(f"models:/{name}/{v.version}", "version", name, str(v.version), v.run_id, {},
                             dict(v.tags), tuple(sorted(by_version.get(str(v.version), []))), v.source)
            for v in versions]


def _all_versions(c, name: str) -> list:
    found, token = [], None
    while True:
        page = call(f"versions of '{name}'", lambda t=token: c.search_model_versions(
            f"name='{name}'", max_results=1000, page_token=t))
        found += list(page)
        token = getattr(page, "token", None)
        if not token:
            return found
