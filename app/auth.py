"""Login against the registry's identities file, with an idle timeout.

Passwords are checked by `mlops.identities.authenticate` (argon2id, the same file and hashing as the CLI). The
session keeps only the name: the role is re-read from the identities file at every interaction, so a removed
user or a changed role takes effect at once. Actions are recorded under this identity; there is no name field.
A session lives in the server's memory for one browser tab (no cookie), so a reload asks to log in again.
"""

from __future__ import annotations

import time

from mlops.identities import Identity

SESSION_KEY = "mlops_identity"
NOTICE_KEY = "mlops_login_notice"
LOGIN_FAILED = "Login failed: unknown user or wrong password."


def _end(notice: str | None = None) -> None:
    import streamlit as st

    st.session_state.pop(SESSION_KEY, None)
    if notice:
        st.session_state[NOTICE_KEY] = notice


def current(timeout_min: float, *, touch: bool = True) -> Identity | None:
    """The logged-in identity, or None (never logged in, idle too long, or no longer in the identities file)."""
    import streamlit as st

    from mlops.identities import load_users

    info = st.session_state.get(SESSION_KEY)
    if not info:
        return None
    now = time.time()
    if now - info["seen"] > timeout_min * 60:
        _end(f"Your session expired after {timeout_min:g} minutes without activity. Log in again.")
        return None
    user = load_users().get(info["name"])
    if user is None:
        _end(f"'{info['name']}' is no longer in the identities file. Ask an admin.")
        return None
    if touch:
        info["seen"] = now
    return Identity(info["name"], user.get("role", "viewer"))


def log_in(name: str, password: str) -> Identity | None:
    """Check the password with the registry's hashing and start a session; None (and a notice) on failure."""
    import streamlit as st

    from mlops.identities import AuthError, authenticate

    try:
        identity = authenticate((name or "").strip(), password)
    except AuthError:
        return None
    st.session_state[SESSION_KEY] = {"name": identity.name, "seen": time.time()}
    st.session_state.pop(NOTICE_KEY, None)
    return identity


def log_out() -> None:
    _end("You logged out.")


def login_page() -> None:
    import streamlit as st

    st.title("Release approvals")
    st.caption("Log in with your registry identity (`mlops registry user list` names them).")
    if st.session_state.get(NOTICE_KEY):
        st.info(st.session_state[NOTICE_KEY])
    with st.form("login", width=420):
        name = st.text_input("User", key="login_user")
        password = st.text_input("Password", type="password", key="login_password")
        submitted = st.form_submit_button("Log in", type="primary", key="login_submit")
    if submitted:
        if log_in(name, password):
            st.rerun()
        # One message for unknown users and wrong passwords, and no file path for someone not logged in.
        st.error(LOGIN_FAILED)
