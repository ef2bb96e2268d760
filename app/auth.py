"""Login against the registry's identities file, with an idle timeout.

Passwords are checked by `mlops.identities.authenticate`, as the CLI: the password unlocks the person's own key file
(argon2id) and the verified ledger must name its public key. The session keeps the name and the unlocked signer
(in the server's memory only: never rendered, logged or serialized; acts are signed with it). The role and the
public key are re-read from the ledger at every interaction, so a removed user, a changed role, or a rotated or
revoked key takes effect at once. Actions are recorded under this identity; there is no name field.
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
    """The logged-in identity, or None (never logged in, idle too long, no longer in the registry, or a ledger
    that does not verify). While the store cannot be read at all, the session keeps the role it logged in with:
    every action re-checks on the store and says why it cannot run."""
    import streamlit as st

    from mlops.errors import MLOpsError
    from registry.identities import user_of
    from registry.ledger import LedgerBroken

    info = st.session_state.get(SESSION_KEY)
    if not info:
        return None
    now = time.time()
    if now - info["seen"] > timeout_min * 60:
        _end(f"Your session expired after {timeout_min:g} minutes without activity. Log in again.")
        return None
    signer = info.get("signer")
    try:
        user = user_of(info["name"])
        role = user.role if user else None
        if user is not None and signer is not None and user.public_key != signer.public_key:
            _end(f"The key '{info['name']}' logged in with was rotated or revoked. Log in again with the new one.")
            return None
    except LedgerBroken as err:
        _end(str(err))
        return None
    except MLOpsError:
        role = info.get("role")  # the store cannot be read now: keep the role checked at login
    if role is None:
        _end(f"'{info['name']}' is no longer in the registry. Ask an admin.")
        return None
    if touch:
        info["seen"] = now
    return Identity(info["name"], role, signer=signer)


def log_in(name: str, password: str) -> Identity | None:
    """Check the password with the registry's hashing and start a session; None (and a notice) on failure."""
    import streamlit as st

    from mlops.errors import MLOpsError
    from mlops.identities import AuthError, authenticate

    try:
        identity = authenticate((name or "").strip(), password)
    except AuthError:
        return None
    except MLOpsError as err:  # the registry cannot be read or does not verify: nobody can be checked
        st.session_state[NOTICE_KEY] = str(err)
        return None
    # The signer stays in this server's memory for the session: it is never put on the page or serialized.
    st.session_state[SESSION_KEY] = {"name": identity.name, "role": identity.role, "signer": identity.signer,
                                     "seen": time.time()}
    st.session_state.pop(NOTICE_KEY, None)
    return identity


def log_out() -> None:
    _end("You logged out.")


def login_page() -> None:
    import streamlit as st

    from app.ui import md

    st.title("Release approvals")
    st.caption("Log in with your registry identity (`mlops registry user list` names them).")
    if st.session_state.get(NOTICE_KEY):
        st.info(md(st.session_state[NOTICE_KEY]))
    with st.form("login", width=420):
        name = st.text_input("User", key="login_user")
        password = st.text_input("Password", type="password", key="login_password")
        submitted = st.form_submit_button("Log in", type="primary", key="login_submit")
    if submitted:
        if log_in(name, password):
            st.rerun()
        # One message for unknown users and wrong passwords, and no file path for someone not logged in.
        st.error(LOGIN_FAILED)
