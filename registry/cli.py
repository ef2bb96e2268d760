"""Layer 6 (the command line, on top): `mlops registry ...`: identities, registration, approvals, promotion, rollback, the ledger.

Acting commands read the identity from MLOPS_USER and MLOPS_PASSWORD. Every command exits non-zero on refusal
(2 refused, 3 authentication or role), and `--json` prints machine-readable output. A promote or rollback that is
already in force (the version already holds the alias) writes nothing, says so in one line ({"in_force": true,
...} with --json) and exits 4, so a script tells it from an act done now (0) and a refusal (2).
"""

from __future__ import annotations

import json
import os
import sys

import typer

app = typer.Typer(help="Governed releases: identities, register, request/approve, promote, rollback, ledger.",
                  no_args_is_help=True)
user_app = typer.Typer(help="Manage registry identities (name, role, public key; signed acts).", no_args_is_help=True)
app.add_typer(user_app, name="user")
policy_app = typer.Typer(help="The release policy in force (recorded in the ledger).", no_args_is_help=True)
app.add_typer(policy_app, name="policy")

JsonOpt = typer.Option(False, "--json", help="machine-readable output")
CommentOpt = typer.Option(..., "--comment", help="why (required; goes into the ledger)")
NEW_PASSWORD_ENV = "MLOPS_NEW_PASSWORD"


def _out(data, as_json: bool, text: str) -> None:
    from registry.transition import flush_display

    flush_display(report=True)  # an act answers once its display copies landed, or says they lag
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
        return
    # Each field people typed is escaped where it is formatted (a newline in it stays visible as \n); this pass
    # escapes any control character that a formatter let through, so no text can act on the terminal.
    from mlops.text import shown_lines

    typer.echo(shown_lines(text))


def _actor(action: str | None):
    from mlops.identities import from_env

    return from_env(action)


def _entry_text(e) -> str:
    from mlops.text import shown as q

    move = f" @{e.alias}: {e.alias_before or '-'} -> {e.alias_after or '-'}" if e.alias else ""
    stage = f" {e.from_stage or '-'} -> {e.to_stage}" if e.to_stage else ""
    return q(f"#{e.seq} {e.ts} {e.actor} {e.action} {e.model} v{e.version or '-'}{stage}{move}") + \
        (f" ({q(e.reason)})" if e.reason else "")


# --------------------------------------------------------------------------- identities


@app.command("bootstrap")
def bootstrap(admin: str = typer.Option(..., "--admin", help="name of the first admin"),
              as_json: bool = JsonOpt) -> None:
    """Create the registry in its store, once: its tables, the first admin's own signing key (sealed under the
    passphrase from MLOPS_NEW_PASSWORD, else a prompt), the admin and the release policy in force
    (configs/registry/release.yaml, else the defaults). Prints the trust root: the fingerprint every consumer
    pins as MLOPS_TRUST_ROOT (configuration, not a secret)."""
    from registry.config import project_policy
    from registry.identities import bootstrap as do
    from registry.ledger import verified
    from registry.signing import user_key_path
    from registry.trust import pinned_root

    written = do(admin, _new_password(), policy=project_policy())
    chain = verified()
    root = pinned_root(chain.registry_id, "this store")
    key = user_key_path(chain.registry_id, admin)
    _out({"admin": admin, "registry_id": chain.registry_id, "trust_root": root, "key_file": str(key),
          "entries": [e.as_dict() for e in written]}, as_json,
         f"registry {chain.registry_id} created; first admin {admin}, whose key is {key} (theirs alone: keep it "
         f"off shared machines).\ntrust root: {root}\nSet MLOPS_TRUST_ROOT={root} on every machine that acts on or "
         "serves from this registry (it is not a secret).")


def _new_password() -> str:
    password = os.environ.get(NEW_PASSWORD_ENV)
    if password:
        return password
    if not sys.stdin.isatty():
        from mlops.errors import MLOpsError

        raise MLOpsError(f"no password for the new identity. Fix: set {NEW_PASSWORD_ENV} (or run interactively to "
                         "be prompted).")
    return typer.prompt("password for the identity", hide_input=True, confirmation_prompt=True)


