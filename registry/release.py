"""Layer 4 (acts): governed release actions: register, request, approve, reject, promote, rollback, override, reconcile.

Every rule lives here; the CLI and the approval app only call these functions and show what they say. Each
action names its actor (an authenticated `Identity`), is checked against the role table, the lifecycle table,
the four-eyes rule and the gates, and is written as ledger entries by `registry.transition.run`, which also moves
aliases compare-and-set. A refusal raises and leaves registry and ledger exactly as they were.

Each action's checks are one pure function, `plan_<action>(actor, state, ...)`, that returns what the action
would write or raises its refusal; `registry.permissions` asks the same functions whether a button may be pressed.
"""

from __future__ import annotations

from mlops.identities import Identity, require
from mlops.lineage import Tag
from registry.state import ALIAS_OF_STAGE, DISPLACED_TO, TRANSITIONS, ModelState
from registry.transition import STAGE_TAG, ConcurrentChangeError, Plan, RefusedError, run

STAGE_REASON_TAG = "registry.stage_reason"
NONE = "none"


def _version_state(state: ModelState, version: str):
    vs = state.versions.get(str(version))
    if vs is None:
        known = ", ".join(sorted(state.versions, key=int)) or "none"
        raise RefusedError(f"'{state.model}' has no version {version} in the ledger (versions: {known}). Fix: pass a "
                           f"registered version, or register it with `mlops registry register`.")
    return vs


def check_transition(state: ModelState, version: str, to_stage: str) -> None:
    current = _version_state(state, version).stage
    allowed = TRANSITIONS.get(current, frozenset())
    if to_stage not in allowed:
        raise RefusedError(f"version {version} of '{state.model}' is {current}; it may move to "
                           f"{', '.join(sorted(allowed)) or 'nothing'}, not {to_stage}. Nothing was changed.")


def four_eyes(state: ModelState, version: str, approver: Identity, request=None) -> None:
    vs = _version_state(state, version)
    roles = {"trained": vs.trainer, "registered": vs.registered_by,
             "requested": request.requester if request else None}
    conflicts = [what for what, who in roles.items() if who and who == approver.name]
    if conflicts:
        raise RefusedError(f"four-eyes rule: '{approver.name}' {' and '.join(conflicts)} version {version} of "
                           f"'{state.model}' and so may not approve it. Nothing was changed. Fix: ask another "
                           "approver.")


# --------------------------------------------------------------------------- registration


def register(actor: Identity, run_id: str, name: str, *, url: str | None = None, artifact_path: str = "model",
             tags: dict | None = None, unattested_reason: str | None = None) -> str:
    """Register a training run's model as a new version in stage `candidate`; refuses incomplete lineage and a
    run whose output no permitted trainer attested (`unattested_reason`: an admin's ledgered override).
    Idempotent on the run id; `tags` go on the new version (e.g. the sweep trial it came from)."""
    from mlops.tracking import call, client
    from registry.gates import missing_lineage
    from registry.resolve import check_model_name
    from registry.versions import register_model_version

    require(actor, "register")
    check_model_name(name)
    run_obj = call(f"run {run_id}", client().get_run, run_id, missing=f"run {run_id} does not exist. Fix: pass the "
                   "id of a finished training run (`mlops train run` prints it; the MLflow UI lists them).")
    extra_tags = tags
    tags = dict(run_obj.data.tags)
    missing = missing_lineage(tags)
    if run_obj.info.status != "FINISHED" or tags.get(Tag.STAGE) != "train":
        raise RefusedError(f"run {run_id} is a {tags.get(Tag.STAGE, 'non-training')} run in state "
                           f"{run_obj.info.status}; only a FINISHED training run can be registered.")
    if missing:
        raise RefusedError(f"run {run_id} has incomplete lineage, missing tags: {', '.join(missing)}. A version must "
                           "be traceable to its config, data, code, image and checkpoint. Fix: retrain with the "
                           "current `mlops train run` (which records them all), after building the snapshot with "
                           "a tracked `mlops data build`.")
    if unattested_reason is not None:
        require(actor, "override")
        _need_comment(unattested_reason, "unattested registration")
    evidence = {"run_id": run_id, "content_id": tags[Tag.MODEL_ID], "profile_hash": tags[Tag.PROFILE_HASH],
                "snapshot_id": tags[Tag.SNAPSHOT_ID],
                "lineage": {k: v for k, v in tags.items() if k.startswith("mlops.") and k != Tag.PROFILE},
                **_hashed_files(run_id, artifact_path, tags[Tag.MODEL_ID])}
    found: list[str] = []

    def prepare(state: ModelState) -> None:
        already = [v for v, vs in state.versions.items() if vs.evidence.get("run_id") == run_id]
        # A rerun is a no-op: one training run is one version. Under the act lock, so peers never race MLflow.
        found[:] = [already[0] if already else register_model_version(
            run_id, name, artifact_path=artifact_path, tags=extra_tags)]

    def plan_for(state: ModelState) -> Plan:
        version = found[0]
        if version in state.versions:
            return Plan()
        proof = _training_proof(state, run_id, evidence["files_digest"], unattested_reason)
        return Plan(entries=[dict(actor=actor.name, action="register", model=name, version=version,
                                  to_stage="candidate", evidence={**evidence, **proof},
                                  reason=f"from training run {run_id}")],
                    version_tags={version: {STAGE_TAG: "candidate", Tag.ACTOR: actor.name}})

    run(name, plan_for, url=url, actor=actor, prepare=prepare)
    return found[0]


