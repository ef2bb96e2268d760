"""lm-eval results turned into what runs record and gates compare: one score with stderr per task and area."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from evaluation.suites import Suite


@dataclass(frozen=True)
class Score:
    """A primary metric with its standard error over `n` items."""

    name: str
    suite: str
    area: str
    metric: str
    value: float
    stderr: float
    n: int
    kind: str = "task"  # "task", "area" (n-weighted over a suite area's tasks) or "suite" (over all of them)

    @classmethod
    def from_dict(cls, data: dict) -> Score:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def task_scores(results: dict, suites: list[Suite]) -> list[Score]:
    """Primary-metric scores per task from lm-eval's `results` and `n-samples`."""
    scores = []
    for suite in suites:
        for task in suite.tasks:
            row = results["results"].get(task.name)
            if row is None:
                raise KeyError(f"lm-eval returned no results for task {task.name}")
            value = _number(row.get(f"{task.primary},none"))
            if value is None:
                raise KeyError(f"task {task.name} has no '{task.primary}' metric in the results")
            stderr = _number(row.get(f"{task.primary}_stderr,none")) or 0.0
            n = int(results.get("n-samples", {}).get(task.name, {}).get("effective", row.get("sample_len", 0)))
            scores.append(Score(task.name, suite.name, task.area, task.primary, value, stderr, n))
    return scores


def weighted(members: list[Score], name: str, suite: str, area: str, kind: str) -> Score:
    """The n-weighted mean of independent scores, with the stderr of that weighted mean."""
    total = sum(s.n for s in members) or 1
    value = sum(s.value * s.n for s in members) / total
    stderr = math.sqrt(sum((s.n / total) ** 2 * s.stderr**2 for s in members))
    return Score(name, suite, area, "+".join(sorted({s.metric for s in members})), value, stderr, total, kind)


def area_scores(tasks: list[Score]) -> list[Score]:
    """n-weighted mean per (suite, area)."""
    groups: dict[tuple[str, str], list[Score]] = {}
    for score in tasks:
        groups.setdefault((score.suite, score.area), []).append(score)
    return [weighted(members, area, suite, area, "area") for (suite, area), members in sorted(groups.items())]


def suite_score(tasks: list[Score], suite: str) -> Score | None:
    """The n-weighted mean of one suite's tasks (None when the eval holds none of them)."""
    members = [t for t in tasks if t.suite == suite and t.n]
    return weighted(members, suite, suite, suite, "suite") if members else None


def summary(tasks: list[Score], suites: list[Suite], extra: dict | None = None) -> dict:
    """The JSON document a gate reads back (`eval/summary.json` on the eval run)."""
    return {
        "schema": 1,
        "suites": {s.name: {"version": s.version, "fingerprint": s.fingerprint} for s in suites},
        "tasks": [asdict(s) for s in tasks],
        "areas": [asdict(s) for s in area_scores(tasks)],
        **(extra or {}),
    }


def metrics_for_tracking(results: dict, suites: list[Suite], tasks: list[Score]) -> dict[str, float]:
    """Every numeric metric per task (`task/metric`, `task/metric_stderr`) plus area and suite scores."""
    out: dict[str, float] = {}
    for suite in suites:
        for task in suite.tasks:
            for key, value in results["results"].get(task.name, {}).items():
                metric, _, filt = key.partition(",")
                number = _number(value)
                if filt and number is not None:
                    out[f"{task.name}/{metric}"] = number
    for area in area_scores(tasks):
        out[f"{area.suite}/{area.area}"] = area.value
        out[f"{area.suite}/{area.area}_stderr"] = area.stderr
    for suite in suites:
        members = [t for t in tasks if t.suite == suite.name]
        out[f"{suite.name}/score"] = sum(t.value for t in members) / max(1, len(members))
    return out


def write_samples(results: dict, folder: Path) -> list[Path]:
    """Per-sample outputs, one JSONL per task: item id, prompt arguments, responses, metric values."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for task, samples in sorted(results.get("samples", {}).items()):
        path = folder / f"{task}.jsonl"
        with path.open("w", encoding="utf-8") as fh:
            for sample in samples:
                metrics = {m: sample.get(m) for m in sample.get("metrics", [])}
                record = {
                    "doc_id": sample.get("doc_id"),
                    "item_id": (sample.get("doc") or {}).get("id"),
                    "target": sample.get("target"),
                    "arguments": sample.get("arguments"),
                    "response": sample.get("filtered_resps"),
                    "metrics": metrics,
                }
                fh.write(json.dumps(record, default=str, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths
