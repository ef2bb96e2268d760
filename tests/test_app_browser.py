"""The approval app in a real browser (Playwright + Debian's Chromium) against `python -m app` on a real store.

An approver logs in, sees her own request's approval disabled (four-eyes), approves another candidate, promotes
it, rolls it back, and the ledger page shows both while the registry agrees. Screenshots of Compare and Ledger
go to .mlops/test-artifacts/ (or $MLOPS_TEST_ARTIFACTS).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from registry.testing import PASSWORDS, signed_in

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
WAIT_MS = 90_000


def artifacts_dir() -> Path:
    folder = Path(os.environ.get("MLOPS_TEST_ARTIFACTS") or REPO / ".mlops" / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def require_chromium() -> None:
    """Skip without Debian's Chromium, except under CI=true, where that is a failure."""
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing: `apt-get install -y chromium` (.ci/run does)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


@contextlib.contextmanager
def running(cmd: list[str], url: str, health: str, log_path: Path, what: str, timeout: float = 120, **popen):
    """Start `cmd`, wait until `url + health` answers 200, yield; stopped afterwards (its log at `log_path`)."""
    log = log_path.open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **popen)
    try:
        deadline = time.time() + timeout
        while True:
            try:
                with urllib.request.urlopen(url + health, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"{what} did not start: {log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield proc
    finally:
        stop(proc)
        log.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def app_server(app_store, tmp_path):
    """`python -m app` on the seeded store; yields its URL; stopped (with its Streamlit child) afterwards."""
    require_chromium()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLOPS_HOME": str(app_store)}
    url = f"http://127.0.0.1:{port}"
    with running([sys.executable, "-m", "app", "--port", str(port)], url, "/_stcore/health", tmp_path / "app.log",
                 "the app", cwd=app_store, env=env):
        yield url
    printed = (tmp_path / "app.log").read_text()
    assert f"Release-approval app: {url}" in printed  # `mlops app` says where it is
    assert "Traceback" not in printed


def settle(page) -> None:
    """Wait until Streamlit has finished running the script (no status widget, nothing stale)."""
    page.wait_for_timeout(400)
    quiet = 0
    for _ in range(300):
        busy = page.locator('[data-testid="stStatusWidget"]').count() + page.locator('[data-stale="true"]').count()
        quiet = 0 if busy else quiet + 1
        if quiet >= 3:
            return
        page.wait_for_timeout(250)


def go(page, title: str) -> None:
    page.get_by_test_id("stSidebarNav").get_by_role("link", name=title).click()
    page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=WAIT_MS)
    settle(page)


def choose(page, label: str, option: str) -> None:
    page.get_by_test_id("stSelectbox").filter(has_text=label).first.click()
    page.get_by_role("option", name=option).click()
    settle(page)


def request_card(page, heading: str):
    return page.get_by_test_id("stVerticalBlock").filter(has=page.get_by_role("heading", name=heading)).last


def test_an_approver_approves_promotes_and_rolls_back_in_a_browser(app_server):
    from playwright.sync_api import sync_playwright

    from registry import ledger
    from registry.audit import verify
    from registry.release import decide
    from registry.transition import RefusedError, registry_aliases

    shots = artifacts_dir()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless=new"])
        page = browser.new_page(viewport={"width": 1400, "height": 2200})
        page.set_default_timeout(WAIT_MS)
        try:
            page.goto(app_server + "/approvals")  # a page's address before logging in shows the login form
            page.get_by_role("button", name="Log in").wait_for()
            assert page.get_by_role("heading", name="Approvals", exact=True).count() == 0
            page.get_by_role("textbox", name="User").fill("alice")
            page.get_by_role("textbox", name="Password").fill(PASSWORDS["alice"])
            page.get_by_role("button", name="Log in").click()
            page.get_by_text("alice · approver").wait_for()
            go(page, "Approvals")

            mine = request_card(page, "bot v3 → production")  # alice asked for v3 herself
            assert mine.get_by_role("button", name="Approve").is_disabled()
            assert "four-eyes rule: 'alice' requested version 3" in mine.inner_text()
            with pytest.raises(RefusedError, match="four-eyes rule"):
                decide(signed_in("alice"), "bot", "3", "trying anyway", approve=True)

            card = request_card(page, "bot v2 → production")
            card.get_by_role("textbox", name="Comment (required, goes into the ledger)").fill("policy answers ok")
            card.get_by_role("textbox").press("Enter")
            settle(page)
            card.get_by_role("button", name="Approve").click()
            page.get_by_text("Approve v2 of bot: done as alice").wait_for()

            go(page, "Compare")
            choose(page, "Challenger", "v2 · candidate")
            page.get_by_role("heading", name="Training curves").wait_for()
            settle(page)
            page.screenshot(path=str(shots / "compare.png"), full_page=True)

            go(page, "Promote / Rollback")
            choose(page, "Version", "v2 · candidate")
            assert "@production: v1 → v2" in page.get_by_test_id("stMain").inner_text()
            page.get_by_text("I have checked what will change").click()
            settle(page)
            page.get_by_role("button", name="Promote v2 to production").click()
            page.get_by_text("Promote v2 of bot to production: done as alice").wait_for()
            settle(page)
            assert registry_aliases("bot") == {"production": "2"}

            page.get_by_role("radio", name="Rollback").click()
            settle(page)
            page.get_by_role("textbox", name="Reason (required, goes into the ledger and onto the rolled-back "
                                             "version)").fill("v2 mixes up refund currencies")
            page.get_by_role("textbox", name="Reason (required, goes into the ledger and onto the rolled-back "
                                             "version)").press("Enter")
            settle(page)
            page.get_by_text("I have checked what will change").click()
            settle(page)
            page.get_by_role("button", name="Roll back to v1").click()
            page.get_by_text("Roll back bot: done as alice").wait_for()
            settle(page)

            go(page, "Ledger")
            page.get_by_role("heading", name="Entry", exact=True).wait_for()
            page.get_by_text("#19 rollback by alice").wait_for()  # the newest entry, selected
            settle(page)
            shown = page.get_by_test_id("stMain").inner_text()
            assert "Chain verified: 19 entries" in shown
            assert "@production → v1, since entry #19 (rollback by alice" in shown
            page.get_by_test_id("stSelectbox").filter(has_text="Entry").first.click()
            assert page.get_by_role("option", name="#18 promote bot v2 by alice").count() == 1
            page.keyboard.press("Escape")
            settle(page)
            page.screenshot(path=str(shots / "ledger.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(shots / "failure.png"), full_page=True)  # what the browser showed
            raise
        finally:
            browser.close()

    entries = ledger.entries("bot")
    assert [(e.action, e.actor, e.alias_before, e.alias_after) for e in entries[-2:]] == \
        [("promote", "alice", "1", "2"), ("rollback", "alice", "2", "1")]
    assert registry_aliases("bot") == {"production": "1"} and verify("bot").ok
    assert (shots / "compare.png").stat().st_size > 50_000 and (shots / "ledger.png").stat().st_size > 20_000
