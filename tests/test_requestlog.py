"""The request log stores scrubbed requests, shadow answers and feedback in the registry's database."""

from __future__ import annotations

import time


def test_requests_and_feedback_are_stored_scrubbed_and_read_back(mlops_home):
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
                         "I sent it to jane.doe@example.com yesterday.", tokens_in=12, tokens_out=9)
    shadow = LoggedRequest("req-1.shadow", "bot", "3", "/v1/chat/completions", user.messages, "It shipped.",
                           role="shadow", parent_id="req-1")
    write_requests([user, shadow])
    write_feedback(Feedback("req-1", -1, correction="Orders ship within 2 days; mail me at jane.doe@example.com"))
    rows = read_requests(model="bot", role="user")
    assert [r["request_id"] for r in rows] == ["req-1"]
    assert "jane.doe@example.com" not in rows[0]["messages"][0]["content"] + rows[0]["response"]
    assert "[EMAIL]" in rows[0]["response"]
    assert read_requests(parent_ids=["req-1"])[0]["version"] == "3"
    feedback = read_feedback(since=time.time() - 60)
    assert feedback[0]["rating"] == -1 and "jane.doe" not in feedback[0]["correction"]


def test_retention_prunes_old_requests_and_their_feedback(mlops_home):
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
