"""The acceptance report of a build (`manifest["acceptance"]`) and its verdict under `data.accept`.

What the field guides ask before training, measured on every build:
  * lengths: p5/p50/p95/p99 of characters and content tokens per source and per domain, before and after
    cleaning (mlops.data.lengths);
  * rejected share per reason, over the rows read. Quality rejections (bad input rows, step errors, filters,
    per-record checks, refused batches) are judged against `data.accept.max_rejected_share`; duplicates and
    eval overlaps are reported but not judged: a corpus with many duplicates is not dirty text;
  * sequence lengths: the whole sequence (chat template included, before truncation) of every record that reached
    tokenization, a suggested max_seq_len (p99 rounded up to a multiple of 64) and the share a chosen length
    (`data.accept.max_seq_len`, else `data.seq_len`) and the suggestion truncate;
  * tokenizer fragmentation against a general-text baseline (mlops.data.fragmentation);
  * sufficiency: records the snapshot holds, in all and per domain, against `data.min_records` and
    `data.accept.min_records_per_domain`; below a floor the build fails naming the domain and how many more records
    it needs, or, with `data.accept.sufficiency: warn`, publishes with the shortfall as a warning;
  * with `data.filters.perplexity` on: the score distribution before and after that filter, and its bounds.

The report is assembled where the local and Ray executors meet (the build's consumer of their ordered results)
from sums over records, so both give the same report. Over the threshold the build fails before it publishes
(`on_fail: fail`: the staging folder goes, earlier snapshots are untouched, the report is kept under
`.failed/`) or publishes a snapshot marked flagged (`on_fail: flag`). The accept section is outside the config
hash, so a rebuild with other thresholds finds the published snapshot; its stored figures are judged again
under the new thresholds (`recheck`).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from mlops.data import perplexity
from mlops.data.config import AcceptConfig
from mlops.data.fragmentation import fragmentation
from mlops.data.lengths import share_over, summary
from mlops.errors import MLOpsError

JUDGED = ("bad_input", "error", "filter", "record", "gate")
NOT_JUDGED = ("dedup", "decontam")
NOT_REJECTIONS = {"record.truncated", "dedup.near_candidates", "gate.batches_passed", "gate.batches_quarantined"}
SEQ_ROUND = 64


class AcceptanceError(MLOpsError):
    """The build's rejected share is over data.accept.max_rejected_share (on_fail=fail); nothing was published."""


def rejections(counters: dict[str, int], rows_read: int) -> dict:
    reasons = {}
    for key, n in counters.items():
        stage = key.split(".", 1)[0]
        if stage not in JUDGED + NOT_JUDGED or key in NOT_REJECTIONS or key.startswith("dedup.prior_records"):
            continue
        if key == "gate.records_quarantined":
            key = "gate.batch_failed"
        elif stage == "gate":
            continue
        if n:
            reasons[key] = {"count": n, "share": round(n / rows_read, 4) if rows_read else 0.0,
                            "judged": stage in JUDGED}
    reasons = dict(sorted(reasons.items(), key=lambda kv: (-kv[1]["count"], kv[0])))
    judged = sum(v["count"] for v in reasons.values() if v["judged"])
    other = sum(v["count"] for v in reasons.values() if not v["judged"])
    return {"rows_read": rows_read, "judged_rejected": judged,
            "judged_share": round(judged / rows_read, 4) if rows_read else 0.0,
            "not_judged_rejected": other, "reasons": reasons}


def sequence_lengths(hist: Counter, chosen: int) -> dict:
    figures = summary(hist)
    suggested = max(SEQ_ROUND, math.ceil(figures["p99"] / SEQ_ROUND) * SEQ_ROUND)
    return {"records": sum(hist.values()), **figures, "suggested_max_seq_len": suggested,
            "suggested_from": f"p99 rounded up to a multiple of {SEQ_ROUND}",
            "chosen_max_seq_len": chosen, "truncated_share_at_chosen": share_over(hist, chosen),
            "truncated_share_at_suggested": share_over(hist, suggested)}


def holdings(writer: Any, data: Any) -> dict:
    """Records the snapshot holds, in all and per domain (train and validation, history samples included); a
    domain data.mix.ratios asks for and the snapshot lacks is listed with 0."""
    by_domain: Counter[str] = Counter({d: 0 for d, share in data.mix.ratios.items() if share > 0})
    for rows in writer.by_domain.values():
        for domain, c in rows.items():
            by_domain[domain] += c["records"]
    if writer.history:
        by_domain.update(writer.history["domains"])
    return {"records": sum(by_domain.values()), "by_domain": dict(sorted(by_domain.items()))}


