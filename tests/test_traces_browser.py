"""A served answer in the MLflow UI (Playwright + Debian's Chromium): the Traces tab of `served-traffic` lists it
with its version, and its feedback shows on it as an assessment. Screenshots go to .mlops/test-artifacts/ (or
$MLOPS_TEST_ARTIFACTS)."""

from __future__ import annotations

import re
import sys

import pytest

from tests.test_app_browser import CHROMIUM, WAIT_MS, artifacts_dir, free_port, require_chromium, running

pytestmark = pytest.mark.slow


def _answer_and_rate(tiny_model, tmp_path) -> str:
    """One keyed answer from the real gateway, rated -1 with a correction; returns its request id."""
    import httpx

    from mlops.profile import load_profile
    from serving.auth import KeyStore, add_key
    from serving.request_log import RequestLogWriter
    from serving.server import create_app
    from serving.testing import serve_in_thread

    key, _ = add_key(tmp_path / "keys.json", "helpdesk-app")
    writer = RequestLogWriter(flush_seconds=0.05)
    app = create_app(tiny_model["path"], load_profile(tiny_model["path"]), model_name="support-bot", version="7",
                     keys=KeyStore(tmp_path / "keys.json"), request_log=writer, log_model="support-bot")
    headers = {"Authorization": f"Bearer {key}", "X-Request-ID": "ui-parcel-1"}
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=120) as client:
        asked = client.post("/v1/chat/completions", headers=headers, json={
            "messages": [{"role": "user", "content": "Where is my parcel? I am jane.doe@example.com"}],
            "max_tokens": 4})
        assert asked.status_code == 200, asked.text
        rated = client.post("/v1/feedback", headers={"Authorization": headers["Authorization"]},
                            json={"request_id": "ui-parcel-1", "rating": -1, "correction": "It ships Monday."})
        assert rated.status_code == 200, rated.text
        assert writer.flush(60)
    return "ui-parcel-1"


@pytest.fixture
def mlflow_ui(traced_home, tmp_path):
    """`mlflow server` (the UI) on this test's tracking store; yields its URL."""
    require_chromium()
    from mlops.tracking import tracking_uri

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri(), "--host",
                  "127.0.0.1", "--port", str(port), "--workers", "1"], url, "/health", tmp_path / "mlflow-ui.log",
                 "mlflow server", timeout=180):
        yield url


def test_a_served_answer_shows_in_the_mlflow_traces_tab_with_its_version_and_feedback(traced_home, tiny_model,
                                                                                      tmp_path, mlflow_ui):
    import mlflow
    from playwright.sync_api import sync_playwright

    from mlops.requestlog import EXPERIMENT, trace_id_of
    from mlops.tracking import tracking_uri

    request_id = _answer_and_rate(tiny_model, tmp_path)
    trace_id = trace_id_of(request_id)
    mlflow.set_tracking_uri(tracking_uri())
    experiment_id = mlflow.get_experiment_by_name(EXPERIMENT).experiment_id
    shots = artifacts_dir()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless=new"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        try:
            page.goto(f"{mlflow_ui}/#/experiments/{experiment_id}/traces")
            # The table shows the scrubbed request preview: the address never reached the store.
            page.get_by_text("Where is my parcel?", exact=False).first.wait_for(timeout=WAIT_MS)
            assert page.get_by_text("jane.doe@example.com").count() == 0
            page.screenshot(path=str(shots / "mlflow-traces-tab.png"), full_page=True)
            assert (shots / "mlflow-traces-tab.png").stat().st_size > 10_000
            # The trace itself: its tags name the version, its assessments hold the rating and the correction.
            page.goto(f"{mlflow_ui}/#/experiments/{experiment_id}/traces/{trace_id}")
            page.get_by_text(re.compile(r"^\d+ tags$")).first.click(timeout=WAIT_MS)  # the tags sit behind it
            version_tag = page.get_by_text("mlops.version", exact=True).first
            version_tag.wait_for(timeout=WAIT_MS)
            assert version_tag.locator("xpath=..").inner_text().split() == ["mlops.version", "7"]
            page.screenshot(path=str(shots / "mlflow-trace-tags.png"), full_page=True)
            page.get_by_text(re.compile(r"^\d+ tags$")).first.click(timeout=WAIT_MS)  # closes the tag list
            pane_toggle = page.locator('[data-component-id="shared.model-trace-explorer.assessments-pane-toggle"]')
            assert pane_toggle.first.get_attribute("aria-label", timeout=WAIT_MS) == "Assess trace (2 assessments)"
            pane_toggle.first.click(timeout=WAIT_MS)
            page.get_by_text("rating", exact=True).first.wait_for(timeout=WAIT_MS)
            page.get_by_text("It ships Monday.", exact=False).first.wait_for(timeout=WAIT_MS)
            page.screenshot(path=str(shots / "mlflow-trace-assessments.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(shots / "mlflow-traces-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
