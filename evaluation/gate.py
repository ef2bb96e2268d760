"""Champion/challenger gate: a pure comparison of eval summaries (scores with stderr) into a report.

Rules (settings in `eval.gate`), on the interval delta +/- z * sqrt(se_challenger^2 + se_reference^2):
- general tasks must be non-inferior within `general_margin`;
- business dimensions must not regress beyond `business_margin`, and those in `must_improve` must improve
  (the whole interval above 0);
- with no champion, absolute `floors` (by task, dimension or suite; `default_floor` otherwise) apply;
  floors and `must_beat` scores are measured values themselves, so a score's interval there is never narrower
  than a [0, 1] metric's at the reference value (0 of 12 items is not evidence of being below 1 of 12);
- `must_beat` scores (e.g. the untuned base model's) apply always: the lower bound of the challenger's own
  interval must lie above the score. A suite name there means the suite's n-weighted aggregate, so a first
  release is held to beating the base model on the business suite as a whole, where a dimension's 36 items
  could not resolve the difference;
- every past champion in `history` is held to the same non-inferiority / no-regression rules, so a capability
  lost over several small releases is still caught.
`noise_tolerant` mode fails a comparison only when the interval lies wholly below the allowed drop; `strict`
passes it only when the interval lies wholly above it.

A quantized release form (a profile naming a GGUF type) is also held to the same version's reference form (hf,
weights as trained), evaluated on the same items: no task may lose more than `quantization_max_drop`, and no
dimension suite's aggregate more than `quantization_max_suite_drop`, judged on the interval like every other
rule (`mode`): 12 items per task cannot tell a one-answer flip from a regression, the suite's aggregate can
(`quantization_checks`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

from evaluation.results import Score, suite_score

DIMENSION_SUITES = ("business",)


@dataclass(frozen=True)
class Check:
    name: str
    against: str
    rule: str  # non_inferior | no_regression | must_improve | floor | must_beat | coverage | contamination
    challenger: float | None
    reference: float | None
    delta: float | None
    lo: float | None
    hi: float | None
    passed: bool
    reason: str


@dataclass
class GateReport:
    challenger: str
    champion: str | None
    passed: bool
    checks: list[Check]
    history: list[str] = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # The challenger's scores as people read them (each dimension suite as one n-weighted score, every other
    # task alone), stored so readers of the report (the registry's release report) need no scoring code.
    scores: dict = field(default_factory=dict)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    @property
    def reasons(self) -> list[str]:
        return [c.reason for c in self.checks if not c.passed]

    def as_dict(self) -> dict:
        return {**asdict(self), "result": "passed" if self.passed else "failed", "reasons": self.reasons}


def scores_of(summary: dict) -> dict[str, Score]:
    """The gated units of one eval summary: general tasks, and business dimensions (area aggregates)."""
    out = {}
    for row in summary.get("tasks", []):
        if row["suite"] not in DIMENSION_SUITES:
            out[row["name"]] = Score.from_dict(row)
    for row in summary.get("areas", []):
        if row["suite"] in DIMENSION_SUITES:
            out[row["name"]] = Score.from_dict(row)
    return out


def _interval(chal: Score, ref: Score, z: float) -> tuple[float, float, float]:
    delta = chal.value - ref.value
    half = z * math.sqrt(chal.stderr**2 + ref.stderr**2)
    return delta, delta - half, delta + half


def _compare(chal: Score, ref: Score, label: str, cfg, *, improve: bool) -> Check:
    delta, lo, hi = _interval(chal, ref, cfg.z)
    dimension = chal.suite in DIMENSION_SUITES
    margin = cfg.business_margin if dimension else cfg.general_margin
    if improve:
        rule, passed = "must_improve", lo > 0
        why = f"{chal.name} must improve on {label} but the interval [{lo:+.3f}, {hi:+.3f}] does not lie above 0"
    else:
        rule = "no_regression" if dimension else "non_inferior"
        passed = (hi >= -margin) if cfg.mode == "noise_tolerant" else (lo >= -margin)
        bound = "upper" if cfg.mode == "noise_tolerant" else "lower"
        kind = "regressed" if dimension else "is inferior"
        why = (f"{chal.name} {kind} against {label}: delta {delta:+.3f}, {bound} bound "
               f"{hi if bound == 'upper' else lo:+.3f} < -{margin:.3f}")
    return Check(chal.name, label, rule, chal.value, ref.value, delta, lo, hi, passed, "" if passed else why)


def _floor_for(score: Score, cfg) -> float | None:
    for key in (score.name, score.area, score.suite):
        if key in cfg.floors:
            return cfg.floors[key]
    return cfg.default_floor


def _stderr_near(score: Score, reference: float) -> float:
    """The score's stderr, but never below a [0, 1] metric's stderr at the reference value: 0 of 12 has an
    observed stderr of 0, yet a model as good as the reference scores 0 of 12 quite often."""
    p = min(max(reference, 0.0), 1.0)
    return max(score.stderr, math.sqrt(p * (1 - p) / max(score.n, 1)))


def _own_interval(score: Score, reference: float, cfg) -> tuple[float, float]:
    """The score's own interval (a [0, 1] score's, clipped), judged against a measured reference value."""
    half = cfg.z * _stderr_near(score, reference)
    return max(0.0, score.value - half), min(1.0, score.value + half)


def _floor(score: Score, floor: float, cfg) -> Check:
    lo, hi = _own_interval(score, floor, cfg)
    passed = (hi >= floor) if cfg.mode == "noise_tolerant" else (lo >= floor)
    why = f"{score.name} scores {score.value:.3f} [{lo:.3f}, {hi:.3f}], below its floor {floor:.3f}"
    return Check(score.name, "floor", "floor", score.value, floor, score.value - floor, lo, hi, passed,
                 "" if passed else why)


def _must_beat(challenger: dict, cfg) -> list[Check]:
    units = scores_of(challenger)
    tasks = [Score.from_dict(row) for row in challenger.get("tasks", [])]
    checks = []
    for name, target in sorted(cfg.must_beat.items()):
        score = units.get(name) or next((t for t in tasks if t.name == name), None) or suite_score(tasks, name)
        if score is None:
            checks.append(Check(name, "must_beat", "coverage", None, target, None, None, None, False,
                                f"must_beat names '{name}', which the challenger's eval does not contain"))
            continue
        lo, hi = _own_interval(score, target, cfg)
        passed = lo > target
        why = (f"{name} scores {score.value:.3f} [{lo:.3f}, {hi:.3f}] (n = {score.n}), which does not beat "
               f"{target:.3f} beyond its interval")
        checks.append(Check(name, "must_beat", "must_beat", score.value, target, score.value - target, lo, hi,
                            passed, "" if passed else why))
    return checks


def quantization_checks(quantized: dict, reference: dict, cfg, form: str) -> list[Check]:
    """The release form (`form`, e.g. 'llamacpp q8_0') against the same version as trained, task by task and on
    each dimension suite's aggregate (the interval is the unpaired one: conservative for the same items)."""
    label = "as trained (hf)"
    mine = {row["name"]: Score.from_dict(row) for row in quantized.get("tasks", [])}
    theirs = {row["name"]: Score.from_dict(row) for row in reference.get("tasks", [])}
    checks = _versions_match(quantized, reference, label)
    units = [(name, mine.get(name), ref, cfg.quantization_max_drop, "eval.gate.quantization_max_drop")
             for name, ref in sorted(theirs.items())]
    for suite in DIMENSION_SUITES:
        ref = suite_score(list(theirs.values()), suite)
        if ref is not None:
            units.append((suite, suite_score(list(mine.values()), suite), ref, cfg.quantization_max_suite_drop,
                          "eval.gate.quantization_max_suite_drop"))
    for name, score, ref, allowed, setting in units:
        if score is None:
            checks.append(Check(name, label, "coverage", None, ref.value, None, None, None, False,
                                f"{name} was evaluated as trained but not on {form}"))
            continue
        delta, lo, hi = _interval(score, ref, cfg.z)
        passed = (hi >= -allowed) if cfg.mode == "noise_tolerant" else (lo >= -allowed)
        bound = hi if cfg.mode == "noise_tolerant" else lo
        why = (f"{name} loses {-delta:.3f} on {form} against the same version {label} "
               f"({score.value:.3f} vs {ref.value:.3f}, interval [{lo:+.3f}, {hi:+.3f}]): beyond {setting} "
               f"{allowed:.3f} ({'upper' if cfg.mode == 'noise_tolerant' else 'lower'} bound {bound:+.3f})")
        checks.append(Check(name, label, "quantization", score.value, ref.value, delta, lo, hi, passed,
                            "" if passed else why))
    return checks