PublicKeyOpt = typer.Option(None, "--public-key", help="the person's own public key (`mlops registry key new` "
                            "printed it); without it a new key is sealed under MLOPS_NEW_PASSWORD on this machine")


@user_app.command("add")
def user_add(name: str, role: str = typer.Option(..., "--role", help="viewer, trainer, approver or admin"),
             public_key: str | None = PublicKeyOpt, as_json: bool = JsonOpt) -> None:
    """Add an identity with its public key (admin, MLOPS_USER); signed. Without --public-key the person's key is
    made here, sealed under MLOPS_NEW_PASSWORD (else a prompt), and its file is handed to them. The first admin is
    created by `mlops registry bootstrap`."""
    from registry.identities import add_user

    entry = add_user(_actor("manage_users"), name, role, None if public_key else _new_password(),
                     public_key=public_key)
    _out({"name": name, "role": role, "seq": entry.seq, "public_key": entry.evidence["public_key"]}, as_json,
         f"added {name} ({role}) as ledger entry #{entry.seq}" + ("" if public_key else f"; key file "
                                                                  f"{_key_file(name)} (hand it to {name})"))


def _key_file(name: str) -> str:
    from registry.ledger import verified
    from registry.signing import user_key_path

    return str(user_key_path(verified().registry_id, name))


@user_app.command("passwd")
def user_passwd(name: str, role: str | None = typer.Option(None, "--role", help="also change the role (admin)"),
                public_key: str | None = PublicKeyOpt, as_json: bool = JsonOpt) -> None:
    """Issue an identity a new key (rotate your own, or re-key anyone as an admin), sealed under
    MLOPS_NEW_PASSWORD; the old key signs nothing more. Signed."""
    from registry.identities import set_password

    identity = set_password(_actor(None), name, None if public_key else _new_password(), role=role,
                            public_key=public_key)
    _out({"name": identity.name, "role": identity.role}, as_json, f"new key of {identity.name} recorded")


key_app = typer.Typer(help="Your own signing key.", no_args_is_help=True)
app.add_typer(key_app, name="key")
trust_app = typer.Typer(help="What this machine trusts: the root fingerprint and a head not to go behind.",
                        no_args_is_help=True)
app.add_typer(trust_app, name="trust")


@key_app.command("new")
def key_new(name: str, out: str = typer.Option(..., "--out", help="where to write the key file"),
            registry_id: str = typer.Option("", "--registry-id", help="the registry it is for (optional)"),
            as_json: bool = JsonOpt) -> None:
    """Make your own key pair on your machine, sealed under MLOPS_NEW_PASSWORD; hand the printed public key to an
    admin (`mlops registry user add NAME --role ROLE --public-key KEY`). The private half never leaves the file."""
    from pathlib import Path

    from registry.signing import new_signer, write_key_file

    signer = new_signer(name)
    passphrase = _new_password()
    from mlops.identities import check_password

    check_password(passphrase, name=name)
    path = write_key_file(Path(out), signer, registry_id, passphrase)
    _out({"name": name, "public_key": signer.public_key, "fingerprint": signer.fingerprint, "key_file": str(path)},
         as_json, f"key file {path}\npublic key: {signer.public_key}\nfingerprint: {signer.fingerprint}")


@trust_app.command("show")
def trust_show(as_json: bool = JsonOpt) -> None:
    """The pinned root and the verified head (what a fresh replica's MLOPS_TRUST_ROOT and MLOPS_TRUST_HEAD take)."""
    from registry.ledger import verified

    chain = verified()
    _out({"registry_id": chain.registry_id, "trust_root": chain.root, "head": f"{chain.head_seq}:{chain.head_hash}"},
         as_json, f"registry {chain.registry_id}\nMLOPS_TRUST_ROOT={chain.root}\n"
                  f"MLOPS_TRUST_HEAD={chain.head_seq}:{chain.head_hash}")


