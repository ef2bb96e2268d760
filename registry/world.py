"""Layer 2 (the pure replay): the ledger's state after some entries, as the rules judge the next one.

Identities (name, role, public key), the release policy in force and every model's release state; `attested`
says whether the evidence rules hold yet (`registry.derive`). No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from registry.state import ModelState


@dataclass(frozen=True)
class User:
    name: str
    role: str
    public_key: str


@dataclass
class World:
    """The ledger's state after some entries: identities, the policy in force, every model's release state."""

    users: dict[str, User] = field(default_factory=dict)
    policy: dict | None = None
    models: dict[str, ModelState] = field(default_factory=dict)
    count: int = 0
    # Set by the first recorded policy that names attestors, and never unset: a later policy without them cannot
    # switch the evidence rules off (an admin's downgrade is refused as any other broken rule would be).
    evidence_rules: bool = False

    def model(self, name: str) -> ModelState:
        if name not in self.models:
            self.models[name] = ModelState(name)
        return self.models[name]


def attested(world: World) -> bool:
    """Whether the evidence rules hold: from the first recorded policy that names attestors on (every registry
    bootstrapped since; an older one once its admin records a policy again)."""
    return world.evidence_rules
