"""Layer 4 (acts' helpers): the bytes a version is, bound to the ledger.

Registration records a digest manifest of the whole model folder (weights, tokenizer, config, chat template and
deployment profile) in the registrar's signed entry. Every consumer that loads a registered version (serve,
`--follow`, shadow, canary, eval, spot-check, rollback) has `verify_files` compare the folder it is about to load
with that manifest, every time, cached copies included: MLflow's `source`, tags and artifact store can be written
by anyone with MLflow access, the signed ledger cannot. A mismatch names the file and refuses the load.
"""

from __future__ import annotations

from pathlib import Path

from mlops.errors import MLOpsError, NotFoundError
from mlops.lineage import Tag
from registry.rules import RefusedError


class TamperedArtifact(MLOpsError):
    """The files at hand are not the bytes the ledger's signed registration names."""


def manifest_of(folder: Path) -> dict:
    """The registration evidence for a model folder: every file's sha256 and the digest of that list."""
    from mlops.files import file_manifest
    from registry.entries import digest_of

    files = file_manifest(folder)
    return {"files": files, "files_digest": digest_of(files)}


def manifest_problems(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    problems = [f"{name} is missing" for name in sorted(set(expected) - set(actual))]
    problems += [f"{name} was added" for name in sorted(set(actual) - set(expected))]
    problems += [f"{name} has sha256 {actual[name][:12]}, the ledger names {expected[name][:12]}"
                 for name in sorted(set(expected) & set(actual)) if expected[name] != actual[name]]
    return problems


def verify_files(model: str, version: str, folder: Path, *, url: str | None = None) -> None:
    """Refuse `folder` unless its files are exactly what the ledger's registration of model/version names."""
    from registry.resolve import present, verified_state

    if not present(url):
        return  # no registry in this store: nothing was ever promised about these bytes
    state = verified_state(model, url=url)
    vs = state.versions.get(str(version))
    if vs is None:
        raise TamperedArtifact(f"version {version} of '{model}' is not in the registry's ledger, so its files cannot "
                               "be checked against a signed registration and are not loaded. Fix: register the run "
                               f"with `mlops registry register --run <run_id> --name {model}` and use that version.")
    bad = manifest_problems(vs.evidence.get("files") or {}, manifest_of(Path(folder))["files"])
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise TamperedArtifact(f"version {version} of '{model}' at {folder} is not what its signed registration "
                               f"names: {bad[0]}{more} (the artifacts were altered). Nothing was loaded; a running server stays on its last "
                               "verified version. Fix: restore the artifact store from a backup, or register "
                               "and release a new version.")


def packaged_gguf(content_id: str, quantization: str, *, url: str | None = None) -> dict | None:
    """The signed package of these weights in this quantization that serving must load: {sha256, run,
    llamacpp_version, model, version, seq}. For a version past candidate, the one its approval fixed (a later
    package changes nothing it serves); for a candidate, its newest. None when none applies (or no registry)."""
    from registry.ledger import verified
    from registry.resolve import present, state_in

    if not present(url):
        return None
    entries = verified(url).entries
    found = [e for e in entries if e.action == "package"
             and e.evidence.get("content_id") == content_id and e.evidence.get("quantization") == quantization]
    if not found:
        return None
    e = found[-1]
    vs = state_in(e.model, entries).versions.get(str(e.version))
    if vs is not None and vs.stage != "candidate":
        fixed = _approved_gguf(state_in(e.model, entries), vs.version)
        e = next((p for p in found if fixed and p.seq == fixed.get("seq")), None)
        if e is None:
            return None
    return {**{k: e.evidence.get(k) for k in ("sha256", "run", "llamacpp_version")}, "model": e.model,
            "version": e.version, "seq": e.seq}


def _approved_gguf(state, version: str) -> dict | None:
    approved = [r for r in state.requests if r.version == str(version) and r.to_stage == "production"
                and r.status in ("approved", "consumed")]
    return approved[-1].decision.get("gguf") if approved else None


def record_package(actor, model: str, version: str, *, sha256: str, quantization: str, llamacpp_version: str,
                   run_id: str, url: str | None = None):
    """Packaging a version's GGUF is a signed act with its attestation (subject: the GGUF; material: the version's
    files): its sha256 and quantization go into the ledger, and every server checks the file it loads against
    them. Only a candidate is packaged: an approval fixes the bytes a release serves."""
    from mlops.identities import require
    from registry.attest_store import record
    from registry.attestation import attest
    from registry.transition import Plan, run

    require(actor, "register")
    signed: list[dict] = []

    def packable(state):
        vs = state.versions.get(str(version))
        if vs is None:
            raise RefusedError(f"version {version} of '{model}' is not in the ledger; only a registered version is "
                               "packaged. Fix: register it first.")
        if vs.stage != "candidate":
            raise RefusedError(f"version {version} of '{model}' is {vs.stage}: the GGUF it serves was fixed at its "
                               "approval. Nothing was changed. Fix: register the weights as a new version, and "
                               "package, gate and approve that.")
        return vs

    def prepare(state):  # before the ledger transaction: the attestation store is another write
        vs = packable(state)
        predicate = {"files_digest": vs.evidence.get("files_digest"), "content_id": vs.content_id,
                     "quantization": quantization, "llamacpp_version": llamacpp_version, "run": run_id}
        envelope = attest(actor.signer, "package", {f"model-{quantization}.gguf": sha256}, predicate,
                          {"model-files": vs.evidence.get("files_digest") or ""})
        record(envelope, "package", sha256, actor.name, url=url)
        signed[:] = [envelope]

    def plan_for(state):
        vs, envelope = packable(state), signed[0]
        return Plan(entries=[dict(actor=actor.name, action="package", model=model, version=str(version),
                                  reason=f"GGUF {quantization} by llama.cpp {llamacpp_version}",
                                  evidence={"sha256": sha256, "quantization": quantization, "run": run_id,
                                            "llamacpp_version": llamacpp_version, "content_id": vs.content_id,
                                            "attestations": {"package": envelope}})])

    return run(model, plan_for, url=url, actor=actor, prepare=prepare)[0]


def check_artifacts(model: str, version_state) -> dict:
    """Before a rollback: the version's files are the registered bytes and its checkpoint manifest is there.

    Returns what was checked; raises RefusedError naming what is missing or altered.
    """
    from mlops.model_refs import resolve_model_ref
    from mlops.run_store import load_run_json

    version = version_state.version
    try:
        resolved = resolve_model_ref(f"models:/{model}/{version}")  # checks the files against the ledger
    except TamperedArtifact as err:
        raise RefusedError(f"version {version} of '{model}' cannot be restored: {err}") from None
    except NotFoundError as err:
        raise RefusedError(f"version {version} of '{model}' cannot be restored: its model artifacts are missing "
                           f"({err}). Nothing was changed. Fix: roll back to another version with --to.") from None
    manifest_uri = version_state.evidence.get("lineage", {}).get(Tag.CHECKPOINT_MANIFEST, "")
    checked = {"content_id": resolved.key, "files_digest": version_state.evidence.get("files_digest"),
               "checkpoint_manifest": manifest_uri}
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
