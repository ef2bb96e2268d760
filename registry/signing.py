"""Layer 1 (entries and signatures): per-person Ed25519 keys, their fingerprints, and key files.

Every ledger entry is signed by the private key of the person who acted; a verifier needs only public keys (in the
ledger, added by signed admin acts) and one pinned fingerprint, the bootstrap admin's (`registry.trust`). A private
key never leaves its key file unencrypted: the file holds the 32-byte Ed25519 seed sealed with AES-256-GCM under a
key derived from the owner's passphrase by argon2id, so a copy of the file alone signs nothing.

Nothing here reads the database; `registry.ledger` and `registry.rules` call it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from mlops.errors import MLOpsError

KEY_DIR_ENV = "MLOPS_LEDGER_KEY_DIR"
KEY_FILE_ENV = "MLOPS_KEY_FILE"
FINGERPRINT_RE = re.compile(r"^ed25519:[0-9a-f]{64}$")
# argon2id cost of unlocking a key file: ~50 ms, paid once per process (the CLI) or per sign-in (the app).
KDF = {"time_cost": 3, "memory_cost": 65536, "parallelism": 2}
# The least cost a key file may have been sealed at: each file records its own (the `kdf` block), and one sealed
# cheaper (an older release, or a hand-made file) lets a stolen copy be guessed faster. Fewer lanes cost no less.
KDF_FLOOR = {"time_cost": KDF["time_cost"], "memory_cost": KDF["memory_cost"]}


class KeyFileError(MLOpsError):
    """A key file that is missing, unreadable, or does not open with the passphrase given."""

    exit_code = 3


def key_dir() -> Path:
    explicit = os.environ.get(KEY_DIR_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME", "").strip() or str(Path.home() / ".config")
    return Path(config) / "mlops" / "ledger-keys"


def user_key_path(registry_id: str, name: str) -> Path:
    """Where a person's key file for a registry is looked for: MLOPS_KEY_FILE, else the key folder."""
    explicit = os.environ.get(KEY_FILE_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    return key_dir() / registry_id / f"{name}.key"


def fingerprint(public_hex: str) -> str:
    """The name of a public key: what a consumer pins (`MLOPS_TRUST_ROOT`) and what an entry's signer is."""
    return "ed25519:" + hashlib.sha256(bytes.fromhex(public_hex)).hexdigest()


def statement(registry_id: str, entry_hash: str) -> bytes:
    """What an entry's signature covers: its content hash within one registry (never valid in another)."""
    return f"mlops-ledger/1 {registry_id} {entry_hash}".encode()


def verify(public_hex: str, data: bytes, signature_hex: str) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex)).verify(bytes.fromhex(signature_hex), data)
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False


@dataclass(frozen=True)
class Signer:
    """An unlocked private key: who it belongs to, and the power to sign as them (never printed or pickled)."""

    name: str
    public_key: str
    _seed: bytes

    def __repr__(self) -> str:
        return f"Signer({self.name}, {fingerprint(self.public_key)[:20]}...)"

    def __reduce__(self):
        raise TypeError("an unlocked signing key is never serialized")

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def sign(self, data: bytes) -> str:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return Ed25519PrivateKey.from_private_bytes(self._seed).sign(data).hex()


def new_signer(name: str) -> Signer:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    seed = secrets.token_bytes(32)
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return Signer(name, public.hex(), seed)


def _derive(passphrase: str, salt: bytes, kdf: dict) -> bytes:
    from argon2.low_level import Type, hash_secret_raw

    return hash_secret_raw(passphrase.encode(), salt, hash_len=32, type=Type.ID, **kdf)


def write_key_file(path: Path, signer: Signer, registry_id: str, passphrase: str) -> Path:
    """Seal `signer` under `passphrase` into `path` (mode 600, written whole, never over another file's key)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    salt, nonce = secrets.token_bytes(16), secrets.token_bytes(12)
    sealed = AESGCM(_derive(passphrase, salt, KDF)).encrypt(nonce, signer._seed, signer.public_key.encode())
    body = {"format": "mlops-key/1", "name": signer.name, "registry_id": registry_id,
            "public_key": signer.public_key, "fingerprint": signer.fingerprint,
            "kdf": {"name": "argon2id", "salt": salt.hex(), **KDF}, "nonce": nonce.hex(), "sealed": sealed.hex()}
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(body, fh, indent=1)
    os.replace(tmp, path)
    return path


def read_public(path: Path) -> dict:
    """A key file's public part (name, registry id, public key), without the passphrase."""
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
        return {k: body[k] for k in ("name", "registry_id", "public_key")}
    except FileNotFoundError:
        raise KeyFileError(f"no key file at {path}. Fix: ask an admin to add you (`mlops registry user add`), or "
                           f"point {KEY_FILE_ENV} at your key file.") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise KeyFileError(f"the key file {path} cannot be read ({type(err).__name__}). Fix: restore it, or ask an "
                           "admin to issue you a new key (`mlops registry user passwd <name>`).") from None


def unlock(path: Path, passphrase: str | None) -> Signer:
    """The signer sealed in `path`; KeyFileError when the passphrase does not open it."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    public = read_public(path)
    body = json.loads(Path(path).read_text(encoding="utf-8"))
    if not passphrase:
        raise KeyFileError(f"the key file {path} needs its passphrase. Fix: set MLOPS_PASSWORD.")
    try:
        kdf = {k: int(body["kdf"][k]) for k in KDF}  # the cost it was sealed at, as the file records it
        _refuse_cheap_kdf(path, public["name"], kdf)
        key = _derive(passphrase, bytes.fromhex(body["kdf"]["salt"]), kdf)
        seed = AESGCM(key).decrypt(bytes.fromhex(body["nonce"]), bytes.fromhex(body["sealed"]),
                                   public["public_key"].encode())
    except (InvalidTag, KeyError, ValueError, TypeError):
        raise KeyFileError(f"the passphrase does not open the key file {path}") from None
    return Signer(public["name"], public["public_key"], seed)


def _refuse_cheap_kdf(path: Path, name: str, kdf: dict) -> None:
    cheap = [f"{k}={kdf[k]} (floor {floor})" for k, floor in KDF_FLOOR.items() if kdf[k] < floor]
    if cheap:
        raise KeyFileError(f"the key file {path} is sealed at an argon2id cost below the floor: {', '.join(cheap)}; "
                           "a stolen copy of it is cheaper to guess. Fix: ask an admin to re-key it at the current cost "
                           f"with `mlops registry user passwd {name}`.")
