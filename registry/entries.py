"""Layer 1 (entries and signatures): what one ledger entry is, and the bytes its hash and signature cover.

An entry's hash is the sha256 of the canonical JSON of its fields, the previous entry's hash included, so the
entries form a chain; its signature is the acting person's Ed25519 signature over that hash
(`registry.signing.statement`). No key is needed to check a hash, and only the actor's key makes a signature.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

GENESIS = "0" * 64
GOVERNANCE = "(registry)"  # the ledger's governance stream: identities and the release policy, no model
FIELDS = ("seq", "ts", "actor", "action", "model", "version", "from_stage", "to_stage", "alias", "alias_before",
          "alias_after", "evidence", "reason", "prev_hash")


@dataclass(frozen=True)
class Entry:
    seq: int
    ts: str
    actor: str
    action: str
    model: str
    version: str | None = None
    from_stage: str | None = None
    to_stage: str | None = None
    alias: str | None = None
    alias_before: str | None = None
    alias_after: str | None = None
    evidence: dict = field(default_factory=dict)
    reason: str | None = None
    prev_hash: str = GENESIS
    hash: str = ""
    signature: str = ""

    def as_dict(self) -> dict:
        return asdict(self)

    def as_row(self) -> dict:
        """Its fields, shallow (the evidence dict is shared, not copied): what hashing and storing read."""
        return {name: getattr(self, name) for name in (*FIELDS, "hash", "signature")}


def canonical(values: dict[str, Any]) -> str:
    body = {k: values.get(k) for k in FIELDS}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def entry_hash(values: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of an entry's fields (its own hash and signature excluded)."""
    return hashlib.sha256(canonical(values).encode()).hexdigest()


def digest_of(data: Any) -> str:
    """sha256 of a JSON value in canonical form: how evidence and file manifests are named in entries."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
