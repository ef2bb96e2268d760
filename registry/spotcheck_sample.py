"""Layer 4 (acts' helpers): what a spot-check asks and how the answers are produced.

Prompts come from the business suite's items (stratified by dimension, so every area of the business is
looked at) and, once serving has logged them, from real served requests (already PII-scrubbed by the log).
Answers are produced in deployment form by the serving stage (`serving.spot_answers`, reached through the
core's `spot_check_answers` service: the registry runs no stage code), and stored with the check.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from mlops.errors import ConfigError


@dataclass(frozen=True)
class Prompt:
    source: str  # "suite:<file>#<item id>" or "request:<request id>"
    stratum: str  # the suite's dimension, or "served"
    messages: list[dict]
    reference: str | None = None  # the suite's expected answer, shown to the reviewer as a hint

    def as_dict(self) -> dict:
        return asdict(self)


def suite_folder(path: str) -> Path:
    from mlops.paths import project_home

    folder = Path(path).expanduser()
    folder = folder if folder.is_absolute() else project_home() / folder
    if not folder.is_dir():
        repo = Path(__file__).resolve().parent.parent / path  # the suite shipped with the code
        if repo.is_dir():
            return repo
        raise ConfigError(f"registry.spot_check.suite '{path}' is not a folder (looked at {folder}). Fix: point it "
                          "at a folder of business eval items (JSONL), e.g. evaluation/suites/business.")
    return folder


def suite_prompts(folder: Path) -> list[Prompt]:
    """Every item of the suite as a free question; a multiple-choice item's reference is its right choice."""
    out: list[Prompt] = []
    seen: set[str] = set()
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            prompt = str(item.get("prompt") or "").strip()
            if not prompt or prompt.lower() in seen:
                continue
            seen.add(prompt.lower())
            reference = item.get("target")
            if reference is None and isinstance(item.get("choices"), list) and isinstance(item.get("answer"), int):
                reference = item["choices"][item["answer"]]
            out.append(Prompt(f"suite:{path.name}#{item.get('id', len(out))}",
                              str(item.get("dimension") or path.stem), [{"role": "user", "content": prompt}],
                              None if reference is None else str(reference)))
    return out


def served_prompts(model: str, *, days: float = 30, url: str | None = None) -> list[Prompt]:
    """Answered user requests of `model` in the last `days` from the request log, one per distinct conversation."""
    import time

    from mlops.requestlog import read_requests

    out, seen = [], set()
    for row in read_requests(model=model, role="user", since=time.time() - days * 86400, url=url):
        messages = [{"role": m.get("role"), "content": m.get("content", "")} for m in row["messages"]
                    if m.get("role") in ("system", "user", "assistant")]
        if row.get("status") != 200 or not messages or messages[-1]["role"] != "user":
            continue
        key = json.dumps(messages, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        out.append(Prompt(f"request:{row['request_id']}", "served", messages))
    return out


def allocate(n: int, sizes: dict[str, int]) -> dict[str, int]:
    """n items over strata as evenly as their sizes allow (a small stratum gives its share to the others)."""
    take = dict.fromkeys(sizes, 0)
    left = min(n, sum(sizes.values()))
    while left > 0:
        open_ = [s for s in sorted(sizes) if take[s] < sizes[s]]
        share, extra = divmod(left, len(open_))
        for i, s in enumerate(open_):
            add = min(sizes[s] - take[s], share + (1 if i < extra else 0))
            take[s] += add
            left -= add
    return take


def draw(suite: list[Prompt], served: list[Prompt], n: int, served_share: float, seed: int) -> list[Prompt]:
    """A seeded sample: `served_share` of n from served requests (as many as exist), the rest stratified."""
    rng = random.Random(seed)
    from_served = min(len(served), round(n * served_share))
    by_stratum: dict[str, list[Prompt]] = {}
    for p in suite:
        by_stratum.setdefault(p.stratum, []).append(p)
    plan = allocate(n - from_served, {s: len(ps) for s, ps in by_stratum.items()})
    chosen = rng.sample(served, from_served)
    for stratum in sorted(plan):
        chosen += rng.sample(by_stratum[stratum], plan[stratum])
    if len(chosen) < n:  # a small suite: fill from the requests not yet taken
        rest = [p for p in served if p not in chosen]
        chosen += rng.sample(rest, min(len(rest), n - len(chosen)))
    rng.shuffle(chosen)
    return chosen


def sample_digest(prompts: list[Prompt]) -> str:
    blob = json.dumps([p.as_dict() for p in prompts], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()