@trust_app.command("pin")
def trust_pin(fingerprint: str, as_json: bool = JsonOpt) -> None:
    """Pin the registry's root fingerprint on this machine (instead of setting MLOPS_TRUST_ROOT)."""
    import sqlalchemy  # noqa: F401 - the store's registry id is read below

    from registry import ledger
    from registry.trust import pin_root

    db = ledger.ledger_url()
    with ledger.db_errors(db), ledger.reader(db).connect() as conn:
        registry_id = ledger.registry_id_of(conn, db)
    pin_root(registry_id, fingerprint.strip())
    _out({"registry_id": registry_id, "trust_root": fingerprint.strip()}, as_json,
         f"pinned {fingerprint.strip()} for registry {registry_id}")


@app.command("timestamp")
def timestamp(as_json: bool = JsonOpt) -> None:
    """Verify the ledger, then sign a timestamp over its head as MLOPS_USER (a role registry.freshness.signer_roles
    names; admin by default), valid for registry.freshness.hours. Run it from cron well within that: with it set,
    every read and act refuses a ledger no unexpired timestamp vouches for. Not a ledger entry."""
    from registry.freshness import signing
    from registry.timestamp import stamp

    with signing():  # signing in reads the ledger too: an expired timestamp must not stop its renewal
        actor = _actor(None)
    done = stamp(actor)
    note = "" if done["enforced"] else " (registry.freshness.hours is unset: not enforced yet)"
    _out(done, as_json, f"timestamp over entry {done['head_seq']} ({done['head_hash'][:16]}...) signed by "
                        f"{done['signer']}, valid until {done['expires']}{note}")


@user_app.command("remove")
def user_remove(name: str, as_json: bool = JsonOpt) -> None:
    """Revoke an identity (admin); ledgered."""
    from registry.identities import remove_user

    entry = remove_user(_actor("manage_users"), name)
    _out(entry.as_dict(), as_json, _entry_text(entry))


@user_app.command("list")
def user_list(as_json: bool = JsonOpt) -> None:
    """List identities and roles (never hashes), from the verified ledger."""
    from registry.identities import list_users

    users = list_users()
    _out([u.__dict__ for u in users], as_json, "\n".join(f"{u.name:20} {u.role}" for u in users))


@policy_app.command("set")
def policy_set(path: str = typer.Argument(..., help="a YAML file holding one `registry:` block"),
               as_json: bool = JsonOpt) -> None:
    """Record the release policy in force (admin); ledgered with the values it holds."""
    from pathlib import Path

    from registry.identities import set_policy

    entry = set_policy(_actor("manage_policy"), Path(path))
    _out(entry.as_dict(), as_json, _entry_text(entry))


@policy_app.command("show")
def policy_show(as_json: bool = JsonOpt) -> None:
    """The release policy in force, as the verified ledger records it."""
    import yaml

    from registry.resolve import release_policy

    policy = release_policy().model_dump(mode="json")
    _out(policy, as_json, yaml.safe_dump({"registry": policy}, sort_keys=False).rstrip())


# --------------------------------------------------------------------------- acting commands


@app.command("register")
def register(run_id: str = typer.Option(..., "--run", help="a finished training run"),
             name: str = typer.Option(..., "--name", help="registered model name"),
             unattested_reason: str = typer.Option(
                 None, "--unattested-reason", help="admin only: register a run nobody attested training (ledgered; "
                 "four-eyes then excludes the admin)"), as_json: bool = JsonOpt) -> None:
    """Register a training run's model as a new version (stage candidate); refuses incomplete lineage and a run
    whose output no permitted trainer attested."""
    from mlops.lineage import Tag
    from mlops.tracking import tracked_run
    from registry.release import register as do
    from registry.resolve import check_model_name

    check_model_name(name)  # before the stage run below, whose name carries it
    actor = _actor("register")
    # The registration is a stage run too (under `mlflow run -e register` it is MLflow's own run).
    with tracked_run("mlops", run_name=f"register {name}", tags={Tag.STAGE: "register", Tag.ACTOR: actor.name,
                                                                  Tag.SOURCE_RUN: run_id}) as stage_run:
        version = do(actor, run_id, name, unattested_reason=unattested_reason)
        stage_run.set_tags({Tag.MODEL_REF: f"models:/{name}/{version}"})
    _out({"model": name, "version": version, "stage": "candidate"}, as_json,
         f"registered run {run_id} as models:/{name}/{version} (stage candidate)")


