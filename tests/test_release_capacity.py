"""`mlops release capacity`: latency by concurrency to the knee, the throughput ceiling and a soak, measured on a
server of the version in its deployment form, stored on the version and shown on the app's version page."""

from __future__ import annotations

import re

import pytest

from mlops.lineage import Tag


def test_the_knee_is_the_smallest_concurrency_near_the_ceiling():
    from serving.capacity import drift, knee

    rows = [{"concurrency": c, "tokens_per_s": t} for c, t in [(1, 20.0), (2, 35.0), (4, 58.0), (8, 61.0), (16, 60.0)]]
    assert knee(rows)["concurrency"] == 4  # 58 >= 0.9 * 61; 35 is not
    assert knee(rows, share=1.0)["concurrency"] == 8
    assert drift([{"rss_mb": 100.0}, {"rss_mb": 104.0}], "rss_mb") == 1.04


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_capacity_is_measured_on_the_served_version_stored_on_it_and_shown_in_the_app(app_store):
    from app.testing import app_test, log_in, open_page
    from mlops.model_refs import resolve_model_ref
    from mlops.run_store import get_run, load_run_json
    from registry.testing import PASSWORDS
    from serving.capacity import measure_capacity, render

    run_id, report = measure_capacity("models:/bot/4", levels=(1, 2), requests=2, max_tokens=4, soak_s=2.0,
                                      windows=2)
    assert [r["concurrency"] for r in report["levels"]] == [1, 2] and report["failures"] == 0
    assert report["ceiling_tokens_per_s"] > 0 and report["knee"]["concurrency"] in (1, 2)
    assert len(report["soak"]) >= 1 and all(w["rss_mb"] > 50 for w in report["soak"])
    assert report["deployment_form"] == "hf (as trained)"
    assert resolve_model_ref("models:/bot/4").version_tags[Tag.CAPACITY_RUN] == run_id
    assert load_run_json(run_id, "capacity/capacity.json")["knee"] == report["knee"]
    assert get_run(run_id).data.metrics["ceiling_tokens_per_s"] == report["ceiling_tokens_per_s"]
    assert "<- knee" in render(report)
    at = open_page(log_in(app_test(), "vic", PASSWORDS["vic"]), "version", model="bot", version="4")
    assert not at.exception
    # as read on the page: the app's Markdown escapes of stored text (app.ui.md) undone
    shown = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", "\n".join(str(m.value) for m in at.markdown))
    assert f"knee at **c={report['knee']['concurrency']}**" in shown and "hf (as trained)" in shown
    levels = [d.value for d in at.dataframe if "ttft_p50_ms" in d.value.columns][0]
    assert list(levels["concurrency"]) == [1, 2]
