"""The sample data generator is deterministic and injects what the demo needs."""

from __future__ import annotations

import json

from mlops.data.format import file_sha256
from mlops.data.sample import EVAL_ITEMS, generate


def test_same_seed_same_files_and_every_injection_is_present(tmp_path):
    evals = tmp_path / "suite.jsonl"
    evals.write_text(json.dumps({"id": "e1", "prompt": "How many days does a customer have to return an item?"}) + "\n")
    first = generate(tmp_path / "a", seed=3, eval_files=[evals])
    second = generate(tmp_path / "b", seed=3, eval_files=[evals])
    assert first == second
    for name in first:
        assert file_sha256(tmp_path / "a" / name) == file_sha256(tmp_path / "b" / name)
    other = generate(tmp_path / "c", seed=4)
    assert file_sha256(tmp_path / "c" / "support_chats.jsonl") != file_sha256(tmp_path / "a" / "support_chats.jsonl")
    assert sum(other.values()) > 3000
    raw = (tmp_path / "a" / "support_chats.jsonl").read_bytes()
    text = raw.decode("utf-8", errors="replace")
    assert all(q in text for _, q in EVAL_ITEMS) and "How many days does a customer have to return" in text
    assert "@example.com" in text and "4111 1111 1111 1111" in text
    assert b"\xe9" in raw and '"role": "bot"' in text  # a non-UTF-8 byte and an unknown role
    leaks = [json.loads(line) for line in (tmp_path / "a" / "eval_leaks.jsonl").read_text().splitlines()]
    assert [item["id"] for item in leaks] == [item_id for item_id, _ in EVAL_ITEMS]