def _training_proof(state: ModelState, run_id: str, files_digest: str, unattested_reason: str | None) -> dict:
    """Who trained it, as the newest permitted training attestation of exactly these files says (four-eyes
    excludes that signer); or the admin's override of a run nobody attested (four-eyes then excludes the admin)."""
    from registry.attest_store import usable
    from registry.derive import attestors_of

    if unattested_reason is not None:
        return {"trainer": None, "unattested": {"reason": unattested_reason}}
    found = next(((att, env) for att, env in usable("train", files_digest, state.users, attestors_of(state.policy))
                  if att.predicate.get("run_id") == run_id), None)
    if found is None:
        raise RefusedError(f"run {run_id} has no training attestation: nobody the release policy names for training "
                           "signed its output, so nobody is known to have trained it and four-eyes could not "
                           "exclude them. Nothing was registered. Fix: train it signed in (MLOPS_USER and "
                           "MLOPS_PASSWORD set for `mlops train run`), or an admin registers it with "
                           "`--unattested-reason \"...\"` (ledgered and shown forever).")
    att, envelope = found
    return {"trainer": att.signer, "attestations": {"train": envelope}}


def _hashed_files(run_id: str, artifact_path: str, content_id: str) -> dict:
    """The digest manifest the registrar signs: the run's model folder as it is now, hashed file by file. A run
    whose files do not hash to the content id it is tagged with is refused (it would register another model)."""
    from mlops.model_refs import materialize, model_content_id
    from registry.integrity import manifest_of

    folder = materialize(f"runs:/{run_id}/{artifact_path}").hf_dir
    actual = model_content_id(folder)
    if actual != content_id:
        raise RefusedError(f"run {run_id} is tagged with content id {content_id}, but its model files hash to "
                           f"{actual}: the tag names another model. Nothing was registered. Fix: register the run "
                           "that trained these files, or retrain.")
    return manifest_of(folder)


# --------------------------------------------------------------------------- approvals


def plan_request(actor: Identity, state: ModelState, model: str, version: str, to_stage: str,
                 comment: str | None) -> Plan:
    check_transition(state, version, to_stage)
    if state.open_request(version, to_stage):
        raise RefusedError(f"version {version} of '{model}' already has an open request to {to_stage}.")
    return Plan(entries=[dict(actor=actor.name, action="request", model=model, version=str(version),
                              from_stage=state.stage_of(version), to_stage=to_stage, reason=comment)])


