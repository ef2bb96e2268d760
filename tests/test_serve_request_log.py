"""The server logs every generation answer (scrubbed) through a bounded background writer that never delays users."""

from __future__ import annotations

import threading
import time

import pytest


@pytest.fixture(scope="module")
def profile(tiny_model):
    from mlops.profile import load_profile

    return load_profile(tiny_model["path"])


def _served(tiny_model, profile, **parts):
    from serving.request_log import RequestLogWriter
    from serving.server import create_app

    writer = parts.pop("request_log", None) or RequestLogWriter(flush_seconds=0.05)
    app = create_app(tiny_model["path"], profile, model_name="bot", version="7", request_log=writer,
                     log_model="support-bot", **parts)
    return app, writer


def test_answers_are_logged_scrubbed_with_id_version_profile_latency_and_tokens(traced_home, tiny_model, profile):
    import httpx

    from mlops.requestlog import read_requests
    from serving.testing import serve_in_thread

    app, writer = _served(tiny_model, profile)
    chat = {"messages": [{"role": "user", "content": "I am jane.doe@example.com, call +1 415 555 0100"}],
            "max_tokens": 6, "temperature": 0}
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        answered = client.post("/v1/chat/completions", json=chat, headers={"X-Request-ID": "client-id-1"})
        with client.stream("POST", "/v1/completions", json={"prompt": "Hello", "max_tokens": 5, "stream": True}) as s:
            streamed_id = s.headers["x-request-id"]
            streamed = "".join(__import__("json").loads(line[6:])["choices"][0]["text"] for line in s.iter_lines()
                               if line.startswith("data: {"))
        scoring = client.post("/v1/completions", json={"prompt": [[1, 2, 3]], "max_tokens": 1, "echo": True,
                                                       "logprobs": 1, "temperature": 0})
        refused = client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 2})
        assert writer.flush(30)
    assert answered.status_code == 200 and scoring.status_code == 200 and refused.status_code == 400
    rows = {r["request_id"]: r for r in read_requests(model="support-bot")}
    assert set(rows) == {"client-id-1", streamed_id, refused.headers["x-request-id"]}  # scoring is not logged
    row = rows["client-id-1"]
    assert row["version"] == "7" and row["role"] == "user" and row["route"] == "/v1/chat/completions"
    assert row["profile_hash"] == profile.profile_hash() and row["status"] == 200
    assert "jane.doe@example.com" not in row["messages"][0]["content"] and "555 0100" not in row["messages"][0]["content"]
    assert row["messages"][0]["role"] == "user" and "[EMAIL]" in row["messages"][0]["content"]
    assert row["response"] == answered.json()["choices"][0]["message"]["content"]
    assert row["tokens_out"] == answered.json()["usage"]["completion_tokens"] and row["tokens_in"] > 0
    assert row["latency_ms"] > 0
    stream_row = rows[streamed_id]
    assert stream_row["response"] == streamed and stream_row["ttft_ms"] is not None and stream_row["tokens_out"] == 5
    bad = rows[refused.headers["x-request-id"]]
    assert bad["status"] == 400 and "messages" in bad["error"]


def test_a_full_queue_drops_rows_counted_without_waiting_for_the_database(monkeypatch):
    import mlops.requestlog as requestlog
    from mlops.requestlog import LoggedRequest
    from serving.request_log import RequestLogWriter

    stuck, written = threading.Event(), []

    def slow_write(rows, url=None):
        stuck.wait(30)
        written.extend(r.request_id for r in rows)
        return []  # none was traced before

    monkeypatch.setattr(requestlog, "write_requests", slow_write)
    writer = RequestLogWriter(queue_size=5, batch_rows=2, flush_seconds=0.01, retention_days=None).start()
    started = time.perf_counter()
    accepted = [writer.submit(LoggedRequest(f"r{i}", "bot", "1", "/v1/completions", [], "x")) for i in range(500)]
    took = time.perf_counter() - started
    stuck.set()
    assert writer.flush(30)
    writer.close()
    assert took < 0.5, f"submitting 500 rows to a stuck database took {took:.2f} s"
    assert writer.counts["dropped_full"] == accepted.count(False) > 400
    assert sorted(written) == sorted(f"r{i}" for i, ok in enumerate(accepted) if ok)