def shortfalls(held: dict | None, accept: AcceptConfig, min_records: int) -> list[dict]:
    """Each floor the snapshot misses: {"domain" (None: the whole snapshot), "records", "floor", "needs", "key"}."""
    if not held:
        return []  # built before sufficiency was measured
    out = []
    if held["records"] < min_records:
        out.append({"domain": None, "records": held["records"], "floor": min_records,
                    "needs": min_records - held["records"], "key": "data.min_records"})
    per_domain = accept.min_records_per_domain
    named = isinstance(per_domain, dict)
    floors = per_domain if named else {d: per_domain for d in held["by_domain"]}
    for domain, floor in sorted(floors.items()):
        n = held["by_domain"].get(domain, 0)
        if n < floor:
            key = f"data.accept.min_records_per_domain.{domain}" if named else "data.accept.min_records_per_domain"
            out.append({"domain": domain, "records": n, "floor": floor, "needs": floor - n, "key": key})
    return out


def shortfall_text(short: dict) -> str:
    where = "the snapshot" if short["domain"] is None else f"domain '{short['domain']}'"
    return (f"{where} holds {short['records']} record(s), {short['needs']} short of {short['key']}="
            f"{short['floor']}")


def judge(report: dict, accept: AcceptConfig, min_records: int = 1) -> dict:
    share = report["rejected"]["judged_share"]
    over = share > accept.max_rejected_share
    # One bad row of four is 25%: a share of a handful of rows cannot tell dirty data from one bad row, so a build
    # below data.accept.min_rows is flagged (reported), never failed.
    few = report["rejected"]["rows_read"] < accept.min_rows
    status = "passed" if not over else ("flagged" if accept.on_fail == "flag" or few else "failed")
    reasons = sorted(report["rejected"]["reasons"].items(), key=lambda kv: (-kv[1]["count"], kv[0]))
    top = [k for k, v in reasons if v["judged"]][:5]
    verdict = {"status": status, "rejected_share": share, "max_rejected_share": accept.max_rejected_share,
               "on_fail": accept.on_fail, "reasons": top if over else [],
               **({"too_few_rows_to_fail": accept.min_rows} if over and few else {})}
    short = shortfalls(report.get("sufficiency"), accept, min_records)
    if short:
        verdict["sufficiency"] = {"mode": accept.sufficiency, "short": short}
        if accept.sufficiency == "fail":
            verdict["status"] = "failed"
        else:
            verdict["warnings"] = [shortfall_text(s) for s in short]
    return verdict


def build_report(build: Any, cleaner: Any, writer: Any, counters: dict[str, int]) -> dict:
    """The report of a build, from the cleaner's and the batch writer's sums (see the module doc)."""
    data = build.data
    rows = sum(c["records"] + c["issues"] for c in build.per_source.values())
    report = {
        "lengths": {"by_source": cleaner.lengths.table("source"), "by_domain": cleaner.lengths.table("domain"),
                    "all": cleaner.lengths.table("all").get("all", {}),
                    "tokens": "content tokens of the messages' text (no chat template)"},
        "rejected": rejections(counters, rows),
        "sequence": sequence_lengths(writer.seq_tokens, data.accept.max_seq_len or data.seq_len),
        "fragmentation": fragmentation(cleaner.sample.texts(), build.inputs.model["path"]),
        "sufficiency": holdings(writer, data),
        **({"perplexity": cleaner.perplexity} if getattr(cleaner, "perplexity", None) else {}),
    }
    report["verdict"] = judge(report, data.accept, data.min_records)
    return report


def _reasons(report: dict) -> str:
    reasons = report["rejected"]["reasons"]
    return ", ".join(f"{k} {reasons[k]['share']:.1%} ({reasons[k]['count']})" for k in report["verdict"]["reasons"])


def _failures(report: dict, verdict: dict) -> tuple[str, str]:
    """(what failed, the fix) of a failed verdict: the rejected share, the sufficiency, or both."""
    what, fix = [], []
    if verdict["reasons"] and verdict["on_fail"] == "fail" and "too_few_rows_to_fail" not in verdict:
        what.append(f"rejected {verdict['rejected_share']:.1%} of {report['rejected']['rows_read']} rows read, over "
                    f"data.accept.max_rejected_share={verdict['max_rejected_share']} (top reasons: {_reasons(report)})")
        fix.append("correct those rows at their source or relax the step that rejects most; or raise "
                   "data.accept.max_rejected_share; or set data.accept.on_fail=flag to publish the snapshot marked "
                   "flagged")
    short = verdict.get("sufficiency", {})
    if short.get("mode") == "fail":
        what.append("is short of records: " + "; ".join(shortfall_text(s) for s in short["short"]))
        more = ", ".join(f"{s['needs']} more" + (f" '{s['domain']}'" if s["domain"] else "") for s in short["short"])
        fix.append(f"add records to data.sources ({more}), or lower the floor; or set data.accept.sufficiency=warn "
                   "to publish with the shortfall as a warning")
    return " and ".join(what), "; ".join(fix)