@app.command("request")
def request(model: str, version: str, to: str = typer.Option(..., "--to", help="staging or production"),
            comment: str = CommentOpt, as_json: bool = JsonOpt) -> None:
    """Ask for a version to be approved for staging or production."""
    from registry.release import request as do

    entry = do(_actor("request"), model, version, to, comment)
    _out(entry.as_dict(), as_json, _entry_text(entry))


def _decide(model: str, version: str, comment: str, as_json: bool, approve: bool) -> None:
    from registry.release import decide

    entry = decide(_actor("approve"), model, version, comment, approve=approve)
    _out(entry.as_dict(), as_json, _entry_text(entry))


@app.command("approve")
def approve(model: str, version: str, comment: str = CommentOpt, as_json: bool = JsonOpt) -> None:
    """Approve the pending request of a version (four-eyes rule; production also needs passing gates)."""
    _decide(model, version, comment, as_json, True)


@app.command("reject")
def reject(model: str, version: str, comment: str = CommentOpt, as_json: bool = JsonOpt) -> None:
    """Reject the pending request of a version."""
    _decide(model, version, comment, as_json, False)


@app.command("promote")
def promote(model: str, version: str, to: str = typer.Option(..., "--to", help="staging or production"),
            expect_version: str | None = typer.Option(None, "--expect-version",
                                                      help="the version you saw holding the alias ('none' for none)"),
            as_json: bool = JsonOpt) -> None:
    """Move a version into staging or production, compare-and-set on the alias (exit 4: already in force)."""
    from mlops.errors import AlreadyInForce
    from registry.audit import model_state
    from registry.release import promote as do

    actor = _actor("promote")
    if expect_version is None:  # the CLI passes what it read: a change since then is refused
        expect_version = model_state(model).aliases.get(to) or "none"
    try:
        entry = do(actor, model, version, to, expect_version=expect_version)
    except AlreadyInForce as done:  # not an act of this command: never answer with the old entry as if new
        _out({"in_force": True, **done.facts, "message": str(done)}, as_json, f"already in force: {done}")
        raise typer.Exit(done.exit_code) from None
    _out(entry.as_dict(), as_json, _entry_text(entry))


@app.command("rollback")
def rollback(model: str, to_version: str | None = typer.Option(None, "--to", help="version to restore"),
             reason: str = typer.Option(..., "--reason", help="why (required; goes into the ledger)"),
             as_json: bool = JsonOpt) -> None:
    """Move production back to the previous production version (or --to), after checking its artifacts (exit 4:
    --to names the version already in production)."""
    from mlops.errors import AlreadyInForce
    from registry.audit import model_state
    from registry.release import rollback as do

    actor = _actor("rollback")
    expected = model_state(model).aliases.get("production") or "none"
    try:
        entry = do(actor, model, reason, to_version=to_version, expect_version=expected)
    except AlreadyInForce as done:
        _out({"in_force": True, **done.facts, "message": str(done)}, as_json, f"already in force: {done}")
        raise typer.Exit(done.exit_code) from None
    _out(entry.as_dict(), as_json, _entry_text(entry))


