"""Layer 5 (readers): the release report: one model's story read back from stored state, never from what a script printed.

Per version: lineage (training run, snapshot, data run, content id), the human review of its snapshot (`mlops data
review`, read from this project's snapshot store), the eval scores its gate stood on
(business suite as a whole and general tasks, each with its one-sided interval), the stored gate report's
outcome with its main deltas, and which gates block it now. Then the ledger in order, the serving switches
(when the version answering users changed, from the request log), spot-checks and shadow evidence. `mlops
registry report` prints it; `make demo` ends with it.
"""

from __future__ import annotations

import time


def release_report(model: str, *, url: str | None = None) -> dict:
    from mlops.lineage import Tag
    from registry import ledger
    from registry.audit import verify
    from registry.gates import evaluate_gates
    from registry.resolve import require_model

    state = require_model(model, url=url)
    versions = []
    for version, vs in sorted(state.versions.items(), key=lambda kv: int(kv[0])):
        gates = evaluate_gates(state, version)
        versions.append({
            "version": version, "stage": vs.stage, "stage_reason": vs.stage_reason,
            "aliases": sorted(a for a, v in state.aliases.items() if v == version),
            "trainer": vs.trainer, "registered_by": vs.registered_by, "content_id": vs.content_id,
            "run_id": vs.evidence.get("run_id"), "snapshot_id": vs.evidence.get("snapshot_id"),
            "data_run_id": (vs.evidence.get("lineage") or {}).get(str(Tag.DATA_RUN)),
            "gate": gate_outcome(vs.content_id), "data_review": data_review(vs.evidence.get("snapshot_id")),
            "blocking": [{"gate": g.gate, "detail": g.detail} for g in gates if not g.ok],
        })
    entries = [{k: e.as_dict()[k] for k in ("seq", "ts", "actor", "action", "version", "from_stage", "to_stage",
                                             "alias", "alias_before", "alias_after", "reason")}
               for e in ledger.verified(url).of(model)]
    return {"model": model, "created": _iso(time.time()),
            "aliases": dict(state.aliases), "versions": versions, "ledger": entries,
            "pending": [{"version": r.version, "to": r.to_stage, "requester": r.requester, "comment": r.comment}
                        for r in state.requests if r.status == "pending"],
            "serving": serving_switches(model, url=url), "ledger_verified": verify(model, url).ok}


def data_review(snapshot_id: str | None) -> dict:
    """The human review of the version's snapshot (`mlops data review`), as this project's snapshot store holds it."""
    from mlops.data.review import snapshot_review

    return snapshot_review(snapshot_id)


def gate_outcome(content_id: str | None) -> dict | None:
    """The newest stored gate report of a model: result, what it compared against, main deltas, scores."""
    from registry.gates import newest_gate_report

    found = newest_gate_report(content_id) if content_id else None
    if found is None:
        return None
    run_id, report = found
    checks = report.get("checks") or []
    moved = sorted((c for c in checks if c.get("delta") is not None and c.get("rule") not in ("coverage",
                                                                                               "quantization")),
                   key=lambda c: abs(c["delta"]), reverse=True)
    evidence = (report.get("settings") or {}).get("evidence") or {}
    mine = evidence.get("challenger") or {}
    quant = [c for c in checks if c.get("rule") == "quantization" and c.get("delta") is not None]
    return {"gate_run": run_id, "result": report.get("result"), "champion": report.get("champion"),
            "reasons": report.get("reasons") or [],
            "main_deltas": [{k: c.get(k) for k in ("name", "against", "rule", "delta", "lo", "hi", "passed")}
                            for c in moved[:4]],
            "eval_run": mine.get("eval_run_id"),
            "quantization": None if not quant else {
                "form": (evidence.get("reference") or {}).get("release_form"),
                "reference_eval_run": (evidence.get("reference") or {}).get("eval_run_id"),
                "worst": {k: min(quant, key=lambda c: c["delta"]).get(k) for k in ("name", "delta", "lo", "hi")},
                "failed": [c["name"] for c in quant if not c.get("passed")],
                "max_drop": (report.get("settings") or {}).get("quantization_max_drop")},
            "scores": eval_scores(report)}


def eval_scores(report: dict) -> dict:
    """The scores the gate report stored, with the half-width of the interval the gate used (its own `z`)."""
    z = (report.get("settings") or {}).get("z", 1.645)
    return {name: {"value": s["value"], "half_width": z * s["stderr"], "n": s["n"]}
            for name, s in (report.get("scores") or {}).items()}