def enforce(manifest: dict, failed_dir: Path) -> None:
    """Raise before publishing when the verdict is failed; the report stays in `failed_dir` for a person."""
    report = manifest.get("acceptance")
    if not report or report["verdict"]["status"] != "failed":
        return
    from mlops.files import atomic_write_json

    failed_dir.mkdir(parents=True, exist_ok=True)
    kept = failed_dir / f"{manifest['build_key']}-acceptance.json"
    atomic_write_json(kept, {"snapshot_id": manifest.get("snapshot_id"), "acceptance": report})
    what, fix = _failures(report, report["verdict"])
    raise AcceptanceError(f"the build {what}; nothing was published and earlier snapshots are untouched. The report "
                          f"is in {kept}. Fix: {fix}.")


def recheck(manifest: dict, accept: AcceptConfig, min_records: int = 1) -> None:
    """A published snapshot found again (the accept section and data.min_records are outside the build key): judge
    its stored figures under the thresholds asked for now."""
    report = manifest.get("acceptance")
    if not report:
        return  # built before acceptance reports existed
    verdict = judge(report, accept, min_records)
    if verdict["status"] == "failed":
        what, fix = _failures(report, verdict)
        raise AcceptanceError(f"snapshot {manifest['snapshot_id']} (built earlier from these inputs) {what}. It "
                              f"stays published as it was. Fix: {fix}; or correct the sources so the build makes "
                              "another snapshot.")


def _fig(row: dict | None) -> str:
    if not row:
        return "-"
    chars, tokens = row.get("chars", {}), row.get("tokens", {})
    text = f"n={row['records']} chars {chars.get('p5')}/{chars.get('p50')}/{chars.get('p95')}/{chars.get('p99')}"
    return text + (f" tokens {tokens['p5']}/{tokens['p50']}/{tokens['p95']}/{tokens['p99']}" if tokens else "")


def describe(report: dict | None) -> list[str]:
    """The report as lines for `mlops data show`."""
    if not report:
        return ["acceptance not measured (no report: a snapshot written directly, or built before acceptance reports)"]
    v, rej = report["verdict"], report["rejected"]
    warned = f", {len(v['warnings'])} sufficiency warning(s) below" if v.get("warnings") else ""
    lines = [f"acceptance {v['status'].upper()}: rejected {v['rejected_share']:.1%} of {rej['rows_read']} rows read "
             f"(limit {v['max_rejected_share']:.1%}, on_fail={v['on_fail']}{warned})"]
    # judged first, most frequent first (the manifest's JSON keeps keys sorted by name)
    ranked = sorted(rej["reasons"].items(), key=lambda kv: (not kv[1]["judged"], -kv[1]["count"], kv[0]))
    for key, r in ranked[:20]:
        lines.append(f"  {key:34} {r['share']:7.2%} ({r['count']}){'' if r['judged'] else '  not judged'}")
    lines.append("  lengths p5/p50/p95/p99, before -> after cleaning (tokens: content, no template)")
    for axis in ("by_source", "by_domain"):
        for key, row in report["lengths"][axis].items():
            lines.append(f"    {axis[3:]} {key}: {_fig(row.get('before'))} -> {_fig(row.get('after'))}")
    s = report["sequence"]
    lines.append(f"  sequence tokens (template included) p50 {s['p50']} p95 {s['p95']} p99 {s['p99']} max {s['max']}: "
                 f"suggested max_seq_len {s['suggested_max_seq_len']} (truncates {s['truncated_share_at_suggested']:.1%}); "
                 f"{s['chosen_max_seq_len']} truncates {s['truncated_share_at_chosen']:.1%}")
    f = report["fragmentation"]
    terms = ", ".join(f"{t['term']}({t['tokens']})" for t in f["most_split_terms"][:8]) or "none"
    lines.append(f"  tokenizer {f['tokens_per_word']} tokens/word vs {f['baseline_tokens_per_word']} on general text "
                 f"(x{f['ratio_to_baseline']}); most split frequent terms: {terms}")
    held = report.get("sufficiency")
    if held:
        domains = ", ".join(f"{d} {n}" for d, n in held["by_domain"].items())
        lines.append(f"  records held {held['records']} ({domains})")
    lines += [f"  short ({v['sufficiency']['mode']}): {shortfall_text(s)}" for s in v.get("sufficiency", {}).get("short", [])]
    lines += perplexity.describe(report.get("perplexity"))
    return lines
