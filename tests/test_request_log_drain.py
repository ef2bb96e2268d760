"""A stopping server loses no answer's log row: the backlog is written within the drain's deadline, what is left is
spooled for the next server, and a batch cut short (a writer killed between a trace and its spans) is completed
when it is written again."""

from __future__ import annotations

import os
import threading

import pytest


def _row(rid: str, text: str = "an answer"):
    from mlops.requestlog import LoggedRequest

    return LoggedRequest(rid, "bot", "1", "/v1/chat/completions", [{"role": "user", "content": f"mail me at {rid}@x.org"}],
                         text, key="soak-client")


def _half_write(row) -> None:
    """What a writer killed between the two MLflow calls leaves: the trace's info, not its spans."""
    from mlops.requestlog import _trace, store

    client, experiment_id = store()
    client.start_trace(_trace(row, experiment_id)[0])


def _as_if_spooled_by(path, pid: int | str):
    """The spool file renamed as if another process (this test's next "server", or a dead one) had written it."""
    return path.rename(path.with_name(path.name.replace(f"-{os.getpid()}.", f"-{pid}.")))


def test_a_half_written_trace_is_hidden_from_readers_and_completed_when_its_row_is_written_again(traced_home):
    from mlops.requestlog import existing_traces, read_requests, stored_traces, trace_id_of, write_requests

    _half_write(_row("cut-short"))
    tid = trace_id_of("cut-short")
    assert stored_traces([tid]) == {tid: False} and existing_traces([tid]) == set()
    assert read_requests() == []  # an answer without its prompt and text is not served to harvests and reports

    skipped = write_requests([_row("cut-short"), _row("fresh")])
    rows = {r["request_id"]: r for r in read_requests()}
    assert skipped == [] and set(rows) == {"cut-short", "fresh"}
    assert rows["cut-short"]["response"] == "an answer" and rows["cut-short"]["key"] == "soak-client"
    assert write_requests([_row("cut-short", "a reused id")]) == ["cut-short"]  # complete now: a reuse is skipped
    assert read_requests(request_ids=["cut-short"])[0]["response"] == "an answer"


def test_a_writer_process_that_dies_mid_batch_has_the_batch_written_again_in_full(traced_home):
    from mlops.requestlog import read_requests, write_requests
    from serving.request_log import RequestLogWriter

    class DiesOnce:  # a trace writer process killed after its first trace, before any spans
        calls = 0

        def write(self, rows, idle_for: float = 0.0):
            self.calls += 1
            if self.calls == 1:
                _half_write(rows[0])
                raise EOFError("the writer process went away")
            return write_requests(rows)

        def hurry(self) -> bool:
            return True

        def close(self, timeout: float = 30.0) -> None:
            pass

    writer = RequestLogWriter(flush_seconds=0.01, retention_days=None)
    writer._child = child = DiesOnce()
    for rid in ("a", "b", "c"):
        writer.submit(_row(rid))
    writer.start()
    assert writer.flush(60)
    writer.close()
    assert child.calls == 2 and writer.counts["written"] == 3 and not writer.counts["write_error"]
    assert sorted(r["request_id"] for r in read_requests()) == ["a", "b", "c"]


def test_rows_unwritten_at_the_drain_deadline_are_spooled_scrubbed_and_written_by_the_next_server(traced_home,
                                                                                                 monkeypatch):
    import mlops.requestlog as requestlog
    from mlops.requestlog import Feedback, read_feedback, read_requests
    from serving.request_log import RequestLogWriter
    from serving.request_spool import spool_dir

    real_write, store_down = requestlog.write_requests, threading.Event()

    def hanging_store(rows, url=None):
        store_down.wait(60)
        raise ConnectionError("the tracking store did not answer")

    monkeypatch.setattr(requestlog, "write_requests", hanging_store)
    writer = RequestLogWriter(flush_seconds=0.01, retention_days=None, drain_seconds=0.5)
    for rid in ("r1", "r2", "r3"):
        writer.submit(_row(rid))
    assert writer.write_feedback(Feedback("r3", 1, correction="call 415 555 0100", source="soak-client")) == "queued"
    writer.start()
    writer.close()  # SIGTERM: the store hangs past the deadline
    store_down.set()
    assert writer.counts["spooled"] == 3
    [spooled] = list(spool_dir(None).iterdir())
    assert "r1@x.org" not in spooled.read_text() and "[EMAIL]" in spooled.read_text()
    _as_if_spooled_by(spooled, os.getpid() + 1)  # the next server is this test's process too

    monkeypatch.setattr(requestlog, "write_requests", real_write)
    restarted = RequestLogWriter(flush_seconds=0.01, retention_days=None, batch_rows=2).start()
    assert restarted.flush(60)
    restarted.close()
    rows = read_requests()
    assert sorted(r["request_id"] for r in rows) == ["r1", "r2", "r3"] and restarted.counts["written"] == 3
    assert [(f["request_id"], f["rating"]) for f in read_feedback()] == [("r3", 1)]
    assert list(spool_dir(None).iterdir()) == []


def test_a_spool_file_is_taken_by_one_server_never_by_the_one_writing_it_and_back_from_a_dead_claim(traced_home):
    import subprocess
    import sys

    from serving.request_spool import CLAIMED, claim, load, spool

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = dead.stdout.strip()
    own = spool([_row("s0")], [], None)
    assert claim(None) == []  # spooled by this server as it stops: not its own next batch
    other = _as_if_spooled_by(own, dead_pid)  # another server's
    [mine] = claim(None)
    assert mine.name == f"{other.name}{CLAIMED}{os.getpid()}"
    assert claim(None) == []  # held by a live server (this one): a second server starting now leaves it
    mine.rename(mine.with_name(f"{other.name}{CLAIMED}{dead_pid}"))  # the claim of a server that died replaying
    [taken] = claim(None)
    assert [r.request_id for r in load(taken)[0]] == ["s0"]


def test_a_negative_drain_deadline_is_refused_naming_the_field():
    from pydantic import ValidationError

    from serving.config import RequestLogConfig

    with pytest.raises(ValidationError, match="drain_seconds"):
        RequestLogConfig(drain_seconds=-1.0)