def serving_switches(model: str, *, url: str | None = None) -> list[dict]:
    """When the version answering users changed: the first logged user request each version answered."""
    from mlops.requestlog import read_requests

    switches, current = [], None
    for row in read_requests(model=model, role="user", url=url):
        if row["status"] != 200:
            continue  # refused requests (a wrong model name, a bad body) say nothing about who served
        if row["version"] != current:
            switches.append({"ts": _iso(row["ts"]), "from": current, "to": row["version"],
                             "request_id": row["request_id"]})
            current = row["version"]
    return switches


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def render(report: dict) -> str:
    """The report for people: versions with lineage and gates, the ledger, serving switches."""
    aliases = ", ".join(f"@{a}=v{v}" for a, v in sorted(report["aliases"].items())) or "no aliases"
    lines = [f"Release report of {report['model']} ({aliases}), read from the stored state at {report['created']}",
             "", "Versions:"]
    for v in report["versions"]:
        lines.append(f"  v{v['version']} {v['stage']}{' @' + ',@'.join(v['aliases']) if v['aliases'] else ''}: "
                     f"run {v['run_id']}, snapshot {v['snapshot_id']}, data run {v['data_run_id'] or '?'}, "
                     f"trained by {v['trainer'] or '?'}")
        if v.get("data_review"):
            from mlops.data.review import describe_review

            lines.append(f"      data review: {describe_review(v['data_review'])}")
        gate = v["gate"]
        if gate:
            against = f"against {gate['champion']}" if gate["champion"] else "on floors (no champion)"
            lines.append(f"      gate {gate['result']} {against} (gate run {gate['gate_run']})")
            for name, s in gate["scores"].items():
                lines.append(f"      score {name}: {s['value']:.3f} ± {s['half_width']:.3f} (n = {s['n']})")
            for d in gate["main_deltas"]:
                if d["rule"] in ("floor", "must_beat"):  # the interval is the score's own, not a delta's
                    what = f"{d['delta']:+.3f} from it, score interval [{d['lo']:.3f}, {d['hi']:.3f}]"
                else:
                    what = f"delta {d['delta']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"
                lines.append(f"      {d['name']} vs {d['against']} ({d['rule']}): {what} "
                             f"{'ok' if d['passed'] else 'FAILED'}")
            q = gate.get("quantization")
            if q:
                verdict = f"FAILED on {', '.join(q['failed'])}" if q["failed"] else "ok"
                w = q["worst"]
                interval = f" [{w['lo']:+.3f}, {w['hi']:+.3f}]" if w.get("lo") is not None else ""
                lines.append(f"      quantization: {q['form']} vs as trained (eval run {q['reference_eval_run']}): "
                             f"worst {w['name']} {w['delta']:+.3f}{interval} (max drop {q['max_drop']}) {verdict}")
        else:
            lines.append("      no stored gate report")
        for b in v["blocking"]:
            lines.append(f"      blocks production now: {b['gate']}: {b['detail']}")
        if v["stage_reason"]:
            lines.append(f"      last stage change: {v['stage_reason']}")
    lines += ["", f"Ledger ({len(report['ledger'])} entries, hash chain "
                  f"{'verified' if report['ledger_verified'] else 'NOT verified: run mlops registry verify'}):"]
    for e in report["ledger"]:
        move = f" @{e['alias']}: {e['alias_before'] or '-'} -> {e['alias_after'] or '-'}" if e["alias"] else ""
        stage = f" {e['from_stage'] or '-'} -> {e['to_stage']}" if e["to_stage"] else ""
        lines.append(f"  #{e['seq']} {e['ts']} {e['actor']:6} {e['action']:18} v{e['version'] or '-'}{stage}{move}"
                     + (f" ({e['reason']})" if e["reason"] else ""))
    lines += ["", "Serving switches (first user request each version answered, from the request log):"]
    lines += [f"  {s['ts']} v{s['from'] or '-'} -> v{s['to']} (request {s['request_id']})" for s in report["serving"]]
    if not report["serving"]:
        lines.append("  no logged user requests")
    from mlops.text import shown

    return "\n".join(shown(line) for line in lines)  # each line escaped: typed text cannot add one