@app.command("override")
def override(model: str, version: str, gate: str = typer.Option(..., "--gate", help="lineage, data, eval, "
             "contamination, spot_check, shadow or all"), reason: str = typer.Option(..., "--reason"),
             as_json: bool = JsonOpt) -> None:
    """Let a version pass a failing gate (admin); ledgered and shown forever after."""
    from registry.release import override as do

    entry = do(_actor("override"), model, version, gate, reason)
    _out(entry.as_dict(), as_json, _entry_text(entry))


@app.command("reconcile")
def reconcile(model: str, as_json: bool = JsonOpt) -> None:
    """Make MLflow's aliases and stage tags agree with the ledger again (admin); ledgered."""
    from registry.release import reconcile as do

    entry = do(_actor("reconcile"), model)
    _out(entry.as_dict(), as_json, _entry_text(entry))


# --------------------------------------------------------------------------- reading


@app.command("status")
def status(model: str, as_json: bool = JsonOpt) -> None:
    """Versions, stages, aliases, gate status, pending approvals, and where MLflow's display copies drift from
    the verified ledger."""
    from mlops.text import shown as q
    from registry.audit import status as read

    data = read(model)
    lines = [f"{q(model)}: " + (", ".join(f"@{a}=v{v}" for a, v in sorted(data["aliases"].items()))
                                or "no aliases")]
    for v in data["versions"]:
        last = v["overrides"][-1] if v["overrides"] else None
        extra = f" override: {q(last['gate'])} by {q(last['by'])}" if last else ""
        lines.append(f"  v{v['version']:<4} {v['stage']:12} gate {v['gate']:8} trainer {q(v['trainer'] or '?'):10} "
                     f"registered by {q(v['registered_by'])}{extra}")
    for p in data["pending"]:
        lines.append(f"  pending: v{p['version']} -> {p['to']} requested by {q(p['requester'])}: {q(p['comment'])}")
    if data["drift"]:
        lines.append("  DRIFT: MLflow's display copies differ from the ledger (serving follows the ledger):")
        lines += [f"    {q(d)}" for d in data["drift"]]
        lines.append(f"  Fix: `mlops registry reconcile {q(model)}` (admin).")
    _out(data, as_json, "\n".join(lines))


@app.command("history")
def history(model: str, at: str | None = typer.Option(None, "--at", help="ISO time: what held each alias then"),
            as_json: bool = JsonOpt) -> None:
    """Alias moves, and (with --at) which version was in production at that time."""
    from mlops.text import shown as q
    from registry.audit import history as read

    data = read(model, at)
    lines = [f"  #{m['seq']} {m['ts']} {q(m['actor'])} {m['action']} @{m['alias']}: {m['alias_before'] or '-'} -> "
             f"{m['alias_after'] or '-'}" + (f" ({q(m['reason'])})" if m["reason"] else "") for m in data["moves"]]
    head = f"{q(model)} at {data['at']}: " if data["at"] else f"{q(model)} now: "
    head += ", ".join(f"@{a}=v{v}" for a, v in sorted(data["aliases"].items())) or "no aliases"
    _out(data, as_json, "\n".join([head, *lines]))


@app.command("who-approved")
def who_approved(model: str, version: str, as_json: bool = JsonOpt) -> None:
    """Who approved a version, when, and why."""
    from mlops.text import shown as q
    from registry.audit import who_approved as read

    rows = read(model, version)
    _out(rows, as_json, "\n".join(f"{q(r['approver'])} approved v{version} for {r['to_stage']} at {r['ts']}: "
                                  f"{q(r['comment'])}" for r in rows) or f"nobody approved v{version} of {q(model)}")


@app.command("report")
def report(model: str, as_json: bool = JsonOpt) -> None:
    """The release story from stored state: each version's lineage, scores and gate outcome, the ledger, and
    when the version serving users changed (request log)."""
    from registry.report import release_report, render

    data = release_report(model)
    _out(data, as_json, render(data))