def request(actor: Identity, model: str, version: str, to_stage: str, comment: str, *, url: str | None = None):
    require(actor, "request")
    _need_comment(comment, "request")
    return run(model, lambda state: plan_request(actor, state, model, version, to_stage, comment),
               url=url, actor=actor)[0]


def plan_decide(actor: Identity, state: ModelState, model: str, version: str, comment: str | None, *,
                approve: bool, gates: list | None = None) -> Plan:
    """The approval or rejection of the open request; `gates` reuses results already read (else read now)."""
    from registry.gates import attestations, evaluate_gates, evidence_digests
    from registry.rules import released_gguf

    pending = [r for r in state.pending() if r.version == str(version)]
    if not pending:
        raise RefusedError(f"version {version} of '{model}' has no pending request. Fix: request it first with "
                           f"`mlops registry request {model} {version} --to production --comment ...`.")
    req = pending[-1]
    evidence = {"request_seq": req.seq}
    if approve:
        four_eyes(state, version, actor, req)
        if req.to_stage == "production":
            results = gates if gates is not None else evaluate_gates(state, version)
            _refuse_failing(results, model, version)
            evidence["gates"] = [r.as_dict() for r in results]  # display: the replay re-derives each
            evidence["attestations"] = attestations(results)
            evidence["evidence_digests"] = evidence_digests(results)
            # The bytes production will serve, fixed now: a later package of this version needs a new approval.
            evidence["gguf"] = released_gguf(state.versions.get(str(version)))
    return Plan(entries=[dict(actor=actor.name, action="approve" if approve else "reject", model=model,
                              version=str(version), to_stage=req.to_stage, reason=comment, evidence=evidence)])


def decide(actor: Identity, model: str, version: str, comment: str, *, approve: bool, url: str | None = None):
    """Approve or reject the open request for a version. Approval needs the four-eyes rule and passing gates."""
    require(actor, "approve")
    _need_comment(comment, "approve" if approve else "reject")
    return run(model, lambda state: plan_decide(actor, state, model, version, comment, approve=approve),
               url=url, actor=actor)[0]


def plan_override(actor: Identity, state: ModelState, model: str, version: str, gate: str,
                  reason: str | None) -> Plan:
    from registry.gates import GATES

    if gate not in (*GATES, "all"):
        raise RefusedError(f"gate '{gate}' does not exist. Fix: pass one of {', '.join(GATES)} or all.")
    _version_state(state, version)
    return Plan(entries=[dict(actor=actor.name, action="override", model=model, version=str(version),
                              reason=reason, evidence={"gate": gate})],
                version_tags={str(version): {"registry.override": f"{gate} by {actor.name}: {reason}"[:4000]}})


def override(actor: Identity, model: str, version: str, gate: str, reason: str, *, url: str | None = None):
    require(actor, "override")
    _need_comment(reason, "override")
    return run(model, lambda state: plan_override(actor, state, model, version, gate, reason),
               url=url, actor=actor)[0]


# --------------------------------------------------------------------------- promotion and rollback


