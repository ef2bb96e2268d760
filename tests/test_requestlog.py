"""The request log is MLflow traces: scrubbed answers with their version tags, feedback as assessments; the old
tables migrate into traces once (a rerun is a no-op)."""

from __future__ import annotations

import json
import time


def test_requests_and_feedback_are_stored_scrubbed_and_read_back(traced_home):
    from mlops.requestlog import (
        Feedback,
        LoggedRequest,
        read_feedback,
        read_requests,
        write_feedback,
        write_requests,
    )

    user = LoggedRequest("req-1", "bot", "2", "/v1/chat/completions",
                         [{"role": "user", "content": "my email is jane.doe@example.com, where is my order?"}],
                         "I sent it to jane.doe@example.com yesterday.", tokens_in=12, tokens_out=9, key="helpdesk")
    shadow = LoggedRequest("req-1.shadow", "bot", "3", "/v1/chat/completions", user.messages, "It shipped.",
                           role="shadow", parent_id="req-1")
    assert write_requests([user, shadow]) == []
    write_feedback(Feedback("req-1", -1, correction="Orders ship within 2 days; mail me at jane.doe@example.com"))
    rows = read_requests(model="bot", role="user")
    assert [r["request_id"] for r in rows] == ["req-1"] and rows[0]["key"] == "helpdesk"
    assert "jane.doe@example.com" not in rows[0]["messages"][0]["content"] + rows[0]["response"]
    assert "[EMAIL]" in rows[0]["response"] and (rows[0]["tokens_in"], rows[0]["tokens_out"]) == (12, 9)
    assert read_requests(parent_ids=["req-1"])[0]["version"] == "3"
    feedback = read_feedback(since=time.time() - 60)
    assert feedback[0]["rating"] == -1 and "jane.doe" not in feedback[0]["correction"]
    assert write_requests([user]) == ["req-1"]  # a request id is traced once


def test_a_logged_answer_is_an_mlflow_trace_with_its_version_tag_and_feedback_as_assessments(traced_home):
    import mlflow

    from mlops.requestlog import (
        EXPERIMENT,
        Feedback,
        LoggedRequest,
        trace_id_of,
        write_feedback,
        write_requests,
    )
    from mlops.tracking import tracking_uri

    write_requests([LoggedRequest("asked-1", "support-bot", "4", "/v1/chat/completions",
                                  [{"role": "user", "content": "Where is my parcel?"}], "On its way.", key="shop",
                                  engine="hf", quantization="none", latency_ms=42.0, ttft_ms=7.5, tokens_in=5,
                                  tokens_out=3),
                    LoggedRequest("asked-1:shadow", "support-bot", "5", "/v1/chat/completions", [], "Soon.",
                                  role="shadow", parent_id="asked-1")])
    write_feedback(Feedback("asked-1", -1, correction="It arrives Monday.", source="shop"))
    mlflow.set_tracking_uri(tracking_uri())
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)
    (trace,) = mlflow.search_traces(locations=[experiment.experiment_id], return_type="list",
                                    filter_string="tag.`mlops.version` = '4'")
    assert trace.info.trace_id == trace_id_of("asked-1") and trace.info.client_request_id == "asked-1"
    tags, meta = trace.info.tags, trace.info.trace_metadata
    assert (tags["mlops.model"], tags["mlops.role"], tags["mlops.key"], tags["mlops.engine"]) == \
        ("support-bot", "user", "shop", "hf")
    assert tags["mlops.status"] == "200" and json.loads(meta["mlops.ttft_ms"]) == 7.5
    assert json.loads(meta["mlflow.trace.tokenUsage"])["total_tokens"] == 8
    assert trace.data.spans[0].outputs == "On its way."
    (shadow,) = mlflow.search_traces(locations=[experiment.experiment_id], return_type="list",
                                     filter_string="tag.`mlops.role` = 'shadow'")
    assert shadow.info.tags["mlops.parent_trace"] == trace.info.trace_id
    kinds = {(a.name, a.source.source_id, a.feedback.value if a.feedback else a.expectation.value)
             for a in trace.info.assessments}
    assert kinds == {("rating", "shop", -1), ("correction", "shop", "It arrives Monday.")}