@app.command("verify")
def verify(model: str | None = typer.Argument(None), as_json: bool = JsonOpt) -> None:
    """Check the ledger's hash chain and that MLflow's aliases and tags agree with it; exit 1 on any problem."""
    from registry.audit import verify as check

    result = check(model)
    lines = [f"ledger: {result.entries} entries, chain {'intact' if not result.chain else 'BROKEN'}"]
    lines += [f"  {p}" for p in result.chain]
    for name, problems in result.drift.items():
        lines.append(f"{name}: {'registry agrees with the ledger' if not problems else 'DRIFT'}")
        lines += [f"  {p}" for p in problems]
    if any(result.drift.values()):
        lines.append("Fix: `mlops registry reconcile <model>` (admin) makes the registry say what the ledger says.")
    _out(result.as_dict(), as_json, "\n".join(lines))
    if not result.ok:
        raise typer.Exit(1)


# --------------------------------------------------------------------------- spot-check and canary


class _CreateByDefault(typer.core.TyperGroup):
    """`spot-check <model> <version>` creates a check; `spot-check export|import|list|show ...` act on checks."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands:
            return "create", self.commands["create"], args
        return super().resolve_command(ctx, args)


spot_app = typer.Typer(cls=_CreateByDefault, no_args_is_help=True,
                       help="Blind human spot-check of a version against the champion: `spot-check <model> "
                            "<version> --n 30`, then review in the app or with export/import.")
app.add_typer(spot_app, name="spot-check")


def _compared_with(s: dict) -> str:
    if s["champion_version"]:
        return "v" + s["champion_version"]
    return f"the base model {s['baseline']} (no champion yet)" if s.get("baseline") else "no champion"


def _spot_text(s: dict) -> str:
    t = s["tallies"]
    head = (f"spot-check {s['check_id']}: {s['model']} v{s['version']} against "
            f"{_compared_with(s)}, {s['items']} items "
            f"({', '.join(f'{k} {n}' for k, n in sorted(s['strata'].items()))})")
    if not s["reviewed"]:
        return head + "\n  not reviewed yet"
    return head + (f"\n  reviewed {s['reviewed']}/{s['items']}: {t['better']} better, {t['same']} same, {t['worse']} "
                   f"worse, {t['wrong_fact']} wrong fact (unexplained: {t['unexplained_wrong_facts'] or 'none'}); "
                   f"{t['share_same_or_better']:.0%} same or better; reviewers {', '.join(t['reviewers'])}")


@spot_app.command("create")
def spot_create(model: str, version: str,
                n: int | None = typer.Option(None, "--n", min=1,
                                             help="items (default registry.spot_check.sample_size)"),
                seed: int | None = typer.Option(None, "--seed", help="sample seed (default: random, recorded)"),
                as_json: bool = JsonOpt) -> None:
    """Draw a stratified sample of business prompts and served requests, answer them with the version and the
    champion in deployment form, and store them blind for review (ledgered)."""
    from registry.spotcheck import create

    summary = create(_actor("request"), model, version, n=n, seed=seed)
    _out(summary, as_json, _spot_text(summary) + f"\n  review: the app, or `mlops registry spot-check export "
                                                 f"{summary['check_id']} > items.jsonl`, edit, then `... import`")


@spot_app.command("list")
def spot_list(model: str, version: str | None = typer.Option(None, "--version"), as_json: bool = JsonOpt) -> None:
    """Spot-checks of a model (or one version), newest first."""
    from registry.spotcheck import summary
    from registry.spotcheck_store import checks_of

    rows = [summary(c["check_id"]) for c in checks_of(model, version)]
    _out(rows, as_json, "\n".join(_spot_text(s) for s in rows) or f"no spot-check of {model}")


@spot_app.command("show")
def spot_show(check_id: str, as_json: bool = JsonOpt) -> None:
    """One spot-check's sample and tallies (verdicts un-blinded only as counts)."""
    from registry.spotcheck import summary

    s = summary(check_id)
    _out(s, as_json, _spot_text(s))