def plan_promote(actor: Identity, state: ModelState, model: str, version: str, to_stage: str, *,
                 expect_version: str | None = None, gates: list | None = None) -> Plan:
    """What promoting `version` to `to_stage` writes, or the refusal; `gates` reuses results already read.
    A stale `expect_version` is refused first, whatever the target; then a version that already holds the alias
    raises `AlreadyInForce` (someone, maybe this very command, did it before: nothing is written twice)."""
    from mlops.errors import AlreadyInForce
    from registry.gates import attestations, evaluate_gates
    from registry.rules import released_gguf

    alias = ALIAS_OF_STAGE.get(to_stage)
    if alias is None:
        raise RefusedError(f"promote moves a version to staging or production, not {to_stage}.")
    version = str(version)
    current = state.aliases.get(alias)
    _check_expected(model, alias, current, expect_version)
    if current == version:
        raise AlreadyInForce(f"version {version} of '{model}' already holds @{alias}; nothing was written.",
                             model=model, version=version, alias=alias)
    check_transition(state, version, to_stage)
    evidence: dict = {"displaced": current, "displaced_to": DISPLACED_TO[to_stage] if current else None}
    if to_stage == "production":
        req = state.approved_request(version, "production")
        if req is None:
            raise RefusedError(f"version {version} of '{model}' has no approved request to production. Fix: "
                               f"`mlops registry request {model} {version} --to production --comment ...`, then "
                               "an approver other than its trainer, registrar and requester approves it.")
        _refuse_changed_evidence(state, req, model, version)
        results = gates if gates is not None else evaluate_gates(state, version)
        _refuse_failing(results, model, version)
        if req.decision.get("gguf") != released_gguf(state.versions[version]):
            raise RefusedError(f"version {version} of '{model}' was packaged again after its approval, so the bytes "
                               "it would serve are not the approved ones. Nothing was changed. Fix: request and "
                               "approve it again.")
        evidence.update(request_seq=req.seq, approved_by=req.decided_by, gates=[r.as_dict() for r in results],
                        attestations=attestations(results))
    tags = {version: {STAGE_TAG: to_stage}}
    if state.versions[version].stage_reason:
        tags[version][STAGE_REASON_TAG] = ""  # the reason of an earlier rollback no longer applies
    if current:
        tags[current] = {STAGE_TAG: DISPLACED_TO[to_stage]}
    moves = {alias: (current, version)}
    # A version leaving staging for production gives up @staging in the same act.
    released = sorted(a for a, v in state.aliases.items() if v == version and a != alias)
    moves.update({a: (version, None) for a in released})
    evidence["released_aliases"] = released
    return Plan(entries=[dict(actor=actor.name, action="promote", model=model, version=version,
                              from_stage=state.stage_of(version), to_stage=to_stage, alias=alias,
                              alias_before=current, alias_after=version, evidence=evidence)],
                aliases=moves, version_tags=tags)


def promote(actor: Identity, model: str, version: str, to_stage: str, *, expect_version: str | None = None,
            url: str | None = None):
    """Move `version` into staging or production (alias and stage), compare-and-set against `expect_version`."""
    require(actor, "promote")
    return run(model, lambda state: plan_promote(actor, state, model, version, to_stage,
                                                 expect_version=expect_version), url=url, actor=actor)[0]


def plan_rollback(actor: Identity, state: ModelState, model: str, reason: str | None, *,
                  to_version: str | None = None, expect_version: str | None = None,
                  check_artifacts: bool = True) -> Plan:
    """What rolling production back writes, or the refusal. `check_artifacts=False` previews without reading
    the target's files (the action itself always checks them)."""
    from mlops.errors import AlreadyInForce
    from registry.integrity import check_artifacts as checked_artifacts
    from registry.state import rollback_target

    current = state.aliases.get("production")
    _check_expected(model, "production", current, expect_version)
    if current is None:
        raise RefusedError(f"'{model}' has no production version to roll back.")
    target = str(to_version) if to_version else rollback_target(state)
    if target is None:
        raise RefusedError(f"'{model}' has no earlier production version to roll back to (production history: "
                           f"{', '.join(state.production_stack) or 'none'}). Nothing was changed.")
    if target == current:
        raise AlreadyInForce(f"version {target} of '{model}' already holds @production; nothing was written.",
                             model=model, version=target, alias="production")
    target_state = _version_state(state, target)
    if target_state.stage != "archived":  # only a former champion: a rollback never releases an unapproved version
        raise RefusedError(f"version {target} is {target_state.stage}; a rollback brings back an earlier champion "
                           "(archived). Fix: roll back to a former production version, or release this one through "
                           "request, approval and promotion.")
    checked = checked_artifacts(model, target_state) if check_artifacts else {}
    released = sorted(a for a, v in state.aliases.items() if v == target and a != "production")
    return Plan(entries=[dict(actor=actor.name, action="rollback", model=model, version=target,
                              from_stage=target_state.stage, to_stage="production", alias="production",
                              alias_before=current, alias_after=target, reason=reason,
                              evidence={"displaced": current, "displaced_to": "rolled_back",
                                        "artifacts": checked, "released_aliases": released})],
                aliases={"production": (current, target), **{a: (target, None) for a in released}},
                version_tags={target: {STAGE_TAG: "production"},
                              current: {STAGE_TAG: "rolled_back", STAGE_REASON_TAG: (reason or "")[:4000]}})


