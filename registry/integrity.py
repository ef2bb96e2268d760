"""Before a version goes back into production: its artifacts exist and are the bytes that were registered."""

from __future__ import annotations

import functools

from mlops.errors import NotFoundError
from mlops.lineage import Tag
from registry.transition import RefusedError


def check_artifacts(model: str, version_state) -> dict:
    """The model's files hash to the content id recorded at registration, and its checkpoint manifest is there.

    Returns what was checked; raises RefusedError naming what is missing or altered.
    """
    from mlops.model_refs import ModelDescription, materialize, model_content_id
    from mlops.run_store import load_run_json
    from mlops.tracking import tracking_uri

    version = version_state.version
    ref = f"models:/{model}/{version}"
    try:
        # The version's files only: its tags and its run's are not needed to hash them (one read, not four).
        run_id, source = _version_source(tracking_uri(), model, str(version))
        resolved = materialize(ModelDescription(ref, "version", model, str(version), run_id, source=source))
    except NotFoundError as err:
        raise RefusedError(f"version {version} of '{model}' cannot be restored: its model artifacts are missing "
                           f"({err}). Nothing was changed. Fix: roll back to another version with --to.") from None
    expected = version_state.content_id
    actual = model_content_id(resolved.hf_dir)
    if expected and actual != expected:
        raise RefusedError(f"version {version} of '{model}' cannot be restored: its files hash to {actual}, but "
                           f"{expected} was registered (the artifacts were altered). Nothing was changed. Fix: roll "
                           "back to another version with --to, and investigate the artifact store.")
    manifest_uri = version_state.evidence.get("lineage", {}).get(Tag.CHECKPOINT_MANIFEST, "")
    checked = {"content_id": actual, "checkpoint_manifest": manifest_uri}
    if manifest_uri.startswith("runs:/"):
        run_id, _, path = manifest_uri.removeprefix("runs:/").partition("/")
        try:
            manifest = load_run_json(run_id, path)
        except NotFoundError:
            raise RefusedError(f"version {version} of '{model}' cannot be restored: its checkpoint manifest "
                               f"{manifest_uri} is missing. Nothing was changed. Fix: roll back to another version "
                               "with --to.") from None
        checked["checkpoint_step"] = manifest.get("step")
        checked["checkpoint_files"] = len(manifest.get("files", {}))
    return checked


@functools.lru_cache(maxsize=1024)
def _version_source(store: str, model: str, version: str) -> tuple[str, str]:
    """(run id, source) of a model version: MLflow never changes either once the version exists, so they are read
    once per process; the files they point to are hashed on every check."""
    from mlops.tracking import call, client

    mv = call(f"model version {model}/{version}", client().get_model_version, model, version,
              missing=f"model version {model}/{version} does not exist")
    return mv.run_id, mv.source
