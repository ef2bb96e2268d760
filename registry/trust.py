"""Layer 1 (entries and signatures): what a verifier trusts before it reads a single entry.

- The root: the fingerprint of the bootstrap admin's public key. It is configuration, not a secret: the
  `MLOPS_TRUST_ROOT` variable, else the pin file `mlops registry bootstrap` (or `mlops registry trust pin`) wrote
  into this machine's key folder. A ledger whose first entry is not signed by that key verifies nowhere, so a
  database writer cannot start a registry of their own under the same store.
- A head the verifier must not go behind: `MLOPS_TRUST_HEAD=<seq>:<hash>` (deployment configuration, for a
  replica started fresh), and the anchor file, the newest head this machine verified. A ledger cut off at its
  end, or rewritten before that point, is refused.
- The newest signed timestamp this machine verified (`<registry id>.timestamp`, `registry.freshness`): a replica
  never accepts an older one.
Pin, anchor and seen timestamp are written whole, mode 600, in a folder of mode 700. The key folder may be a
read-only secret mount: pins are only read from it, and an anchor or timestamp that cannot be written is kept in
this process's memory instead.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets

from mlops.errors import MLOpsError
from mlops.files import exclusive_lock
from registry.signing import FINGERPRINT_RE, key_dir

log = logging.getLogger(__name__)
ROOT_ENV = "MLOPS_TRUST_ROOT"
HEAD_ENV = "MLOPS_TRUST_HEAD"
REGISTRY_ID_RE = re.compile(r"^[0-9a-f]{32}$")


class TrustError(MLOpsError):
    """This machine pins nothing (or something malformed) that the ledger could be verified against."""


def check_registry_id(registry_id: str, where: str) -> str:
    """A registry id comes from the database: only a 32-hex id may name files on this machine."""
    if not isinstance(registry_id, str) or not REGISTRY_ID_RE.match(registry_id):
        shown = repr(registry_id)[:80]
        raise TrustError(f"the store {where} names its registry {shown}, which is not a registry id (32 hex "
                         "characters): the mlops_registry table was altered. Nothing is trusted from it. Fix: "
                         "restore the ledger database from a backup.")
    return registry_id


def root_pin_path(registry_id: str):
    return key_dir() / f"{registry_id}.root"


def pinned_root(registry_id: str, where: str) -> str:
    """The fingerprint every verifier on this machine holds the bootstrap entry to."""
    explicit = os.environ.get(ROOT_ENV, "").strip()
    if explicit:
        if not FINGERPRINT_RE.match(explicit):
            raise TrustError(f"{ROOT_ENV}='{explicit[:80]}' is not a key fingerprint (ed25519:<64 hex>). Fix: set it "
                             "to the fingerprint `mlops registry bootstrap` printed (`mlops registry trust show` on a "
                             "machine that trusts the registry).")
        return explicit
    path = root_pin_path(registry_id)
    try:
        pinned = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise TrustError(f"this machine pins no trust root for the registry {registry_id} in {where}, so no entry "
                         f"can be verified and nothing is trusted or changed. Fix: set {ROOT_ENV} to the root "
                         "fingerprint that `mlops registry bootstrap` printed, or run `mlops registry trust pin "
                         "<fingerprint>`.") from None
    if not FINGERPRINT_RE.match(pinned):
        raise TrustError(f"the trust pin {path} does not hold a fingerprint. Fix: `mlops registry trust pin "
                         f"<fingerprint>`, or set {ROOT_ENV}.")
    return pinned


def pin_root(registry_id: str, fingerprint: str) -> None:
    if not FINGERPRINT_RE.match(fingerprint or ""):
        raise TrustError(f"'{(fingerprint or '')[:80]}' is not a key fingerprint (ed25519:<64 hex>). Fix: pass the "
                         "one `mlops registry bootstrap` printed.")
    path = root_pin_path(check_registry_id(registry_id, "this store"))
    private_dir(path.parent)
    write_private(path, fingerprint + "\n")


def private_dir(folder) -> None:
    """The key folder, created (or tightened, where this user owns it) to mode 700: pins, anchors and seen
    timestamps are for this user's verifiers alone. A folder that cannot be tightened (a read-only mount) is
    left as it is."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        if folder.stat().st_mode & 0o077:
            folder.chmod(0o700)
    except OSError as err:
        log.debug("key folder %s left at its mode (%s)", folder, err)


