"""The app's Quality page: `mlops monitor`'s report of served traffic as charts, its alerts and an empty window."""

from __future__ import annotations

import random
import time

import pytest

from app.testing import open_page
from tests.test_app_pages import everything, logged_in, texts
from tests.test_monitor import DAY, traffic


@pytest.fixture
def served_bot(app_store, monkeypatch):
    """Served traffic of the seeded model `bot`, read through the request log's readers (held in memory)."""
    import mlops.requestlog as requestlog

    held = {"rows": [], "feedback": []}
    monkeypatch.setattr(requestlog, "read_requests", lambda *, model=None, version=None, since=None, **_: [
        dict(r) for r in held["rows"] if (model is None or r["model"] == model)
        and (version is None or r["version"] == version) and (since is None or r["ts"] >= since)])
    monkeypatch.setattr(requestlog, "read_feedback", lambda *, request_ids=None, **_: [
        dict(f) for f in held["feedback"] if request_ids is None or f["request_id"] in set(request_ids)])
    return held


def test_the_quality_page_charts_each_signal_and_shows_a_planted_drop_as_an_alert(served_bot):
    now = time.time()
    rows, feedback = traffic(random.Random(21), version="1", start=now - 11 * DAY, days=11, per_day=20,
                             drop_from=now - 3 * DAY, drop={"thumbs_down": 0.5})
    for r in rows:
        r["model"] = "bot"
    served_bot["rows"], served_bot["feedback"] = rows, feedback
    at = open_page(logged_in("vic"), "monitor", model="bot")
    assert not at.exception and at.title[0].value == "Quality"
    alert, = texts(at, "error")  # the one alert, and no other error
    assert alert.startswith("**v1 thumbs_down** over the last 3 days") and "against first_week (v1)" in alert
    assert "registry.monitor.max_thumbs_down_increase" in alert
    assert at.get("arrow_vega_lite_chart") or at.get("vega_lite_chart")
    at.radio(key="quality_signal").set_value("latency_p95").run()
    assert not at.exception


def test_the_quality_page_names_an_empty_window_and_its_fix(served_bot):
    at = open_page(logged_in("vic"), "monitor", model="bot")
    assert not at.exception
    warning = " ".join(texts(at, "warning"))
    assert "no served traffic of 'bot'" in warning and "Fix: widen the window" in warning
    assert "Quality" in everything(at)
