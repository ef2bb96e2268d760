"""Mixing by capability domain, and the incremental mix with a historical snapshot.

The plan downsamples every domain so the kept records meet the target ratios (the largest mix the data
allows; nothing is repeated). Which records a domain keeps is a seeded selection sample over its stream,
and batches interleave domains by smooth weighted round robin, so every batch carries the target shares
up to rounding. The manifest records targets, what was available, the plan and the achieved shares.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mlops.errors import ConfigError


@dataclass
class MixPlan:
    targets: dict[str, float]
    available: dict[str, int]
    take: dict[str, int]
    dropped_domains: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def normalised(ratios: Mapping[str, float]) -> dict[str, float]:
    total = sum(ratios.values())
    return {d: r / total for d, r in sorted(ratios.items())}


def largest_remainder(total: int, shares: Mapping[str, float], caps: Mapping[str, int]) -> dict[str, int]:
    exact = {d: total * s for d, s in shares.items()}
    take = {d: min(math.floor(v), caps[d]) for d, v in exact.items()}
    spare = total - sum(take.values())
    for d in sorted(exact, key=lambda d: (-(exact[d] - math.floor(exact[d])), d)):
        if spare <= 0:
            break
        if take[d] < caps[d]:
            take[d] += 1
            spare -= 1
    return take


def plan_mix(available: Mapping[str, int], ratios: Mapping[str, float]) -> MixPlan:
    available = dict(sorted(available.items()))
    if not ratios:
        total = sum(available.values()) or 1
        return MixPlan({d: n / total for d, n in available.items()}, available, dict(available), {})
    targets = normalised(ratios)
    missing = [d for d, t in targets.items() if t > 0 and available.get(d, 0) == 0]
    if missing:
        have = ", ".join(f"{d}={n}" for d, n in available.items()) or "(none)"
        raise ConfigError(
            f"domain(s) {missing} have a target ratio in data.mix.ratios but no records survived cleaning "
            f"(records per domain: {have}). Fix: add sources for them, set their ratio to 0, or check the "
            "domain names of the sources."
        )
    positive = {d: t for d, t in targets.items() if t > 0}
    total = math.floor(min(available[d] / t for d, t in positive.items()) + 1e-9)
    take = largest_remainder(total, positive, {d: available[d] for d in positive})
    take.update({d: 0 for d in targets if d not in take})
    dropped = {d: n for d, n in available.items() if d not in targets}
    return MixPlan(targets, available, dict(sorted(take.items())), dropped)


def domain_rng(seed: int, domain: str) -> np.random.Generator:
    salt = int.from_bytes(hashlib.sha256(domain.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, salt])


def select(stream: Iterator[Any], total: int, take: int, rng: np.random.Generator) -> Iterator[Any]:
    """Exactly `take` of `total` items, uniformly, in stream order, in one pass (Knuth's algorithm S)."""
    needed, left = take, total
    for item in stream:
        if needed <= 0:
            return
        if rng.random() * left < needed:
            needed -= 1
            yield item
        left -= 1


def interleave(streams: Mapping[str, Iterator[Any]], take: Mapping[str, int]) -> Iterator[tuple[str, Any]]:
    """Items of all domains so every prefix holds each domain's share up to one item."""
    weights = {d: n for d, n in sorted(take.items()) if n > 0}
    total = sum(weights.values())
    current = dict.fromkeys(weights, 0)
    remaining = dict(weights)
    for _ in range(total):
        for d, w in weights.items():
            current[d] += w
        domain = max((d for d in weights if remaining[d] > 0), key=lambda d: current[d])  # ties: first by name
        current[domain] -= total
        remaining[domain] -= 1
        yield domain, next(streams[domain])


def history_take(new_train: int, ratio: float, available: int) -> int:
    """History samples for `ratio` of the train split (7:3 -> 0.3), capped by what the snapshot holds."""
    return min(available, round(new_train * ratio / (1 - ratio)))


def achieved(counts: Mapping[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {d: (n / total if total else 0.0) for d, n in sorted(counts.items())}
