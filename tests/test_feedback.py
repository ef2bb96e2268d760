"""POST /v1/feedback: a rating and an optional correction of a logged answer, checked, and stored scrubbed as
assessments on the answer's MLflow trace (the rating from the sending key's name, a correction as an expectation)."""

from __future__ import annotations

import pytest


@pytest.fixture
def served(traced_home, tiny_model, tmp_path):
    """A keyed server with a request log; yields (client, headers, writer)."""
    import httpx

    from mlops.profile import load_profile
    from serving.auth import KeyStore, add_key
    from serving.request_log import RequestLogWriter
    from serving.server import create_app
    from serving.testing import serve_in_thread

    keys_file = tmp_path / "keys.json"
    key, _ = add_key(keys_file, "helpdesk-app")
    other, _ = add_key(keys_file, "billing-app")
    writer = RequestLogWriter(flush_seconds=0.05)
    app = create_app(tiny_model["path"], load_profile(tiny_model["path"]), model_name="bot", version="3",
                     keys=KeyStore(keys_file), request_log=writer, log_model="bot")
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        client.other_key = {"Authorization": f"Bearer {other}"}
        yield client, {"Authorization": f"Bearer {key}"}, writer


def _answer(client, headers) -> str:
    r = client.post("/v1/chat/completions", headers=headers,
                    json={"messages": [{"role": "user", "content": "Where is my parcel?"}], "max_tokens": 3})
    assert r.status_code == 200
    return r.headers["x-request-id"]


def test_feedback_right_after_an_answer_is_taken_at_once_and_stored_behind_its_trace_scrubbed(served, monkeypatch):
    import threading

    import mlops.requestlog as requestlog
    from mlops.requestlog import read_feedback

    client, headers, writer = served
    store_free, real = threading.Event(), requestlog.write_requests
    monkeypatch.setattr(requestlog, "write_requests", lambda rows, url=None: store_free.wait(60) and real(rows, url))
    rid = _answer(client, headers)  # its row waits in the writer's queue: no trace yet
    sent = client.post("/v1/feedback", headers=headers, timeout=5,  # a stalled writer never stalls the client
                       json={"request_id": rid, "rating": -1, "correction": "It ships Monday; ask bob@example.org"})
    assert sent.status_code == 200, sent.text
    assert sent.json()["request_id"] == rid and sent.json()["rating"] == -1 and sent.json()["status"] == "queued"
    assert read_feedback(request_ids=[rid]) == []
    store_free.set()
    assert writer.flush(30)
    stored = read_feedback(request_ids=[rid])
    assert len(stored) == 1 and stored[0]["rating"] == -1 and stored[0]["source"] == "helpdesk-app"
    assert "bob@example.org" not in stored[0]["correction"] and "ships Monday" in stored[0]["correction"]
    again = client.post("/v1/feedback", headers=headers, json={"request_id": rid, "rating": 1})
    assert again.status_code == 200 and again.json()["status"] == "stored"
    assert len(read_feedback(request_ids=[rid])) == 2


def test_an_answer_is_in_the_request_log_before_its_client_has_it_whatever_the_server_does_after(served, monkeypatch):
    """The row is queued before the answer's last byte is sent, so feedback sent the moment the answer arrives
    finds it; work the server does after sending (metrics here, held up) cannot reorder the two."""
    import threading
    import time

    import mlops.requestlog as requestlog
    from serving.metrics import ServerMetrics

    client, headers, writer = served
    store_free, real = threading.Event(), requestlog.write_requests
    monkeypatch.setattr(requestlog, "write_requests", lambda rows, url=None: store_free.wait(60) and real(rows, url))
    observe = ServerMetrics.observe
    monkeypatch.setattr(ServerMetrics, "observe", lambda self, record: (time.sleep(1.0), observe(self, record)))
    rid = _answer(client, headers)
    assert writer.known(rid), "the answer reached its client before its log row was queued"
    sent = client.post("/v1/feedback", headers=headers, json={"request_id": rid, "rating": 1})
    assert sent.status_code == 200 and sent.json()["status"] == "queued", sent.text
    store_free.set()
    assert writer.flush(30) and writer.feedback_counts["written_behind"] == 1


