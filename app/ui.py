"""Small pieces every page uses: the error boundary, flash messages, model/version pickers, links."""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path

from mlops.errors import MLOpsError

log = logging.getLogger("mlops.app")

WEB = Path(__file__).resolve().parent / "web"
PAGES = {  # page name -> script, relative to the entry script (what st.Page and st.page_link take)
    "models": "views/models.py", "version": "views/version.py", "compare": "views/compare.py",
    "approvals": "views/approvals.py", "release": "views/release.py", "ledger": "views/ledger.py",
    "monitor": "views/monitor.py",
    "spotcheck": "views/spotcheck.py", "datareview": "views/datareview.py",
}
FLASH_KEY = "mlops_flash"
OK, BAD = ":green[:material/check_circle:]", ":red[:material/cancel:]"  # icons from Streamlit's own font


MARKDOWN_SPECIAL = set("\\`*_{}[]()<>#+-.!|~$:&=")
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


# The one escape of the app: every string that comes from MLflow, the ledger, a report or a person (model names,
# tags, run names, reasons, comments, gate details, errors that quote them) reaches Markdown through `md` (or
# `code` inside backticks); raw blocks go to `st.code`, tables to `st.dataframe`, both shown as plain text.
def md(value) -> str:
    """Text typed by a person or produced by a model, made safe to put inside Markdown: shown as written, never
    read as a link, an image, HTML, emphasis, a heading, a colour directive or a formula."""
    text = " ".join(str("" if value is None else value).split())
    return "".join(f"\\{ch}" if ch in MARKDOWN_SPECIAL else ch for ch in text)


def code(value) -> str:
    """`value` as inline code: a literal span whatever it holds (a fence longer than any backtick run inside)."""
    text = " ".join(str("" if value is None else value).split()) or " "
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


_SECRET_FIELD = re.compile(r"pass(word|wd|phrase)|secret|private|sealed|(^|_)kdf$|(^|_)(access_|auth_|bearer_)?token$"
                           r"|credential|api_?key", re.I)
_SECRET_VALUE = re.compile(r"^\$(argon2|2[aby]\$|scrypt|pbkdf2)|PRIVATE KEY", re.I)
REDACTED = "[redacted]"


def redacted(value):
    """`value` (a ledger entry, its evidence) with password hashes and private key material replaced: a field
    named like a secret, or a value that looks like a password hash or a PEM private key."""
    if isinstance(value, dict):
        return {k: REDACTED if _SECRET_FIELD.search(str(k)) else redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    if isinstance(value, str) and _SECRET_VALUE.search(value):
        return REDACTED
    return value


def plain(err: BaseException) -> str:
    """An error in plain words: the registry's own message, or the kind of failure and its first line."""
    if isinstance(err, MLOpsError):
        return str(err)
    first = (str(err).strip().splitlines() or [""])[0][:300]
    return (f"Something failed unexpectedly ({type(err).__name__}: {first}). Nothing else on this page is "
            "affected; the details are in the app's log.")


@contextlib.contextmanager
def guard(what: str):
    """Show a failure inside `what` as a message and keep rendering the rest of the page. Streamlit's own
    rerun/stop signals are BaseExceptions and pass through."""
    import streamlit as st

    try:
        yield
    except MLOpsError as err:
        st.error(f"{what}: {md(plain(err))}")
    except Exception as err:  # noqa: BLE001 - no traceback may reach the page; the log keeps it
        log.exception("app: %s failed", what)
        st.error(f"{what}: {md(plain(err))}")


def flash(kind: str, text: str, **extra) -> None:
    import streamlit as st

    st.session_state[FLASH_KEY] = {"kind": kind, "text": text, **extra}


def show_flash() -> dict | None:
    """Show (once) what the last action said; returns it for pages that show more (the new ledger entry)."""
    import streamlit as st

    message = st.session_state.pop(FLASH_KEY, None)
    if message:
        {"success": st.success, "error": st.error}.get(message["kind"], st.info)(md(message["text"]))
    return message


def query(name: str) -> str | None:
    import streamlit as st

    value = st.query_params.get(name)
    return str(value) if value else None


def pick(label: str, options: list[str], *, key: str, param: str | None = None, fmt=None,
         default: str | None = None) -> str | None:
    """A selectbox that follows the URL's `param` (links and reloads land on their choice) and writes it back."""
    import streamlit as st

    if not options:
        return None
    wanted = query(param) if param else None
    if wanted in options and wanted != st.session_state.get(f"{key}__url"):
        st.session_state[key] = wanted  # the URL changed under us (a link): it wins over the last choice
    if st.session_state.get(key) not in options:
        st.session_state[key] = default if default in options else options[0]
    choice = st.selectbox(label, options, key=key, format_func=fmt or str)
    if param:
        st.query_params[param] = choice
        st.session_state[f"{key}__url"] = choice
    return choice


def pick_model(store: str, *, key: str = "model") -> str | None:
    import streamlit as st

    from app import data

    names = data.model_names(store)
    if not names:
        st.info("No registered model yet. Register one with `mlops registry register --run <run_id> --name "
                "<model>` (`make demo` does).")
        return None
    return pick("Model", names, key=key, param="model")


def version_label(state, version: str) -> str:
    vs = state.versions.get(str(version))
    held = [f"@{a}" for a, v in state.aliases.items() if v == str(version)]
    return f"v{version} · {vs.stage if vs else 'not in the ledger'}" + (f" · {' '.join(held)}" if held else "")


def sorted_versions(state) -> list[str]:
    return sorted(state.versions, key=int, reverse=True)


def mlflow_ui() -> str | None:
    from app.config import settings
    from mlops.tracking import tracking_uri

    base = settings().mlflow_ui_url
    if base:
        return base.rstrip("/")
    uri = tracking_uri()
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else None


def run_ref(run_id: str | None, experiment_id: str | None = None) -> str:
    """Markdown for a run: a link into the MLflow UI when one is known, else the id. An id that is not one
    (it comes from tags and evidence anyone with MLflow access can write) is shown as text, never linked."""
    if not run_id:
        return "—"
    if not _RUN_ID.match(str(run_id)):
        return md(run_id)
    base = mlflow_ui()
    if base and not experiment_id:
        from app import data

        experiment_id = (data.run_summary(data.store(), run_id) or {}).get("experiment_id")
    if base and experiment_id and _RUN_ID.match(str(experiment_id)):
        return f"[`{run_id[:12]}`]({base}/#/experiments/{experiment_id}/runs/{run_id})"
    return f"`{run_id[:12]}`"


def link_version(model: str, version: str, label: str | None = None, page: str = "version") -> None:
    import streamlit as st

    st.page_link(PAGES[page], label=md(label or f"{model} v{version}"), query_params={"model": model,
                                                                                   "version": str(version)})


def denied(permission) -> None:
    """Under a disabled button: why the rules forbid it (the registry's own words)."""
    import streamlit as st

    if not permission.ok:
        st.caption(f":material/block: {md(permission.reason)}")


def ts(text: str | None) -> str:
    return (text or "")[:19].replace("T", " ") + (" UTC" if text else "")


def actor():
    """The identity the frame checked at the start of this run."""
    import streamlit as st

    return st.session_state["mlops_actor"]


def store() -> str:
    from app import data

    return data.store()