def test_retention_prunes_old_requests_and_their_feedback(traced_home):
    from mlops.requestlog import (
        Feedback,
        LoggedRequest,
        prune,
        read_feedback,
        read_requests,
        write_feedback,
        write_requests,
    )

    old = LoggedRequest("old", "bot", "1", "/v1/completions", [], "x", ts=time.time() - 40 * 86400)
    new = LoggedRequest("new", "bot", "1", "/v1/completions", [], "y")
    write_requests([old, new])
    write_feedback(Feedback("old", 1))
    assert prune(30) == 1
    assert [r["request_id"] for r in read_requests()] == ["new"] and read_feedback() == []


def _legacy_tables(url: str) -> None:
    """The tables serving wrote before traces, with two answers, a shadow answer and two feedbacks."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE TABLE mlops_request_log (request_id VARCHAR(80) PRIMARY KEY, ts FLOAT NOT NULL, model VARCHAR(256)"
            " NOT NULL, version VARCHAR(40) NOT NULL, role VARCHAR(16) NOT NULL, parent_id VARCHAR(80), route "
            "VARCHAR(80) NOT NULL, profile_hash VARCHAR(40), messages TEXT NOT NULL, response TEXT NOT NULL, status "
            "INTEGER NOT NULL, error TEXT, latency_ms FLOAT, ttft_ms FLOAT, tokens_in INTEGER, tokens_out INTEGER)"))
        conn.execute(sa.text(
            "CREATE TABLE mlops_feedback (feedback_id VARCHAR(40) PRIMARY KEY, request_id VARCHAR(80) NOT NULL, ts "
            "FLOAT NOT NULL, rating INTEGER NOT NULL, correction TEXT, source VARCHAR(120))"))
        now, asked = time.time(), json.dumps([{"role": "user", "content": "Where is it?"}])
        for rid, version, role, parent in (("a", "1", "user", None), ("b", "1", "user", None), ("b:shadow", "2",
                                                                                              "shadow", "b")):
            conn.execute(sa.text("INSERT INTO mlops_request_log VALUES (:rid, :ts, 'bot', :v, :role, :parent, "
                                 "'/v1/chat/completions', 'p1', :m, 'Here.', 200, NULL, 12.0, 3.0, 4, 2)"),
                         {"rid": rid, "ts": now - 60, "v": version, "role": role, "parent": parent, "m": asked})
        conn.execute(sa.text("INSERT INTO mlops_feedback VALUES ('f1', 'a', :ts, -1, 'It is at the depot.', 'app'),"
                             " ('f2', 'gone', :ts, 1, NULL, NULL)"), {"ts": now - 30})
    engine.dispose()


def test_migration_moves_the_old_tables_into_traces_once_and_drops_them(traced_home):
    import sqlalchemy as sa

    from mlops.requestlog import read_feedback, read_requests
    from mlops.requestlog_migrate import migrate
    from mlops.tracking import tracking_uri

    _legacy_tables(tracking_uri())
    first = migrate()
    assert (first["requests"], first["feedback"], first["orphaned_feedback"]) == (3, 1, 1)
    assert set(first["dropped"]) == {"mlops_request_log", "mlops_feedback"}
    rows = {r["request_id"]: r for r in read_requests(model="bot")}
    assert set(rows) == {"a", "b", "b:shadow"} and rows["b:shadow"]["parent_id"] == "b"
    assert rows["a"]["messages"] == [{"role": "user", "content": "Where is it?"}] and rows["a"]["ttft_ms"] == 3.0
    (feedback,) = read_feedback()
    assert (feedback["feedback_id"], feedback["rating"], feedback["source"]) == ("f1", -1, "app")
    assert not {"mlops_request_log", "mlops_feedback"} & set(sa.inspect(sa.create_engine(tracking_uri()))
                                                             .get_table_names())
    assert migrate()["requests"] == 0 and len(read_requests()) == 3 and len(read_feedback()) == 1  # rerun: no-op


def test_a_migration_interrupted_after_writing_traces_resumes_without_duplicates(traced_home, monkeypatch):
    import pytest

    import mlops.requestlog_migrate as migration
    from mlops.requestlog import read_feedback, read_requests
    from mlops.tracking import tracking_uri

    _legacy_tables(tracking_uri())
    monkeypatch.setattr(migration, "_move_feedback", lambda *a: (_ for _ in ()).throw(RuntimeError("store went away")))
    with pytest.raises(RuntimeError):
        migration.migrate()
    monkeypatch.undo()
    monkeypatch.setenv("MLOPS_HOME", str(traced_home))
    again = migration.migrate()  # the tables were kept: the rest moves now, the traces already there are skipped
    assert (again["requests"], again["already_traced"], again["feedback"]) == (0, 3, 1)
    assert len(read_requests()) == 3 and len(read_feedback()) == 1