def test_feedback_behind_an_answer_whose_trace_is_lost_is_counted_lost(served, monkeypatch):
    import threading

    import mlops.requestlog as requestlog

    client, headers, writer = served
    store_free = threading.Event()

    def failing(rows, url=None):
        store_free.wait(60)
        raise RuntimeError("the store refused the trace")

    monkeypatch.setattr(requestlog, "write_requests", failing)
    rid = _answer(client, headers)
    sent = client.post("/v1/feedback", headers=headers, json={"request_id": rid, "rating": 1})
    assert sent.status_code == 200 and sent.json()["status"] == "queued", sent.text
    store_free.set()
    assert writer.flush(30)
    assert writer.counts["write_error"] == 1 and writer.feedback_counts["lost"] == 1
    scraped = client.get("/metrics", headers=headers).text
    assert 'mlops_serve_feedback_total{outcome="lost"} 1.0' in scraped, scraped


def test_feedback_is_an_assessment_on_the_answers_trace_and_another_keys_feedback_is_refused(served):
    import mlflow

    from mlops.requestlog import EXPERIMENT, trace_id_of
    from mlops.tracking import tracking_uri

    client, headers, writer = served
    rid = _answer(client, headers)
    assert writer.flush(30)
    theirs = client.post("/v1/feedback", headers=client.other_key, json={"request_id": rid, "rating": -1})
    assert theirs.status_code == 403 and theirs.json()["error"]["param"] == "request_id", theirs.text
    assert rid in theirs.json()["error"]["message"] and "that key" in theirs.json()["error"]["message"]
    assert client.post("/v1/feedback", headers=headers, json={"request_id": rid, "rating": 1}).status_code == 200
    mlflow.set_tracking_uri(tracking_uri())
    (trace,) = mlflow.search_traces(locations=[mlflow.get_experiment_by_name(EXPERIMENT).experiment_id],
                                    filter_string="tag.`mlops.version` = '3'", return_type="list")
    assert trace.info.trace_id == trace_id_of(rid) and trace.info.tags["mlops.key"] == "helpdesk-app"
    (rating,) = trace.info.assessments
    assert (rating.name, rating.feedback.value, rating.source.source_id) == ("rating", 1, "helpdesk-app")


def test_feedback_for_an_unknown_or_shadow_request_id_is_404(served):
    client, headers, writer = served
    rid = _answer(client, headers)
    assert writer.flush(30)
    for unknown in ("never-served", f"{rid}:shadow"):
        r = client.post("/v1/feedback", headers=headers, json={"request_id": unknown, "rating": 1})
        assert r.status_code == 404 and r.json()["error"]["param"] == "request_id", r.text
        assert r.json()["error"]["code"] == "request_not_found"


MALFORMED = [
    ({"request_id": "x", "rating": 2}, "rating"),
    ({"request_id": "x", "rating": True}, "rating"),
    ({"request_id": "x", "rating": "1"}, "rating"),
    ({"request_id": "x", "rating": 0.5}, "rating"),
    ({"rating": 1}, "request_id"),
    ({"request_id": "", "rating": 1}, "request_id"),
    ({"request_id": "x", "rating": 1, "correction": ["a"]}, "correction"),
    ({"request_id": "x", "rating": 1, "correction": "x" * 20001}, "correction"),
]


def test_malformed_feedback_is_400_naming_the_field(served):
    client, headers, _ = served
    for body, param in MALFORMED:
        r = client.post("/v1/feedback", headers=headers, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
        assert param in r.json()["error"]["message"]


def test_feedback_needs_a_key_and_a_json_object(served):
    client, headers, _ = served
    assert client.post("/v1/feedback", json={"request_id": "x", "rating": 1}).status_code == 401
    r = client.post("/v1/feedback", headers={**headers, "Content-Type": "application/json"}, content=b"[1, 2]")
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]


def test_feedback_is_refused_with_503_when_the_log_database_fails(served, monkeypatch):
    client, headers, writer = served
    rid = _answer(client, headers)

    def down(_item):
        raise ConnectionError("database is down")

    monkeypatch.setattr(writer, "write_feedback", down)
    r = client.post("/v1/feedback", headers=headers, json={"request_id": rid, "rating": -1})
    assert r.status_code == 503 and r.json()["error"]["code"] == "feedback_unavailable"
    assert _answer(client, headers)  # serving goes on


def test_a_server_without_a_request_log_says_feedback_is_off(tiny_model):
    import httpx

    from mlops.profile import load_profile
    from serving.server import create_app
    from serving.testing import serve_in_thread

    app = create_app(tiny_model["path"], load_profile(tiny_model["path"]), model_name="bot")
    with serve_in_thread(app) as url:
        r = httpx.post(f"{url}/v1/feedback", json={"request_id": "x", "rating": 1}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "feedback_disabled"
