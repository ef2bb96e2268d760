"""Mixing by capability domain, and the incremental mix with a historical snapshot.

The plan downsamples every domain so the kept records meet the target ratios (the largest mix the data
allows; nothing is repeated). Which records a domain keeps is a seeded uniform choice, and the mixed stream
orders domain d's k-th record by (2k + 1) / (2 take_d) (Webster's sequential apportionment: every prefix holds
each domain's share to within rounding). Both follow from counts alone, so the build's workers compute their own
part of the stream (`split_take` per partition, `chosen_positions` inside one, `mixed_prefix` / `mixed_order` per
batch) and no process reads every record. The manifest records targets, what was available, the plan and the
achieved shares.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
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


def domain_rng(seed: int, domain: str, *more: int) -> np.random.Generator:
    """The seeded generator of one domain (and, with `more`, of one partition of it)."""
    salt = int.from_bytes(hashlib.sha256(domain.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, salt, *more])


def split_take(counts: list[int], take: int, rng: np.random.Generator) -> list[int]:
    """How many of `take` items chosen uniformly from parts of these sizes fall in each part (a multivariate
    hypergeometric draw); each part then chooses its share uniformly (`chosen_positions`), so the whole choice is
    uniform over the take-subsets."""
    total = sum(counts)
    if take >= total:
        return list(counts)
    if take <= 0:
        return [0] * len(counts)
    drawn = rng.multivariate_hypergeometric(np.asarray(counts, dtype=np.int64), take, method="marginals")
    return [int(n) for n in drawn]


def chosen_positions(count: int, take: int, rng: np.random.Generator) -> np.ndarray:
    """`take` of positions 0..count-1, uniformly, ascending."""
    if take >= count:
        return np.arange(count, dtype=np.int64)
    return np.sort(rng.choice(count, size=take, replace=False)).astype(np.int64)


def _rank(domain: str, k: int, take: Mapping[str, int]) -> int:
    """Position of domain's k-th item in the mixed order: the items whose key (2j + 1) / (2 take_e) is smaller,
    plus equal keys of domains named before it (exact integer arithmetic)."""
    t_d, rank = take[domain], 0
    for other, t_e in take.items():
        q = (2 * k + 1) * t_e
        rank += min(t_e, ((q - 1) // t_d + 1) // 2)  # odd o with o * t_d < q
        if other < domain and q % t_d == 0 and (q // t_d) % 2 == 1 and (q // t_d) // 2 < t_e:
            rank += 1
    return rank


def mixed_prefix(position: int, take: Mapping[str, int]) -> dict[str, int]:
    """Items of each domain among the first `position` items of the mixed order."""
    take = {d: n for d, n in sorted(take.items()) if n > 0}
    out = {}
    for domain, n in take.items():
        lo, hi = 0, n  # the first k whose rank is >= position
        while lo < hi:
            mid = (lo + hi) // 2
            if _rank(domain, mid, take) < position:
                lo = mid + 1
            else:
                hi = mid
        out[domain] = lo
    if sum(out.values()) != min(position, sum(take.values())):
        raise AssertionError(f"mixed_prefix({position}, {take}) counted {out}")  # the order is total: never
    return out


def mixed_order(start: int, end: int, take: Mapping[str, int]) -> list[tuple[str, int]]:
    """(domain, k) of the mixed order's positions start..end-1, in order: domain's k-th chosen record."""
    from fractions import Fraction

    first, last = mixed_prefix(start, take), mixed_prefix(end, take)
    items = [(d, k) for d in first for k in range(first[d], last[d])]
    return sorted(items, key=lambda item: (Fraction(2 * item[1] + 1, 2 * take[item[0]]), item[0]))


def history_take(new_train: int, ratio: float, available: int) -> int:
    """History samples for `ratio` of the train split (7:3 -> 0.3), capped by what the snapshot holds."""
    return min(available, round(new_train * ratio / (1 - ratio)))


def achieved(counts: Mapping[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {d: (n / total if total else 0.0) for d, n in sorted(counts.items())}