@spot_app.command("export")
def spot_export(check_id: str, pending_only: bool = typer.Option(False, "--pending", help="only items without a "
                                                                                        "verdict")) -> None:
    """Print the items blind as JSONL: fill `preferred` (A, B or same), `wrong_fact` (e.g. ["B"]) and `note`."""
    from registry.spotcheck import blind_items, pending

    for item in (pending if pending_only else blind_items)(check_id):
        typer.echo(json.dumps(item, ensure_ascii=False))


@spot_app.command("import")
def spot_import(path: str = typer.Argument(..., help="the edited JSONL file ('-' for stdin)"),
                as_json: bool = JsonOpt) -> None:
    """Record the verdicts of an edited export as the acting reviewer (MLOPS_USER); unchanged rows are skipped."""
    from mlops.errors import MLOpsError
    from registry.spotcheck import import_rows

    reviewer = _actor("spot_check")
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()  # noqa: SIM115
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append((number, json.loads(line)))
            except ValueError as err:
                raise MLOpsError(f"{path}, line {number}: not valid JSON ({err}). Nothing was recorded. Fix: keep "
                                 "one JSON object per line as the export wrote it.") from None
    done = import_rows(reviewer, rows)
    _out(done, as_json, "\n".join(f"{s['imported']} verdicts recorded\n" + _spot_text(s) for s in done.values())
         or "no verdicts in the file")


@app.command("canary")
def canary(model: str, version: str,
           share: float = typer.Option(..., "--share", help="share of traffic for the candidate, e.g. 0.1 (at most "
                                       "registry.canary.max_share)"),
           duration: str = typer.Option(..., "--for", help="how long, e.g. 10m, 90s, 1h (at most "
                                        "registry.canary.max_seconds)"),
           metrics_url: list[str] = typer.Option(["http://127.0.0.1:8000/metrics"], "--metrics-url",
                                                 help="a serving replica's /metrics (repeat for each replica)"),
           interval: float | None = typer.Option(None, "--interval", help="seconds between reads"),
           as_json: bool = JsonOpt) -> None:
    """Route --share of traffic to a version whose production request is approved (servers run with --follow),
    watch error rate and p95 from /metrics against the recorded policy's thresholds (registry.canary), then
    promote it (gates still apply) or roll it back by itself. Exit 0 promoted, 1 rolled back, 2 stopped (e.g.
    promotion refused). The API key for /metrics comes from MLOPS_API_KEY."""
    from registry.canary import Limits, metrics_reader, parse_duration, watch
    from registry.resolve import release_policy

    actor = _actor("promote")
    policy = release_policy().canary
    limits = Limits(share=share, seconds=parse_duration(duration),
                    interval=policy.interval if interval is None else interval)

    def tick(seen: dict) -> None:
        if not as_json:
            typer.echo(f"  canary {seen['canary_requests']:.0f} req, {seen['canary_error_rate']:.1%} errors, p95 "
                       f"{_secs(seen['canary_p95_s'])} | champion {seen['champion_requests']:.0f} req, p95 "
                       f"{_secs(seen['champion_p95_s'])}")

    reader = metrics_reader(metrics_url, os.environ.get("MLOPS_API_KEY") or None)
    result = watch(actor, model, version, limits, reader, on_tick=tick)
    data = {**result, "entries": [e.as_dict() for e in result["entries"]]}
    _out(data, as_json, "\n".join([*(_entry_text(e) for e in result["entries"]),
                                   f"canary {result['outcome']}: {result['reason']}"]))
    raise typer.Exit({"promoted": 0, "rolled_back": 1}.get(result["outcome"], 2))


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


@app.command("canary-stop")
def canary_stop(model: str, reason: str = typer.Option(..., "--reason", help="why (required; goes into the ledger)"),
                as_json: bool = JsonOpt) -> None:
    """Stop a running canary by hand (all traffic back to the champion); ledgered."""
    from registry.canary import stop

    entry = stop(_actor("promote"), model, "stopped", reason)  # the role is checked, and again by every verifier
    _out(entry.as_dict(), as_json, _entry_text(entry))
