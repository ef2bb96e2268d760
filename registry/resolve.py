"""Layer 3 (reading the verified ledger): the one way to read a release: from the verified ledger, never from MLflow's aliases alone.

Every consumer of `@production`, `@staging` or `@candidate` (serving with or without `--follow`, the canary,
the app, the report, the spot-check, `mlops eval`/`gate` refs through the core's `release_version` service)
asks `release_version`, which verifies the whole chain (`registry.ledger.verified`) and replays it. MLflow's
aliases are display copies; a chain that does not verify raises `LedgerBroken`, naming the first bad entry.
"""

from __future__ import annotations

from mlops.errors import NotFoundError
from registry.state import ALIAS_OF_STAGE, STAGES, ModelState, replay

GOVERNED = ("production", "staging", "candidate")


def state_in(model: str, entries, *, until: str | None = None) -> ModelState:
    """A model's state from (already verified) ledger entries, with the governance stream's users and policy."""
    from registry.config import recorded_policy
    from registry.rules import users_in

    state = replay(model, entries, until=until)
    state.users = users_in(entries)
    state.policy = recorded_policy(entries)
    state.entries = [e for e in entries if e.model == model and (until is None or e.ts <= until)]
    return state


def release_policy(url: str | None = None):
    """The release policy in force: the verified ledger's newest recorded policy."""
    from registry.config import policy_of, recorded_policy
    from registry.ledger import verified

    return policy_of(recorded_policy(verified(url).entries))


def present(url: str | None = None) -> bool:
    """Whether this store holds a registry: none where the store has no database for one (a file store), the
    database file does not exist, or it was never bootstrapped. A broken or unreachable one raises: it may be
    there, and nothing is trusted from it."""
    from mlops.errors import NotFoundError
    from registry.ledger import LedgerError, ledger_url, verified

    try:
        db = ledger_url(url)
    except LedgerError:
        return False
    try:
        verified(db)
        return True
    except NotFoundError:  # NoRegistry, or a SQLite file that is not there
        return False


def verified_state(model: str, *, until: str | None = None, url: str | None = None) -> ModelState:
    from registry.ledger import verified

    return state_in(model, verified(url).entries, until=until)


def known_models(entries) -> list[str]:
    from registry.entries import GOVERNANCE

    return sorted({e.model for e in entries if e.model != GOVERNANCE})


MAX_NAME = 200  # MLflow's and the ledger's columns, with room for the run names derived from it (PostgreSQL: 250)
NAME_RE = __import__("re").compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_model_name(name: str) -> None:
    """A registered model name, checked before any store sees it (same answer on SQLite and PostgreSQL)."""
    from mlops.errors import MLOpsError
    from mlops.text import shown

    if not name or len(name) > MAX_NAME or not NAME_RE.match(name):
        short = name if len(name or "") <= 60 else name[:60] + "..."
        raise MLOpsError(f"model name '{shown(short)}' ({len(name or '')} characters) is not valid: a registered model "
                         f"name has 1-{MAX_NAME} characters, letters, digits, '.', '_' or '-', starting with a letter "
                         "or digit. Fix: pick such a name (e.g. support-bot).")


def require_model(model: str, *, url: str | None = None) -> ModelState:
    """The verified state of a model the ledger knows; NotFoundError (exit 2) naming the known ones otherwise."""
    from mlops.errors import did_you_mean
    from registry.ledger import verified

    chain = verified(url)
    if not any(e.model == model for e in chain.entries):
        raise NotFoundError(f"the registry has no model '{model}': {did_you_mean(model, known_models(chain.entries))}"
                            ". Fix: pass a registered model name (`mlops registry register` adds one).")
    return state_in(model, chain.entries)


def require_version(state: ModelState, version: str) -> None:
    if str(version) not in state.versions:
        known = ", ".join(sorted(state.versions, key=int)) or "none"
        raise NotFoundError(f"'{state.model}' has no version {version} in the ledger (versions: {known}). "
                            "Fix: pass a registered version.")


def target_of(state: ModelState, alias: str) -> str | None:
    """The version the ledger's state gives `@alias`: the alias itself, or the newest version of a stage name."""
    if alias in STAGES and alias not in ALIAS_OF_STAGE.values():
        in_stage = [v for v, vs in state.versions.items() if vs.stage == alias]
        return max(in_stage, key=lambda v: int(v) if v.isdigit() else -1) if in_stage else None
    return state.aliases.get(alias)


def release_version(model: str, alias: str, url: str | None = None) -> str:
    """The version the verified ledger gives `model@alias`; NotFoundError when it names none."""
    state = require_model(model, url=url)
    version = target_of(state, alias)
    if version is None:
        held = ", ".join(f"@{a}=v{v}" for a, v in sorted(state.aliases.items())) or "none"
        raise NotFoundError(f"the ledger gives '{model}' no version @{alias} (aliases: {held}). Fix: pass a "
                            f"version (models:/{model}/<n>), or release one to {alias} first.")
    return version
