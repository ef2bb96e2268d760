"""API keys for `mlops serve`: `Authorization: Bearer <key>` checked against a file of hashed keys.

Keys are 256 random bits (`mlk_<id>_<secret>`), shown once when made and stored only as a SHA-256 digest.
A slow password hash (argon2, bcrypt) protects low-entropy secrets a person picks; a key with 256 bits of
entropy cannot be guessed from its digest, and SHA-256 costs microseconds per request where argon2 would
cost tens of milliseconds on every call. The file is re-read when it changes, so `mlops serve keys add` and
`revoke` take effect without a restart. Other verifiers (the registry's identities file) can be chained in
through `KeyStore(..., extra=[...])`: each takes the bearer token and returns an identity or None.
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
    keys = read_keys(path)
    key_id = secrets.token_hex(4)
    key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    entry = {"id": key_id, "name": name.strip(), "sha256": digest(key), "created": int(time.time()), "revoked": False}
    _write_keys(path, [*keys, entry])
    return key, entry


def revoke_key(path: Path, key_id: str) -> dict:
    keys = read_keys(path)
    for entry in keys:
        if entry["id"] == key_id:
            entry["revoked"] = True
            _write_keys(path, keys)
            return entry
    from mlops.errors import did_you_mean

    raise NotFoundError(f"no API key with id '{key_id}' in {path}; {did_you_mean(key_id, [k['id'] for k in keys])}.")


class IdentityVerifier:
    """`Bearer <user>:<password>` checked against the registry's identities (its verified ledger; argon2).

    argon2 costs tens of milliseconds by design, so a verdict is remembered for `ttl` seconds under the token's
    SHA-256 (failures too: a client retrying a wrong password cannot make the server hash on every request).
    A changed identity takes effect when the remembered verdicts expire."""

    def __init__(self, *, ttl: float = 60.0) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, Identity | None]] = {}

    def __call__(self, token: str) -> Identity | None:
        name, sep, password = token.partition(":")
        if not sep or not name or not password:
            return None
        key, now = digest(token), time.monotonic()
        with self._lock:
            remembered = self._seen.get(key)
        if remembered is not None and now - remembered[0] < self.ttl:
            return remembered[1]
        from mlops.identities import AuthError, authenticate

        try:
            identity: Identity | None = Identity(f"user:{name}", authenticate(name, password).name)
        except AuthError:
            identity = None
        with self._lock:
            if len(self._seen) > 10_000:  # bounded: forget everything rather than grow without end
                self._seen.clear()
            self._seen[key] = (now, identity)
        return identity


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

    def verify(self, authorization: str | None) -> tuple[Identity | None, str]:
        """(identity, "") for a valid key; (None, why) otherwise."""
        if not authorization:
            return None, "missing API key: send 'Authorization: Bearer <key>'"
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None, "malformed Authorization header: use 'Authorization: Bearer <key>'"
        self._maybe_reload()
        # A dict lookup by digest leaks timing about digests only, and a digest says nothing usable about a
        # 256-bit key: no constant-time comparison is needed here.
        found = self._by_digest.get(digest(token))
        if found is not None:
            return found, ""
        for verifier in self.extra:
            identity = verifier(token)
            if identity is not None:
                return identity, ""
        return None, "invalid API key"

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
