"""Layer 1 (evidence statements): in-toto attestations in DSSE envelopes, signed by whoever ran a step.

A step that produces evidence (a training run, a data build, an eval, a gate, a shadow report, a GGUF package)
states what it produced and from what, as an in-toto Statement v1 (`in_toto_attestation`):
- subjects: the digests of what it made or judged (a model's files, a snapshot's manifest, a GGUF);
- predicate: its results and the sha256 of its report, with `materials` (the inputs' digests) inside it, as
  SLSA provenance keeps its resolved dependencies;
- predicateType: `urn:mlops:attestation:<kind>:v1`.
The statement is the payload of a DSSE envelope (`securesystemslib.dsse`), signed with the registry key of the
person or service identity that ran the step: the same Ed25519 key the ledger holds for them, named by its
fingerprint as the signature's keyid. No key is needed to check one, and only the runner's key makes one.

Who may produce which evidence is the release policy's `attestors` (names, or `role:<role>`), recorded in the
ledger and changed only by an admin's signed policy act (`registry.config.AttestorsPolicy`). A verifier opens an
envelope against the public keys the verified ledger holds (`open_envelope`): a statement signed by anyone else,
or by someone the policy does not name for that kind, is no evidence. Pure: no I/O here.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
KINDS = ("train", "data", "eval", "eval_reference", "gate", "shadow", "package")


def predicate_type(kind: str) -> str:
    return f"urn:mlops:attestation:{kind}:v1"


class AttestationProblem(ValueError):
    """An envelope that is no evidence: malformed, unsigned, signed by a stranger, or by someone not allowed."""


@dataclass(frozen=True)
class Attestation:
    """An opened, verified envelope: who signed which kind of statement about which subjects."""

    id: str
    kind: str
    signer: str
    subjects: dict[str, str]
    predicate: dict = field(default_factory=dict)

    @property
    def materials(self) -> dict[str, str]:
        return dict(self.predicate.get("materials") or {})


def canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def envelope_id(envelope: dict) -> str:
    """The name of an envelope: the sha256 of its canonical JSON (what ledger entries and the store use)."""
    return hashlib.sha256(canonical_json(envelope)).hexdigest()


def subject_key(subjects: dict[str, str]) -> str:
    """One digest for a set of subjects, as the registry names a model's files (`registry.entries.digest_of`)."""
    from registry.entries import digest_of

    return digest_of(subjects)


def statement(kind: str, subjects: dict[str, str], predicate: dict, materials: dict[str, str] | None = None) -> dict:
    """An in-toto Statement v1 (validated by the in-toto bindings) as a JSON dict."""
    from google.protobuf import json_format
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement

    if kind not in KINDS:
        raise AttestationProblem(f"'{kind}' is no kind of evidence (kinds: {', '.join(KINDS)})")
    body = {**predicate, "materials": dict(materials or {})}
    # Round-trip through JSON first: the predicate is a protobuf Struct, which holds JSON values only.
    body = json.loads(canonical_json(body))
    rds = [ResourceDescriptor(name=name, digest={"sha256": sha}).pb for name, sha in sorted(subjects.items())]
    stmt = Statement(rds, predicate_type(kind), body)
    stmt.validate()
    return json_format.MessageToDict(stmt.pb)


def sign(signer, stmt: dict) -> dict:
    """A DSSE envelope of `stmt` signed by `signer` (a `registry.signing.Signer`), as a JSON dict."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import Signature

    envelope = Envelope(canonical_json(stmt), PAYLOAD_TYPE, {})
    envelope.signatures[signer.fingerprint] = Signature(signer.fingerprint, signer.sign(envelope.pae()))
    return envelope.to_dict()


def attest(signer, kind: str, subjects: dict[str, str], predicate: dict,
           materials: dict[str, str] | None = None) -> dict:
    return sign(signer, statement(kind, subjects, predicate, materials))


def _public_key(public_hex: str):
    from securesystemslib.signer import SSlibKey

    from registry.signing import fingerprint

    return SSlibKey(fingerprint(public_hex), "ed25519", "ed25519", {"public": public_hex})


def open_envelope(envelope: dict, users: dict, attestors: dict[str, list[str]] | None, kind: str) -> Attestation:
    """The verified statement of `envelope`, or AttestationProblem saying why it is no evidence of `kind`.

    `users`: name -> User (public key, role) as the verified ledger holds them at the moment of judging;
    `attestors`: kind -> the names and `role:<role>` entries the recorded policy allows to attest it."""
    from securesystemslib.dsse import Envelope

    if not isinstance(envelope, dict):
        raise AttestationProblem("it is not a DSSE envelope")
    try:
        env = Envelope.from_dict(json.loads(json.dumps(envelope)))  # from_dict edits its input: a copy
    except (KeyError, ValueError, TypeError) as err:
        raise AttestationProblem(f"it is not a DSSE envelope ({type(err).__name__})") from None
    if env.payload_type != PAYLOAD_TYPE or len(env.signatures) != 1:
        raise AttestationProblem("it is not one in-toto statement with one signature")
    keyid = next(iter(env.signatures))
    signer = next((u for u in users.values() if _fingerprint(u.public_key) == keyid), None)
    if signer is None:
        raise AttestationProblem("it is signed by a key no identity of the registry holds")
    try:
        env.verify([_public_key(signer.public_key)], 1)
    except Exception:  # noqa: BLE001 - securesystemslib's VerificationError and malformed signatures alike
        raise AttestationProblem(f"its signature is not {signer.name}'s (forged, or the statement was edited)") \
            from None
    stmt = _statement_of(env.payload)
    if stmt.get("predicateType") != predicate_type(kind):
        raise AttestationProblem(f"it states {stmt.get('predicateType')}, not {predicate_type(kind)}")
    if not may_attest(signer, kind, attestors):
        allowed = ", ".join((attestors or {}).get(kind) or []) or "nobody"
        raise AttestationProblem(f"{signer.name} (role {signer.role}) may not attest {kind} evidence (the recorded "
                                 f"policy allows: {allowed})")
    subjects = {s.get("name", ""): (s.get("digest") or {}).get("sha256", "") for s in stmt.get("subject") or []}
    return Attestation(envelope_id(envelope), kind, signer.name, subjects, dict(stmt.get("predicate") or {}))


def may_attest(user, kind: str, attestors: dict[str, list[str]] | None) -> bool:
    allowed = set((attestors or {}).get(kind) or ())
    return user.name in allowed or f"role:{user.role}" in allowed


def _fingerprint(public_hex: str) -> str:
    from registry.signing import fingerprint

    try:
        return fingerprint(public_hex)
    except ValueError:
        return ""


def _statement_of(payload: bytes) -> dict:
    from google.protobuf import json_format
    from in_toto_attestation.v1.statement import Statement
    from in_toto_attestation.v1.statement_pb2 import Statement as StatementPb

    try:
        data = json.loads(payload)
        pb = json_format.ParseDict(data, StatementPb())
        Statement.copy_from_pb(pb).validate()
    except (ValueError, TypeError, json_format.ParseError) as err:
        raise AttestationProblem(f"its payload is not a valid in-toto Statement v1 ({err})") from None
    if data.get("_type") != STATEMENT_TYPE:
        raise AttestationProblem("its payload is not an in-toto Statement v1")
    return data


def payload_of(envelope: dict) -> dict:
    """The statement inside an envelope, unverified (for display only: never for a decision)."""
    try:
        return json.loads(base64.b64decode(envelope["payload"]))
    except (KeyError, ValueError, TypeError):
        return {}
