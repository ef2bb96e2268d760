"""Registering and listing model versions. Resolving refs lives in the core (`mlops.model_refs`).

A version carries its run's lineage tags, its content id and its deployment profile (hash and YAML) as tags, so
`describe` can say everything about it without downloading a byte of weights.
"""

from __future__ import annotations

from mlops.lineage import Tag
from mlops.model_refs import ModelDescription, call, client, find_hf_folder, is_missing, unavailable
from mlops.profile import PROFILE_FILE


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


def register_model_version(
    run_id: str, name: str, *, artifact_path: str = "model", alias: str | None = None, tags: dict | None = None
) -> str:
    """Register a run's logged model as a new version that carries the run's lineage and deployment profile.

    Returns the new version number.
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
    mv = call(f"registered model '{name}'",
              lambda: mlflow.register_model(f"runs:/{run_id}/{artifact_path}", name, tags=str_tags))
    if alias:
        set_alias(name, alias, str(mv.version))
    return str(mv.version)


def set_alias(name: str, alias: str, version: str) -> None:
    call(f"registered model '{name}'", client().set_registered_model_alias, name, alias, str(version))


def version_tags(name: str, version: str) -> dict[str, str]:
    from registry.transition import flush_display

    flush_display()  # this process's pending display copies first
    mv = call(f"model version {name}/{version}", client().get_model_version, name, str(version),
              missing=f"model version {name}/{version} does not exist")
    return dict(mv.tags)


def describe_versions(name: str) -> list[ModelDescription]:
    """Every version of a registered model, newest first, from registry tags alone (no run reads, no downloads)."""
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