def test_a_slow_or_failing_trace_store_drops_counted_and_every_user_still_gets_a_200(traced_home, tiny_model, profile,
                                                                                    monkeypatch):
    import httpx

    import mlops.requestlog as requestlog
    from serving.request_log import RequestLogWriter
    from serving.testing import serve_in_thread

    stuck = threading.Event()

    def stuck_then_failing(rows, url=None):
        stuck.wait(30)
        raise ConnectionError("the tracking store is down")

    monkeypatch.setattr(requestlog, "write_requests", stuck_then_failing)
    app, writer = _served(tiny_model, profile, request_log=RequestLogWriter(queue_size=2, batch_rows=1,
                                                                            flush_seconds=0.01, retention_days=None))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        answers = [client.post("/v1/completions", json={"prompt": f"Q{i}", "max_tokens": 1}) for i in range(6)]
        stuck.set()
        assert writer.flush(30)
        metrics = client.get("/metrics").text
    assert [a.status_code for a in answers] == [200] * 6
    dropped, failed = writer.counts["dropped_full"], writer.counts["write_error"]
    assert dropped >= 1 and failed >= 1 and dropped + failed == 6
    assert f'mlops_serve_request_log_rows_total{{outcome="dropped_full"}} {float(dropped)}' in metrics
    assert f'mlops_serve_request_log_rows_total{{outcome="write_error"}} {float(failed)}' in metrics


@pytest.mark.slow  # two child processes import MLflow: about a minute on a busy 2-core machine
def test_mlops_serve_writes_traces_from_a_niced_child_process_and_replaces_one_that_died(traced_home):
    import os

    from mlops.requestlog import LoggedRequest, read_requests
    from serving.request_log import RequestLogWriter

    lag = 30.0
    writer = RequestLogWriter(flush_seconds=0.01, retention_days=None, process=True, idle_lag_seconds=lag).start()
    submitted = time.monotonic()
    writer.submit(LoggedRequest("first", "bot", "1", "/v1/completions", [{"role": "user", "content": "a@b.org"}], "x"))
    assert writer.flush(120)
    took = time.monotonic() - submitted
    child = writer._child._proc
    assert os.getpriority(os.PRIO_PROCESS, child.pid) > os.getpriority(os.PRIO_PROCESS, os.getpid())
    if writer._child.idle_allowed and took < lag:  # a young backlog is written on CPU time nothing else wants
        assert os.sched_getscheduler(child.pid) == os.SCHED_IDLE
    elif writer._child.idle_allowed and took > lag + 1:  # a machine busy for the whole lag: it competes at nice 10
        assert os.sched_getscheduler(child.pid) == os.SCHED_OTHER
    child.kill()
    child.wait()
    writer.submit(LoggedRequest("second", "bot", "1", "/v1/completions", [], "y"))
    assert writer.flush(120)
    replaced = writer._child._proc
    if os.geteuid() == 0:  # draining: the child goes back to the gateway's priority (needs CAP_SYS_NICE)
        assert writer._child.hurry()
        assert os.getpriority(os.PRIO_PROCESS, replaced.pid) == os.getpriority(os.PRIO_PROCESS, os.getpid())
        assert os.sched_getscheduler(replaced.pid) == os.SCHED_OTHER
    writer.close()
    rows = {r["request_id"]: r for r in read_requests()}
    assert set(rows) == {"first", "second"} and "a@b.org" not in rows["first"]["messages"][0]["content"]
    assert writer.counts["written"] == 2 and writer._child is None  # retired when the writer stopped


def test_a_stopping_writer_retires_its_niced_child_and_writes_what_is_queued_itself(traced_home):
    from mlops.requestlog import LoggedRequest, read_requests
    from serving.request_log import RequestLogWriter

    class StarvedChild:  # a niced writer that a busy machine starves: it must not hold the drain
        closed = False

        def write(self, rows):
            raise AssertionError("a draining writer sent rows to its niced child")

        def hurry(self) -> bool:
            return False  # not privileged to raise its priority

        def close(self, timeout: float = 30.0) -> None:
            self.closed = True

    writer = RequestLogWriter(flush_seconds=0.01, retention_days=None)
    writer._child = child = StarvedChild()
    for rid in ("a", "b"):
        writer.submit(LoggedRequest(rid, "bot", "1", "/v1/completions", [], "queued at shutdown"))
    writer._stop.set()  # the gateway is draining before the thread took a batch
    writer.start()
    writer.close()
    assert child.closed and writer._child is None
    assert sorted(r["request_id"] for r in read_requests()) == ["a", "b"] and writer.counts["written"] == 2


