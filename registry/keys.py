"""The ledger's trust root: a key the database does not hold, and the newest head this machine has seen.

Every entry's hash is an HMAC-SHA256 under the registry's key, so a writer with database access alone cannot
recompute a hash after editing a row. The key is created once, by `mlops registry bootstrap`, in a file readable
by its owner only; every machine that acts on or serves from the registry needs a copy of that file (a mounted
secret on a cluster). The key directory is `MLOPS_LEDGER_KEY_DIR`, else `~/.config/mlops/ledger-keys`; a caller
who points it elsewhere gains nothing: without the registry's key no entry verifies and every act is refused.

A keyed chain still lets a writer cut entries off its end and point the head row at an earlier entry. The anchor
file beside the key remembers the newest (seq, hash) this machine verified, and a read refuses a ledger that ends
before it or disagrees with it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from mlops.errors import MLOpsError
from mlops.files import exclusive_lock

KEY_DIR_ENV = "MLOPS_LEDGER_KEY_DIR"


class LedgerKeyMissing(MLOpsError):
    """This machine holds no key for the registry, so nothing it reads can be trusted or written."""


def key_dir() -> Path:
    explicit = os.environ.get(KEY_DIR_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME", "").strip() or str(Path.home() / ".config")
    return Path(config) / "mlops" / "ledger-keys"


def key_path(registry_id: str) -> Path:
    return key_dir() / f"{registry_id}.key"


def create_key(registry_id: str) -> bytes:
    """A new random key for a new registry, written once (never overwritten)."""
    path = key_path(registry_id)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return bytes.fromhex(key)


_KEYS: dict[str, bytes] = {}


def load_key(registry_id: str, where: str) -> bytes:
    if registry_id in _KEYS:
        return _KEYS[registry_id]
    path = key_path(registry_id)
    try:
        key = bytes.fromhex(path.read_text(encoding="utf-8").strip())
    except FileNotFoundError:
        raise LedgerKeyMissing(
            f"this machine holds no key for the registry {registry_id} in {where} (looked for {path}). Without "
            "it no ledger entry can be verified, so nothing is trusted or changed. Fix: copy the key file from the "
            f"machine that ran `mlops registry bootstrap` to {path} (mode 600), or set {KEY_DIR_ENV} to the "
            "folder that holds it."
        ) from None
    except ValueError:
        raise LedgerKeyMissing(f"the key file {path} is not a hex key. Fix: restore it from the registry's "
                               "bootstrap machine.") from None
    _KEYS[registry_id] = key
    return key


def mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def same(a: str, b: str) -> bool:
    return hmac.compare_digest(a or "", b or "")


# --------------------------------------------------------------------------- the anchor


def anchor_path(registry_id: str) -> Path:
    return key_dir() / f"{registry_id}.head"


def read_anchor(registry_id: str) -> tuple[int, str] | None:
    try:
        data = json.loads(anchor_path(registry_id).read_text(encoding="utf-8"))
        return int(data["seq"]), str(data["hash"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None  # a torn anchor is rewritten by the next verified read


def advance_anchor(registry_id: str, seq: int, digest: str) -> None:
    """Remember a verified head; the anchor only moves forward (a concurrent reader may have moved it further)."""
    path = anchor_path(registry_id)
    if not path.parent.is_dir():
        return  # no key folder here: load_key already refused, or a reader without one
    with exclusive_lock(path.with_name(path.name + ".lock")):
        seen = read_anchor(registry_id)
        if seen is not None and seen[0] >= seq:
            return
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"seq": seq, "hash": digest}), encoding="utf-8")
        os.replace(tmp, path)
