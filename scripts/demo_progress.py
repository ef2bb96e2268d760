"""The demo's live view: a `[k/N] title` header per step with the elapsed time and an estimate of what is left,
and a closing table of step times (printed, and saved beside the demo's other files).

The estimate scales reference figures by this machine's pace so far: after the first steps took twice their
reference, the rest is expected to as well. A rerun, which reuses everything, finds its pace small and says so.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

# Seconds per step of a first run on a quiet 2-core machine, both measured 2026-12-07: tiny 10.6 min in all;
# smollm2 39.8 min (`make demo` from a fresh clone, benchmarks/RESULTS.md).
REFERENCE_S = {
    "tiny": {1: 24, 2: 24, 3: 180, 4: 30, 5: 5, 6: 24, 7: 156, 8: 24, 9: 132, 10: 12, 11: 18, 12: 8},
    "smollm2": {1: 55, 2: 230, 3: 888, 4: 62, 5: 12, 6: 37, 7: 620, 8: 44, 9: 224, 10: 17, 11: 24, 12: 9},
}


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


class Progress:
    def __init__(self, profile: str, steps: list[int], *, out_dir: Path, clock=time.monotonic) -> None:
        self.reference = REFERENCE_S[profile]
        self.steps = steps  # the step numbers this run goes through, in order (the quick look runs fewer)
        self.out_dir, self.clock = out_dir, clock
        self.started = clock()
        self.current: tuple[int, str, float] | None = None
        self.done: list[dict] = []

    def _close_current(self, note: str = "") -> None:
        if self.current is not None:
            k, title, since = self.current
            self.done.append({"step": k, "title": title, "seconds": round(self.clock() - since, 1), "note": note})
            self.current = None

    def left_s(self, k: int) -> float:
        """Reference seconds of this step and the ones after it, at the pace the finished steps ran."""
        spent = sum(d["seconds"] for d in self.done)
        reference_done = sum(self.reference[d["step"]] for d in self.done)
        pace = spent / reference_done if reference_done > 0 else 1.0
        return pace * sum(self.reference[j] for j in self.steps if j >= k)

    def start(self, k: int, title: str) -> None:
        self._close_current()
        self.current = (k, title, self.clock())
        elapsed = self.clock() - self.started
        position = self.steps.index(k) + 1
        print(f"\n=== [{position}/{len(self.steps)}] {title}  (elapsed {minutes(elapsed)}; about "
              f"{minutes(self.left_s(k))} left at this machine's pace)", flush=True)

    def skip(self, k: int, title: str, why: str) -> None:
        """A step a rerun finds done: its header says so, and it counts as done in no time."""
        self.start(k, f"{title} ({why})")
        self._close_current(note=why)

    def finish(self) -> str:
        """The closing table, printed by the caller and saved as timings.json and timings.md."""
        self._close_current()
        total = self.clock() - self.started
        rows = [f"| {d['step']} | {d['title'][:70]} | {d['seconds']:.0f} s | {self.reference[d['step']]} s |"
                for d in self.done]
        table = "\n".join(["| step | what | took | reference |", "|---|---|---|---|", *rows,
                           f"| | all | {minutes(total)} | {minutes(sum(self.reference[k] for k in self.steps))} |"])
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "timings.json").write_text(json.dumps({"steps": self.done, "total_s": round(total, 1),
                                                               "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                            time.gmtime())}, indent=2))
        (self.out_dir / "timings.md").write_text(table + "\n")
        return table
