"""A version's lineage as the Version page shows it: pure functions from stored tags and manifests to rows."""

from __future__ import annotations

from mlops.lineage import Tag


def _flag(value: str | None) -> str:
    return {"true": "yes", "false": "no"}.get(str(value).lower(), str(value) if value else "unknown")


def training_facts(tags: dict[str, str], run: dict | None) -> list[tuple[str, str]]:
    """What a release manager checks about how a model was made, in order."""
    image = tags.get(Tag.IMAGE_TAG) or "unknown"
    mutable = tags.get(Tag.IMAGE_TAG_MUTABLE)
    commit = tags.get(Tag.GIT_COMMIT) or "unknown"
    rows = [
        ("config hash", tags.get(Tag.CONFIG_HASH) or "missing"),
        ("base model", f"{tags.get(Tag.BASE_MODEL) or '?'} ({tags.get(Tag.BASE_MODEL_ID) or 'no id'})"),
        ("seed", tags.get(Tag.SEED) or "missing"),
        ("image tag", f"{image} ({'MUTABLE: may not be reproducible' if mutable == 'true' else 'immutable'})"
         if mutable else image),
        ("git commit", f"{commit[:12]} ({'DIRTY tree' if tags.get(Tag.GIT_DIRTY) == 'true' else 'clean tree'})"
         if tags.get(Tag.GIT_DIRTY) else commit[:12]),
        ("code version", tags.get(Tag.CODE_VERSION) or "unknown"),
        ("trained by", f"{tags.get(Tag.ACTOR) or 'unknown'}"
         + (" (password-verified)" if tags.get(Tag.ACTOR_VERIFIED) == "true" else "")),
        ("release mode", _flag(tags.get(Tag.RELEASE))),
    ]
    extra = [("train mode", Tag.TRAIN_MODE), ("world size", Tag.WORLD_SIZE), ("ZeRO stage", Tag.ZERO_STAGE),
             ("stopped because", Tag.STOP_REASON), ("resumed from", Tag.RESUMED_FROM)]
    rows += [(label, tags[tag]) for label, tag in extra if tags.get(tag)]
    if run:
        rows.append(("run status", run["status"]))
    return rows


def manifest_summary(manifest: dict) -> dict:
    """Snapshot manifest in brief: sizes, the GE gate per batch, what was quarantined and why."""
    counters = manifest.get("counters", {})
    batches = manifest.get("batches", [])
    return {
        "snapshot_id": manifest.get("snapshot_id"),
        "name": manifest.get("name"),
        "created": manifest.get("created_at"),
        "samples": manifest.get("counts", {}).get("samples", {}),
        "gate": manifest.get("gate", {}),
        "batches": [{"batch": b.get("batch"), "status": b.get("status"), "records": b.get("records"),
                     "domains": ", ".join(f"{k}:{v}" for k, v in (b.get("domains") or {}).items()),
                     "failed expectations": ", ".join(_expectation(f) for f in b.get("failed") or []) or "—",
                     "report": b.get("report") or ""} for b in batches],
        "quarantine": {
            "batches quarantined by GE": sum(b.get("status") == "quarantined" for b in batches),
            "records in quarantined batches": sum(b.get("records", 0) for b in batches
                                                  if b.get("status") == "quarantined"),
            "bad input rows": (manifest.get("issues") or {}).get("count", 0),
            "eval-overlap rows removed": (manifest.get("decontam") or {}).get("hits", 0),
        },
        "counters": dict(sorted(counters.items())),
    }


def _expectation(failed) -> str:
    if isinstance(failed, dict):
        name = failed.get("expectation") or failed.get("type") or "?"
        column = failed.get("column")
        return f"{name}({column})" if column else str(name)
    return str(failed)


def run_path(uri: str | None) -> tuple[str, str] | None:
    """(run id, artifact path) of a `runs:/<id>/<path>` URI."""
    if not uri or not uri.startswith("runs:/"):
        return None
    run_id, _, path = uri.removeprefix("runs:/").partition("/")
    return (run_id, path) if run_id and path else None


def checkpoint_rows(manifest: dict) -> list[dict]:
    files = manifest.get("files") or {}
    if isinstance(files, dict):
        return [{"file": name, "sha256": str(digest)[:16]} for name, digest in sorted(files.items())]
    return [{"file": str(f.get("name", f)), "sha256": str(f.get("sha256", ""))[:16]} for f in files]


def sweep_trial(tags: dict[str, str]) -> dict | None:
    if not tags.get(Tag.SWEEP_STUDY) and not tags.get(Tag.SWEEP_TRIAL):
        return None
    return {"study": tags.get(Tag.SWEEP_STUDY), "trial": tags.get(Tag.SWEEP_TRIAL),
            "state": tags.get(Tag.SWEEP_TRIAL_STATE), "parent run": tags.get(Tag.PARENT_RUN),
            "storage": tags.get(Tag.SWEEP_STORAGE)}


def gate_row(result: dict) -> dict:
    if result["passed"]:
        verdict = "passed"
    elif result.get("overridden_by"):
        o = result["overridden_by"]
        verdict = f"OVERRIDDEN by {o.get('by')}: {o.get('reason')}"
    else:
        verdict = "FAILED"
    evidence = ", ".join(f"{k}={v}" for k, v in (result.get("evidence") or {}).items() if v not in (None, [], ""))
    return {"gate": result["gate"], "result": verdict, "why": result["detail"], "evidence": evidence}