def test_traces_wait_for_a_pause_in_traffic_and_a_backlog_past_the_idle_lag_is_written_anyway(traced_home):
    from mlops.requestlog import LoggedRequest
    from serving.request_log import RequestLogWriter

    writer = RequestLogWriter(flush_seconds=0.01, retention_days=None, idle_lag_seconds=1.5)
    busy = [True]
    writer.gateway_busy = lambda: busy[0]
    writer.start()
    submitted = time.monotonic()
    writer.submit(LoggedRequest("during-traffic", "bot", "1", "/v1/completions", [], "x"))
    time.sleep(0.5)
    assert writer.counts["written"] == 0  # requests in flight: the trace waits
    assert writer.flush(30) and writer.counts["written"] == 1
    assert time.monotonic() - submitted >= 1.5  # traffic never paused: written once the lag ran out
    busy[0] = False
    paused = time.monotonic()
    writer.submit(LoggedRequest("in-a-pause", "bot", "1", "/v1/completions", [], "y"))
    assert writer.flush(30) and writer.counts["written"] == 2
    assert time.monotonic() - paused < 1.5
    writer.close()


def test_a_reused_request_id_costs_only_its_own_row(traced_home):
    from mlops.requestlog import LoggedRequest, read_requests, write_requests
    from serving.request_log import RequestLogWriter

    write_requests([LoggedRequest("taken", "bot", "1", "/v1/completions", [], "first")])
    writer = RequestLogWriter(flush_seconds=0.01, retention_days=None)
    for rid in ("a", "taken", "b"):
        writer.submit(LoggedRequest(rid, "bot", "1", "/v1/completions", [], "second"))
    writer.start()
    assert writer.flush(30)
    writer.close()
    rows = {r["request_id"]: r["response"] for r in read_requests()}
    assert rows == {"taken": "first", "a": "second", "b": "second"}
    assert writer.counts["duplicate"] == 1 and writer.counts["written"] == 2


def test_retention_prunes_old_rows_when_the_writer_starts(traced_home):
    from mlops.requestlog import LoggedRequest, read_requests, write_requests
    from serving.request_log import RequestLogWriter

    write_requests([LoggedRequest("old", "bot", "1", "/v1/completions", [], "x", ts=time.time() - 10 * 86400),
                    LoggedRequest("new", "bot", "1", "/v1/completions", [], "y")])
    writer = RequestLogWriter(retention_days=7, flush_seconds=0.01).start()
    deadline = time.monotonic() + 30
    while writer.pruned == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    writer.close()
    assert writer.pruned == 1 and [r["request_id"] for r in read_requests()] == ["new"]


def test_request_log_and_shadow_config_is_typed_and_names_bad_values():
    from pydantic import ValidationError

    from mlops.errors import NotFoundError
    from serving.config import ServeConfig

    cfg = ServeConfig.model_validate({"request_log": {"retention_days": 7, "queue": 100},
                                      "shadow": {"share": 0.2}})
    assert cfg.request_log.enabled and cfg.request_log.retention_days == 7 and cfg.shadow.share == 0.2
    with pytest.raises(ValidationError, match="retention_days"):
        ServeConfig.model_validate({"request_log": {"retention_days": 0}})
    with pytest.raises(ValidationError, match="keep_forever"):
        ServeConfig.model_validate({"request_log": {"keep_forever": True}})
    with pytest.raises(NotFoundError, match="did you mean 'reference_overlap'"):
        ServeConfig.model_validate({"shadow": {"scorer": "reference_overla"}})


def test_the_writer_works_on_postgresql_with_duplicates_and_long_folder_names(postgres_url):
    from mlops.requestlog import LoggedRequest, read_requests
    from serving.request_log import RequestLogWriter
    from serving.request_rows import log_version

    long_name = "checkpoint-folder-of-a-sweep-trial-number-0042-best"
    writer = RequestLogWriter(url=postgres_url, flush_seconds=0.01, retention_days=None)
    for rid in ("a", "a", "b"):
        writer.submit(LoggedRequest(rid, "bot", log_version(long_name), "/v1/completions", [], rid))
    writer.start()
    assert writer.flush(30)
    writer.close()
    rows = read_requests(url=postgres_url)
    assert sorted(r["request_id"] for r in rows) == ["a", "b"] and writer.counts["duplicate"] == 1
    assert len(rows[0]["version"]) <= 40 and rows[0]["version"].startswith(long_name[:31])
