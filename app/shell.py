"""The app's frame: page setup, the login gate, the sidebar (who, where, log out) and the page navigation."""

from __future__ import annotations

import os

NAV = {
    "Review": [("models", "Models", ":material/inventory_2:"), ("version", "Version", ":material/account_tree:"),
               ("compare", "Compare", ":material/compare_arrows:"), ("monitor", "Quality", ":material/monitoring:")],
    "Decide": [("approvals", "Approvals", ":material/how_to_reg:"),
               ("spotcheck", "Spot-check", ":material/rate_review:"),
               ("datareview", "Data review", ":material/fact_check:"),
               ("release", "Promote / Rollback", ":material/rocket_launch:")],
    "Audit": [("ledger", "Ledger", ":material/receipt_long:")],
}


def _sidebar(identity) -> None:
    import streamlit as st

    from app import auth, data, ui

    with st.sidebar:
        st.markdown(f"**{ui.md(identity.name)}** · {ui.md(identity.role)}")
        if not identity.can("promote") and not identity.can("approve") and not identity.can("request"):
            st.caption("Read-only: this role sees everything and changes nothing.")
        left, right = st.columns(2)
        if left.button("Log out", key="logout", icon=":material/logout:"):
            auth.log_out()
            st.rerun()
        if right.button("Refresh", key="refresh", icon=":material/refresh:", help="read the registry again now"):
            data.invalidate()
        with ui.guard("Store"):
            from mlops.tracking import display_uri, tracking_uri

            st.caption(f"Tracking: {ui.code(display_uri(tracking_uri()))}")


def run() -> None:
    import streamlit as st

    from app import auth, ui
    from app.config import settings

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # reads would fill the log with bars
    st.set_page_config(page_title="Releases · mlops-llm", page_icon=":material/verified:", layout="wide")
    identity = None
    with ui.guard("Login"):
        identity = auth.current(settings().session_timeout_min)
    pages = {section: [st.Page(ui.PAGES[name], title=title, icon=icon, default=name == "models")
                       for name, title, icon in items] for section, items in NAV.items()}
    if identity is None:
        # Every page stays registered (an address like /approvals is kept for after the login) but none runs.
        st.navigation(pages, position="hidden")
        auth.login_page()
        return
    st.session_state["mlops_actor"] = identity
    _sidebar(identity)
    page = st.navigation(pages)
    ui.show_flash()
    with ui.guard(page.title):
        page.run()
