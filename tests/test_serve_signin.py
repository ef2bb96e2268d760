"""Password sign-in on the server: checked off the event loop, under per-user and per-address backoff, and
never locking out API keys or leaking the password."""

from __future__ import annotations

import threading
import time

import pytest

from mlops.identities import AuthError
from mlops.identities import Identity as Person

PASSWORD = "right-password-1"


class FakeStore:
    """`authenticate` that counts its calls; `delay` makes each call as slow as a real key unlock (or slower)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls, self.delay, self._lock = [], delay, threading.Lock()

    def __call__(self, name: str, password: str) -> Person:
        with self._lock:
            self.calls.append(name)
        time.sleep(self.delay)
        if password != PASSWORD:
            raise AuthError("unknown user or wrong password")
        return Person(name, "viewer", signer=object())


def client_for(tmp_path, fake, *, client_addr: str = "10.0.0.1", **backoff):
    """A TestClient of a gateway with no model (a passed request answers 503 model_not_loaded), an API key, and
    identities checked by `fake`; plus the key."""
    from fastapi.testclient import TestClient

    from serving.auth import IdentityVerifier, KeyStore, add_key
    from serving.backoff import Backoff
    from serving.config import ServeConfig
    from serving.server import build_app
    from serving.slot import ModelSlot

    key, _ = add_key(tmp_path / "keys.json", "bot")
    store = KeyStore(tmp_path / "keys.json", extra=[IdentityVerifier(authenticate=fake, backoff=Backoff(**backoff))])
    app = build_app(ModelSlot("empty"), ServeConfig(), keys=store)
    return TestClient(app, client=(client_addr, 5000)), key


def bearer(user: str, password: str) -> dict:
    return {"Authorization": f"Bearer {user}:{password}"}


def test_a_burst_of_wrong_passwords_is_locked_out_without_checking_again(tmp_path):
    fake = FakeStore()
    client, key = client_for(tmp_path, fake, free_per_user=3, base=60)
    answers = [client.get("/v1/models", headers=bearer("alice", f"guess-{i}")) for i in range(10)]
    assert [a.status_code for a in answers] == [401] * 3 + [429] * 7
    assert fake.calls == ["alice"] * 3  # locked out: the expensive check did not run again
    locked = answers[-1]
    assert locked.json()["error"]["code"] == "too_many_sign_in_attempts"
    assert 0 < int(locked.headers["retry-after"]) <= 60
    # Even the right password waits out the lockout, and an API key from the same address never waits.
    assert client.get("/v1/models", headers=bearer("alice", PASSWORD)).status_code == 429
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 503
    assert fake.calls == ["alice"] * 3


def test_another_user_or_address_is_not_locked_out_by_someone_elses_failures(tmp_path):
    fake = FakeStore()
    client, _ = client_for(tmp_path, fake, free_per_user=3, free_per_address=100, base=60)
    for i in range(5):
        client.get("/v1/models", headers=bearer("alice", f"guess-{i}"))
    assert client.get("/v1/models", headers=bearer("bob", PASSWORD)).status_code == 503  # signed in
    other, _ = client_for(tmp_path / "b", fake, client_addr="10.0.0.2", free_per_user=3, base=60)
    assert other.get("/v1/models", headers=bearer("carol", PASSWORD)).status_code == 503


def test_failures_from_one_address_lock_out_that_address_across_users(tmp_path):
    fake = FakeStore()
    client, key = client_for(tmp_path, fake, free_per_user=100, free_per_address=4, base=60)
    codes = [client.get("/v1/models", headers=bearer(f"user{i}", "wrong-password")).status_code for i in range(6)]
    assert codes == [401] * 4 + [429] * 2 and len(fake.calls) == 4
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 503


def test_a_success_resets_the_users_count_and_the_lockout_doubles(tmp_path):
    from serving.backoff import Backoff

    now = [1000.0]
    backoff = Backoff(free_per_user=2, base=10, clock=lambda: now[0])
    keys = ["user:alice"]
    for _ in range(2):
        assert backoff.begin(keys) == 0
        backoff.end(keys, ok=False)
    assert backoff.begin(keys) == 10
    now[0] += 10
    assert backoff.begin(keys) == 0
    backoff.end(keys, ok=False)
    assert backoff.begin(keys) == 20  # doubled
    now[0] += 20
    assert backoff.begin(keys) == 0
    backoff.end(keys, ok=True)
    for _ in range(2):
        assert backoff.begin(keys) == 0
        backoff.end(keys, ok=False)


def test_sign_in_runs_off_the_event_loop_so_health_answers_while_it_works(tmp_path):
    fake = FakeStore(delay=1.0)
    client, _ = client_for(tmp_path, fake)
    done = {}

    def slow() -> None:
        done["status"] = client.get("/v1/models", headers=bearer("alice", PASSWORD)).status_code

    thread = threading.Thread(target=slow)
    thread.start()
    while not fake.calls:
        time.sleep(0.01)
    started = time.monotonic()
    assert client.get("/health").status_code in (200, 503)
    assert time.monotonic() - started < 0.5 and thread.is_alive()  # answered while the sign-in still ran
    thread.join(5)
    assert done["status"] == 503  # signed in (no model loaded behind it)


def test_the_same_token_sent_at_once_is_checked_once_and_then_remembered(tmp_path):
    fake = FakeStore(delay=0.3)
    client, _ = client_for(tmp_path, fake)
    threads = [threading.Thread(target=client.get, args=("/v1/models",), kwargs={"headers": bearer("bob", PASSWORD)})
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert client.get("/v1/models", headers=bearer("bob", PASSWORD)).status_code == 503
    assert fake.calls == ["bob"]


def test_the_password_never_reaches_the_log_or_the_answer(tmp_path, caplog):
    import logging

    def broken(name, password):
        raise RuntimeError(f"store down while checking {password}")  # an error that quotes its input

    caplog.set_level(logging.DEBUG)
    client, _ = client_for(tmp_path, FakeStore())
    wrong = client.get("/v1/models", headers=bearer("alice", "s3cret-wrong-pw"))
    client2, _ = client_for(tmp_path / "b", broken)
    down = client2.get("/v1/models", headers=bearer("alice", "s3cret-down-pw"))
    assert wrong.status_code == 401 and down.status_code == 503 and down.headers["retry-after"]
    for text in (caplog.text, wrong.text, down.text):
        assert "s3cret" not in text


@pytest.mark.parametrize("token", ["mlk_nope_nope", "alice:", ":pw"])
def test_tokens_that_are_no_password_are_refused_without_counting(tmp_path, token):
    fake = FakeStore()
    client, _ = client_for(tmp_path, fake, free_per_user=1, free_per_address=1)
    for _ in range(3):
        assert client.get("/v1/models", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    assert fake.calls == []