def _versions_match(a: dict, b: dict, label: str) -> list[Check]:
    checks = []
    for suite, info in a.get("suites", {}).items():
        other = b.get("suites", {}).get(suite)
        if other and other.get("version") != info.get("version"):
            checks.append(Check(suite, label, "coverage", None, None, None, None, None, False,
                                f"suite {suite} is v{info.get('version')} for the challenger but "
                                f"v{other.get('version')} for {label}: re-evaluate {label} on the same version"))
    return checks


def compare(challenger: dict, champion: dict | None, cfg, *, challenger_label: str = "challenger",
            champion_label: str = "champion", history: list[tuple[str, dict]] = (),
            reference: tuple[str, dict] | None = None) -> GateReport:
    """Gate a challenger's eval summary against a champion's (or floors) and past champions'; `reference`
    (release form, the same version's as-trained summary) adds the quantization checks."""
    mine = scores_of(challenger)
    checks: list[Check] = _contamination(challenger)
    notes: list[str] = []
    if challenger.get("not_scored"):  # nothing to compare: the contamination check alone decides
        notes.append(f"not scored: {challenger['not_scored']}")
        return GateReport(challenger_label, champion_label if champion else None, False, checks,
                          [lbl for lbl, _ in history], cfg.model_dump(mode="json"), notes, {})
    if reference is not None:
        form, as_trained = reference
        checks += quantization_checks(challenger, as_trained, cfg, form)
        notes.append(f"release form {form}: held to the same version as trained (hf) on the same items")
    references = ([(champion_label, champion, True)] if champion else []) + [(lbl, s, False) for lbl, s in history]
    for label, summary, is_champion in references:
        checks += _versions_match(challenger, summary, label)
        theirs = scores_of(summary)
        for name, ref in sorted(theirs.items()):
            chal = mine.get(name)
            if chal is None:
                checks.append(Check(name, label, "coverage", None, ref.value, None, None, None, False,
                                    f"{name} was evaluated for {label} but not for the challenger"))
                continue
            checks.append(_compare(chal, ref, label, cfg, improve=False))
            if is_champion and name in cfg.must_improve:
                checks.append(_compare(chal, ref, label, cfg, improve=True))
    if champion is None:
        notes.append("no champion: absolute floors apply")
        for _name, score in sorted(mine.items()):
            floor = _floor_for(score, cfg)
            if floor is not None:
                checks.append(_floor(score, floor, cfg))
        if not cfg.must_beat and not any(c.rule == "floor" for c in checks):
            notes.append("no floors configured: nothing to hold a first release to (set eval.gate.floors)")
    checks += _must_beat(challenger, cfg)
    for dim in cfg.must_improve:
        if dim not in mine:
            checks.append(Check(dim, "config", "coverage", None, None, None, None, None, False,
                                f"must_improve names '{dim}', which the challenger's eval does not contain"))
        elif champion and dim not in scores_of(champion):
            # Without the champion's score there is nothing to improve on: never a silent pass.
            checks.append(Check(dim, champion_label, "coverage", None, None, None, None, None, False,
                                f"must_improve names '{dim}', which {champion_label}'s eval does not contain: "
                                f"evaluate {champion_label} on the same suite"))
    settings = cfg.model_dump(mode="json")
    return GateReport(challenger_label, champion_label if champion else None, all(c.passed for c in checks), checks,
                      [lbl for lbl, _ in history], settings, notes, reported_scores(challenger))


def _contamination(challenger: dict) -> list[Check]:
    """A challenger whose eval items overlap its training snapshot fails, as the registry's contamination gate
    would refuse it: the gate report says so first instead of judging scores that measure memory."""
    report = challenger.get("contamination") or {}
    count = report.get("count")
    if report.get("status") != "checked" or not count:
        return []
    return [Check("contamination", "training snapshot", "contamination", None, None, None, None, None, False,
                  f"{count} eval items overlap the training snapshot {report.get('snapshot_id')}: scores on them "
                  "measure memory, not skill (rebuild the snapshot with data.decontam naming the eval suites)")]


def reported_scores(summary: dict) -> dict:
    tasks = [Score.from_dict(row) for row in summary.get("tasks", [])]
    units = [s for s in (suite_score(tasks, suite) for suite in DIMENSION_SUITES) if s]
    units += [t for t in tasks if t.suite not in DIMENSION_SUITES]
    return {s.name: {"value": s.value, "stderr": s.stderr, "n": s.n} for s in units}
