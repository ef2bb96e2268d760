"""Before a version goes back into production: its artifacts exist and are the bytes that were registered."""

from __future__ import annotations

from mlops.errors import NotFoundError
from mlops.lineage import Tag
from registry.transition import RefusedError


def check_artifacts(model: str, version_state) -> dict:
    """The model's files hash to the content id recorded at registration, and its checkpoint manifest is there.

    Returns what was checked; raises RefusedError naming what is missing or altered.
    """
    from mlops.model_refs import materialize, model_content_id
    from mlops.run_store import load_run_json

    version = version_state.version
    ref = f"models:/{model}/{version}"
    try:
        resolved = materialize(ref)
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