def write_private(path, text: str) -> None:
    """`text` into `path`, whole (a temp file renamed over it) and mode 600 from its creation."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def pinned_head() -> tuple[int, str] | None:
    text = os.environ.get(HEAD_ENV, "").strip()
    if not text:
        return None
    seq, _, digest = text.partition(":")
    if not seq.isdigit() or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise TrustError(f"{HEAD_ENV}='{text[:100]}' is not <seq>:<64-hex hash>. Fix: set it to what `mlops "
                         "registry trust show` prints on a machine that verified the ledger.")
    return int(seq), digest


# --------------------------------------------------------------------------- the anchor

# What this process verified, for a read-only key folder: anchors (key: the registry id) and seen timestamps
# (key: '<registry id>.timestamp'). One dict, so whoever forgets one forgets both.
_MEMORY: dict[str, tuple] = {}


def anchor_path(registry_id: str):
    return key_dir() / f"{registry_id}.head"


def read_anchor(registry_id: str) -> tuple[int, str] | None:
    seen = _MEMORY.get(registry_id)
    try:
        data = json.loads(anchor_path(registry_id).read_text(encoding="utf-8"))
        stored = int(data["seq"]), str(data["hash"])
    except (FileNotFoundError, ValueError, KeyError, TypeError, OSError):
        stored = None  # none yet, or torn: rewritten by the next verified read
    candidates = [a for a in (seen, stored) if a is not None]
    return max(candidates) if candidates else None


def advance_anchor(registry_id: str, seq: int, digest: str) -> None:
    """Remember a verified head; the anchor only moves forward (a concurrent reader may have moved it further)."""
    current = _MEMORY.get(registry_id)
    if current is None or current[0] < seq:
        _MEMORY[registry_id] = (seq, digest)
    path = anchor_path(registry_id)
    if not path.parent.is_dir():
        return
    try:
        with exclusive_lock(path.with_name(path.name + ".lock")):
            seen = read_anchor(registry_id)
            on_disk = _read_disk(path)
            if on_disk is not None and on_disk[0] >= seq:
                return
            if seen is not None and seen[0] > seq:
                seq, digest = seen
            private_dir(path.parent)
            write_private(path, json.dumps({"seq": seq, "hash": digest}))
    except OSError as err:  # a read-only secret mount: the anchor lives in this process's memory
        log.debug("anchor %s not written (%s); kept in memory", path, err)


def _read_disk(path) -> tuple[int, str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return int(data["seq"]), str(data["hash"])
    except (FileNotFoundError, ValueError, KeyError, TypeError, OSError):
        return None


# --------------------------------------------------------------------------- the newest timestamp seen

def timestamp_path(registry_id: str):
    return key_dir() / f"{registry_id}.timestamp"


def seen_timestamp(registry_id: str) -> tuple[str, int, str] | None:
    """(issued, head seq, head hash) of the newest timestamp statement this machine verified (`registry.freshness`)."""
    candidates = [t for t in (_MEMORY.get(f"{registry_id}.timestamp"), _read_seen(timestamp_path(registry_id)))
                  if t is not None]
    return max(candidates) if candidates else None


def remember_timestamp(registry_id: str, issued: str, seq: int, digest: str) -> None:
    """Remember a verified timestamp; like the anchor it only moves forward, in the file or else in memory."""
    seen = (issued, seq, digest)
    key = f"{registry_id}.timestamp"
    if _MEMORY.get(key) is None or _MEMORY[key] < seen:
        _MEMORY[key] = seen
    path = timestamp_path(registry_id)
    if not path.parent.is_dir():
        return
    try:
        with exclusive_lock(path.with_name(path.name + ".lock")):
            on_disk = _read_seen(path)
            if on_disk is not None and on_disk >= seen:
                return
            private_dir(path.parent)
            write_private(path, json.dumps({"issued": issued, "head_seq": seq, "head_hash": digest}))
    except OSError as err:  # a read-only secret mount: kept in this process's memory
        log.debug("seen timestamp %s not written (%s); kept in memory", path, err)


def _read_seen(path) -> tuple[str, int, str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return str(data["issued"]), int(data["head_seq"]), str(data["head_hash"])
    except (FileNotFoundError, ValueError, KeyError, TypeError, OSError):
        return None
