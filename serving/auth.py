"""API keys for `mlops serve`: `Authorization: Bearer <key>` checked against a file of hashed keys.

Keys are 256 random bits (`mlk_<id>_<secret>`), shown once when made and stored only as a SHA-256 digest.
A slow password hash (argon2, bcrypt) protects low-entropy secrets a person picks; a key with 256 bits of
entropy cannot be guessed from its digest, and SHA-256 costs microseconds per request where argon2 would
cost tens of milliseconds on every call. The file is re-read when it changes, so `mlops serve keys add` and
`revoke` take effect without a restart. Other verifiers (the registry's identities file) can be chained in
through `KeyStore(..., extra=[...])`: each takes the bearer token and returns an identity or None. The
server asks `KeyStore.check`, which runs password sign-in off its event loop, under per-user and per-address
backoff (`serving.backoff`); API keys never wait behind it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from mlops.errors import ConfigError, NotFoundError

KEY_PREFIX = "mlk_"
log = logging.getLogger("mlops.serve")


@dataclass(frozen=True)
class Identity:
    key_id: str
    name: str


def keys_path(configured: str | Path) -> Path:
    path = Path(configured).expanduser()
    if path.is_absolute():
        return path
    from mlops.paths import project_home

    return project_home() / path


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def read_keys(path: Path) -> list[dict]:
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        keys = data["keys"]
        assert isinstance(keys, list) and all(isinstance(k, dict) and "sha256" in k and "id" in k for k in keys)
    except Exception as err:  # noqa: BLE001 - any malformed file gets the same message
        raise ConfigError(f"API keys file {path} is malformed ({type(err).__name__}: {err}). Fix: restore it, "
                          "or delete it and make new keys with `mlops serve keys add --name NAME`.") from None
    return keys


def _write_keys(path: Path, keys: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"schema_version": 1, "hash": "sha256", "keys": keys}, handle, indent=2)
    os.replace(tmp, path)


def add_key(path: Path, name: str) -> tuple[str, dict]:
    """Make a key named `name`; returns (the key, shown only now; its stored entry)."""
    if not name.strip():
        raise ConfigError("an API key needs a name (who or what uses it). Fix: pass --name, e.g. --name eval-bot.")
    key_id = secrets.token_hex(4)
    key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    entry = {"id": key_id, "name": name.strip(), "sha256": digest(key), "created": int(time.time()), "revoked": False}
    with _keys_lock(path):  # read-modify-write: two `add`s at once must both keep their key
        _write_keys(path, [*read_keys(path), entry])
    return key, entry


def _keys_lock(path: Path):
    """An exclusive lock beside the keys file (not on it: `os.replace` swaps the file's inode)."""
    from mlops.files import exclusive_lock

    return exclusive_lock(path.with_name(f".{path.name}.lock"))


def revoke_key(path: Path, key_id: str) -> dict:
    with _keys_lock(path):
        keys = read_keys(path)
        for entry in keys:
            if entry["id"] == key_id:
                entry["revoked"] = True
                _write_keys(path, keys)
                return entry
    from mlops.errors import did_you_mean

    raise NotFoundError(f"no API key with id '{key_id}' in {path}; {did_you_mean(key_id, [k['id'] for k in keys])}.")


class Throttled(Exception):
    """Sign-in for this user or address is locked out for `retry_after` more seconds (serving.backoff)."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"too many failed sign-ins; retry after {retry_after:g} s")
        self.retry_after = retry_after


class Unavailable(Exception):
    """The identity store could not be asked (an outage, a ledger that does not verify): nobody can be checked."""


@dataclass(frozen=True)
class Verdict:
    identity: Identity | None
    why: str = ""
    status: int = 200  # 401 refused, 429 locked out (retry_after seconds), 503 the identity store is down
    retry_after: float = 0.0


class IdentityVerifier:
    """`Bearer <user>:<password>` checked against the registry's identities: the password unlocks the person's key
    file (argon2id, ~50 ms by design) and the verified ledger must still name that key.

    A verdict is remembered for `ttl` seconds under the token's SHA-256 (failures too). Failed attempts earn the
    user and the client address a lockout (`serving.backoff`); while locked out nothing is checked. The server
    runs the check on a worker thread (`check_async`), never on its event loop, and concurrent requests with the
    same token share one check. Only the name is kept: the unlocked signer is dropped at once, and neither the
    password nor key material is logged or answered. A changed identity takes effect when verdicts expire."""

    def __init__(self, *, ttl: float = 60.0, backoff=None, authenticate: Callable | None = None) -> None:
        from serving.backoff import Backoff

        self.ttl = ttl
        self.backoff = backoff or Backoff()
        self._authenticate = authenticate  # default: mlops.identities.authenticate (a fake in tests)
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, Identity | None]] = {}
        self._running: dict[str, Future] = {}

    def __call__(self, token: str, client: str | None = None) -> Identity | None:
        """The same rules as `check_async`, checked on the calling thread."""
        parsed = self._parse(token, client)
        if parsed is None:
            return None
        name, password, key, keys, remembered = parsed
        if remembered is not None:
            return remembered
        return self._checked(name, password, key, keys)

    async def check_async(self, token: str, client: str | None = None) -> Identity | None:
        """None (refused), an identity, or Throttled / Unavailable; the argon2 work runs on a worker thread."""
        import asyncio

        import anyio.to_thread

        parsed = self._parse(token, client)
        if parsed is None:
            return None
        name, password, key, keys, remembered = parsed
        if remembered is not None:
            return remembered
        with self._lock:
            running = self._running.get(key)
            if running is None:
                self._running[key] = mine = Future()
        if running is not None:  # the same token is being checked for another request: share its verdict
            self.backoff.end(keys, ok=None)
            return await asyncio.wrap_future(running)
        try:
            identity = await anyio.to_thread.run_sync(self._checked, name, password, key, keys)
            mine.set_result(identity)
            return identity
        except BaseException as err:
            mine.set_exception(err)
            mine.exception()  # retrieved: a future nobody else waited on must not warn
            raise
        finally:
            with self._lock:
                self._running.pop(key, None)

    def _parse(self, token: str, client: str | None):
        """(name, password, digest, backoff keys, remembered identity) or None for a token that is no password.
        A remembered success answers at once; a remembered failure still counts, and a lockout raises."""
        name, sep, password = token.partition(":")
        if not sep or not name or not password:
            return None
        key, now = digest(token), time.monotonic()
        with self._lock:
            remembered = self._seen.get(key)
        if remembered is not None and now - remembered[0] >= self.ttl:
            remembered = None
        if remembered is not None and remembered[1] is not None:
            return name, password, key, [], remembered[1]  # proved within ttl: a lockout by others cannot stop it
        keys = [f"user:{name}"] + ([f"addr:{client}"] if client else [])
        wait = self.backoff.begin(keys)
        if wait:
            raise Throttled(wait)
        if remembered is not None:  # the same wrong password again: a failure, and nothing to compute
            self.backoff.end(keys, ok=False)
            return None
        return name, password, key, keys, None

    def _checked(self, name: str, password: str, key: str, keys: list[str]) -> Identity | None:
        """Runs the expensive check for an attempt `_parse` began; ends it in the backoff either way."""
        from mlops.identities import AuthError, authenticate

        ok = None
        try:
            try:
                person = (self._authenticate or authenticate)(name, password)
                identity: Identity | None = Identity(f"user:{name}", person.name)
            except AuthError:
                identity = None
            except Exception as err:  # noqa: BLE001 - an outage is not a wrong password: neither counted nor kept
                # Only the error's kind and the name: the password and any key material stay out of the log.
                log.error("sign-in of '%s' could not be checked: %s", name, type(err).__name__)
                raise Unavailable("the identity store cannot be read now") from None
            ok = identity is not None
            with self._lock:
                if len(self._seen) > 10_000:  # bounded: forget everything rather than grow without end
                    self._seen.clear()
                self._seen[key] = (time.monotonic(), identity)
            return identity
        finally:
            self.backoff.end(keys, ok=ok)


class KeyStore:
    """Verifies bearer tokens against the keys file (re-read when it changes) and any extra verifiers."""

    def __init__(self, path: Path, *, extra: list[Callable[[str], Identity | None]] | None = None,
                 recheck_seconds: float = 2.0) -> None:
        self.path = Path(path)
        self.extra = list(extra or [])
        self.recheck_seconds = recheck_seconds
        self._lock = threading.Lock()
        self._by_digest: dict[str, Identity] = {}
        self._stamp: tuple | None = None
        self._checked = 0.0
        self._reload()

    def count(self) -> int:
        return len(self._by_digest)

    def verify(self, authorization: str | None, client: str | None = None) -> tuple[Identity | None, str]:
        """(identity, "") for a valid key; (None, why) otherwise. Checks extra verifiers on this thread."""
        found, why, token = self._by_key(authorization)
        if found is not None or not token:
            return found, why
        for verifier in self.extra:
            try:
                identity = verifier(token, client) if isinstance(verifier, IdentityVerifier) else verifier(token)
            except (Throttled, Unavailable) as err:
                return None, str(err)
            if identity is not None:
                return identity, ""
        return None, "invalid API key"

    async def check(self, authorization: str | None, client: str | None = None) -> Verdict:
        """What the server answers: an API key is looked up on the event loop (microseconds, never locked out);
        a password sign-in runs on a worker thread, under its backoff."""
        import anyio.to_thread

        found, why, token = self._by_key(authorization)
        if found is not None or not token:
            return Verdict(found, why, 200 if found else 401)
        for verifier in self.extra:
            try:
                if isinstance(verifier, IdentityVerifier):
                    identity = await verifier.check_async(token, client)
                else:
                    identity = await anyio.to_thread.run_sync(verifier, token)
            except Throttled as err:
                return Verdict(None, f"too many failed sign-ins from this user or address; retry in "
                               f"{err.retry_after:g} seconds", 429, err.retry_after)
            except Unavailable as err:
                return Verdict(None, f"{err}; retry shortly or use an API key", 503, 5.0)
            if identity is not None:
                return Verdict(identity)
        return Verdict(None, "invalid API key", 401)

    def _by_key(self, authorization: str | None) -> tuple[Identity | None, str, str]:
        """(identity, "", token) for a known API key; (None, why, "") for a malformed header; (None, "", token)
        for a token the extra verifiers may know."""
        if not authorization:
            return None, "missing API key: send 'Authorization: Bearer <key>'", ""
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None, "malformed Authorization header: use 'Authorization: Bearer <key>'", ""
        self._maybe_reload()
        # A dict lookup by digest leaks timing about digests only, and a digest says nothing usable about a
        # 256-bit key: no constant-time comparison is needed here.
        found = self._by_digest.get(digest(token))
        if found is not None:
            return found, "", token
        if not self.extra:
            return None, "invalid API key", ""
        return None, "", token

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.recheck_seconds:
            return
        with self._lock:
            self._checked = now
            try:
                self._reload()
            except ConfigError as err:  # a file caught mid-edit: keep the keys we had
                log.error("%s Keeping the %d keys loaded before.", err, len(self._by_digest))

    def _reload(self) -> None:
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp:
            return
        keys = read_keys(self.path) if stamp else []
        self._by_digest = {k["sha256"]: Identity(k["id"], k.get("name", "")) for k in keys if not k.get("revoked")}
        self._stamp = stamp
