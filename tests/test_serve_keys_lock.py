"""The API-keys file under concurrent writers: a read-modify-write holds an exclusive lock, so no key is lost."""

from __future__ import annotations

import multiprocessing


def _add_many(path: str, prefix: str, count: int) -> None:
    from pathlib import Path

    from serving.auth import add_key

    for n in range(count):
        add_key(Path(path), f"{prefix}-{n}")


def test_two_concurrent_adds_both_keep_their_keys(tmp_path):
    from serving.auth import read_keys

    path = tmp_path / "keys.json"
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_add_many, args=(str(path), name, 25)) for name in ("alice", "bob")]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    names = sorted(k["name"] for k in read_keys(path))
    assert names == sorted([f"alice-{n}" for n in range(25)] + [f"bob-{n}" for n in range(25)])


def test_revoke_under_the_lock_keeps_keys_added_meanwhile(tmp_path):
    from serving.auth import add_key, read_keys, revoke_key

    path = tmp_path / "keys.json"
    _, first = add_key(path, "first")
    ctx = multiprocessing.get_context("fork")
    adder = ctx.Process(target=_add_many, args=(str(path), "late", 20))
    adder.start()
    revoke_key(path, first["id"])
    adder.join(60)
    keys = {k["name"]: k for k in read_keys(path)}
    assert keys["first"]["revoked"] is True
    assert {f"late-{n}" for n in range(20)} <= set(keys)
