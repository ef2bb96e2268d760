"""The trainer's signature on what a finished run produced: an in-toto training attestation (registry.attestation).

Registration takes only a run whose output files a permitted trainer attested, and four-eyes excludes that signer
from approving it: a run tag naming a trainer is no proof, a signature is. The run is signed by whoever ran it
(MLOPS_USER, unlocked with MLOPS_PASSWORD), after the final model was logged, over that model's files as the
artifact store holds them, with its lineage as materials. A rerun of a finished run signs the same statement
again, which stores nothing new.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def attest_training(result: dict) -> str | None:
    """Sign and store the training attestation of a FINISHED run that logged a final model; its id or None."""
    from registry.attest_store import attest_from_env, signed_in

    if result.get("status") != "FINISHED" or not result.get("model_uri"):
        return None
    if not signed_in():
        log.warning("run %s is not attested: it ran without an identity (MLOPS_USER, MLOPS_PASSWORD), so the "
                    "registry will not register it. Fix: train signed in as a trainer.", result.get("run_id"))
        return None
    from mlops.files import file_manifest
    from mlops.lineage import Tag
    from mlops.model_refs import materialize
    from mlops.run_store import get_run
    from registry.entries import digest_of

    run_id = result["run_id"]
    tags = dict(get_run(run_id).data.tags)
    files = file_manifest(materialize(f"runs:/{run_id}/model").hf_dir)
    predicate = {"run_id": run_id, "steps": int(result.get("steps") or 0), "content_id": tags.get(Tag.MODEL_ID),
                 **{name: tags.get(tag) for name, tag in (("config_hash", Tag.CONFIG_HASH),
                                                           ("git_commit", Tag.GIT_COMMIT),
                                                           ("image_tag", Tag.IMAGE_TAG))}}
    materials = {k: v for k, v in (("snapshot", tags.get(Tag.SNAPSHOT_ID)), ("base_model", tags.get(Tag.BASE_MODEL_ID)),
                                   ("config", tags.get(Tag.CONFIG_HASH))) if v}
    return attest_from_env("train", files, predicate, subject_key=digest_of(files), materials=materials)


def attest_job_run(run_id: str) -> str:
    """The submitter's signature on a finished service job (`mlops train attest RUN`): a job on the cluster never
    holds its submitter's key, so they sign its output afterwards, as `train run` does at its end. Only the job's
    submitter (its `mlops.submitted_by` tag) or an admin may; the statement hashes the files the store holds."""
    from mlops.errors import MLOpsError
    from mlops.identities import AuthError, from_env
    from mlops.lineage import Tag
    from mlops.run_store import get_run

    who = from_env("train")
    run = get_run(run_id)
    tags = dict(run.data.tags)
    submitter = tags.get(Tag.SUBMITTED_BY)
    if submitter is None:
        raise MLOpsError(f"run {run_id} is not a job of the training service (no {Tag.SUBMITTED_BY} tag): a local "
                         "`mlops train run` attests itself when it ends. Fix: rerun it signed in.")
    if who.name != submitter and who.role != "admin":
        raise AuthError(f"run {run_id} was submitted by {submitter}; only they or an admin may attest it.")
    if run.info.status != "FINISHED" or Tag.MODEL_ID not in tags:
        raise MLOpsError(f"run {run_id} is {run.info.status} without a final model, so there is nothing to attest. "
                         "Fix: attest a finished job that logged its model (train.final_model=true).")
    steps = int(run.data.metrics.get("steps", 0))
    ident = attest_training({"run_id": run_id, "status": "FINISHED", "model_uri": f"runs:/{run_id}/model",
                             "steps": steps})
    if ident is None:
        raise MLOpsError(f"run {run_id} was not attested: this store holds no registry. Fix: bootstrap one.")
    return ident