def rollback(actor: Identity, model: str, reason: str, *, to_version: str | None = None,
             expect_version: str | None = None, url: str | None = None):
    """Move production back to the previous production version (or `to_version`) after checking its artifacts."""
    require(actor, "rollback")
    _need_comment(reason, "rollback")
    return run(model, lambda state: plan_rollback(actor, state, model, reason, to_version=to_version,
                                                  expect_version=expect_version), url=url, actor=actor)[0]


def reconcile(actor: Identity, model: str, *, url: str | None = None):
    """Make MLflow's aliases and stage tags say what the ledger says (after a crash or a hand edit); ledgered."""
    from registry.audit import drift, model_state

    require(actor, "reconcile")
    # What differed when the act was asked for: the act's own heal of lagging display copies may already have
    # rewritten some of it under the lock, which is still a reconcile to report and record.
    seen = drift(model_state(model, url=url))

    def plan_for(state: ModelState) -> Plan:
        problems = drift(state) or seen
        if not problems:
            raise RefusedError(f"'{model}': registry and ledger agree; nothing to reconcile.")
        actual = _actual_aliases(model)
        moves = {a: (actual.get(a), state.aliases.get(a)) for a in set(actual) | set(state.aliases)
                 if a in ALIAS_OF_STAGE.values() and actual.get(a) != state.aliases.get(a)}
        tags = {v: {STAGE_TAG: vs.stage} for v, vs in state.versions.items()}
        return Plan(entries=[dict(actor=actor.name, action="reconcile", model=model, reason="; ".join(problems),
                                  evidence={"fixed": problems, "aliases": {a: list(m) for a, m in moves.items()}})],
                    aliases=moves, version_tags=tags)

    return run(model, plan_for, url=url, actor=actor, repairing=True)[0]  # the one act that may start from drift


def _actual_aliases(model: str) -> dict[str, str]:
    from registry.transition import registry_aliases

    return registry_aliases(model)


def _check_expected(model: str, alias: str, current: str | None, expected: str | None) -> None:
    if expected is None:
        return
    expected = None if str(expected).lower() in (NONE, "") else str(expected)
    if expected != current:
        raise ConcurrentChangeError(
            f"{alias} of '{model}' moved from {expected or 'nothing'} to {current or 'nothing'} since you loaded it. "
            "Nothing was changed. Fix: look at `mlops registry status` and decide again."
        )


def _refuse_changed_evidence(state: ModelState, req, model: str, version: str) -> None:
    """The reports the approval stood on must still be those bytes, from finished runs."""
    from registry.gates import changed_evidence

    approvals = [e for e in state.entries if e.action == "approve" and e.evidence.get("request_seq") == req.seq]
    recorded = approvals[-1].evidence.get("evidence_digests") if approvals else None
    changed = changed_evidence(recorded or {})
    if changed:
        raise RefusedError(f"version {version} of '{model}' may not be promoted: {'; '.join(changed)} (changed, "
                           "replaced or forged since the approval). Nothing was changed. Fix: re-run the gate and "
                           "ask for a new approval.")


def _refuse_failing(results, model: str, version: str) -> None:
    from registry.gates import failing

    bad = failing(results)
    if bad:
        lines = "; ".join(f"{r.gate} gate failed: {r.detail}" for r in bad)
        raise RefusedError(f"version {version} of '{model}' fails its release gates: {lines}. Nothing was changed. "
                           f"Fix: address each, or an admin may `mlops registry override {model} {version} --gate "
                           "<gate> --reason ...` (ledgered and shown forever).")


def _need_comment(text: str | None, what: str) -> None:
    if not text or not text.strip():
        raise RefusedError(f"{'an' if what[0] in 'aeiou' else 'a'} {what} needs a comment saying why. "
                           "Fix: pass --comment \"...\" (or --reason).")
