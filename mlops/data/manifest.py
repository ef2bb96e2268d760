"""The snapshot manifest: what went in, what every step did, what came out. Also how a build is logged
to tracking and how `mlops data show` prints a manifest."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from mlops.data.inputs import source_entries
from mlops.data.mixing import achieved
from mlops.lineage import PIPELINE_VERSION

MAX_LISTED = 200


def _table(rows: dict[str, Counter]) -> dict[str, dict[str, int]]:
    return {key: dict(sorted(c.items())) for key, c in sorted(rows.items())}


def _merge(by_split: dict[str, dict[str, Counter]]) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for rows in by_split.values():
        for key, c in rows.items():
            out.setdefault(key, Counter()).update(c)
    return out


def assemble_manifest(build: Any, cleaner: Any, plan: Any, writer: Any, eval_index: Any, seconds: float) -> dict:
    from mlops.data.acceptance import build_report
    from mlops.lineage import code_version, git_state

    inputs, data = build.inputs, build.data
    commit, dirty = git_state()
    counters = Counter(build.counters)
    counters.update({f"pii.{k}": v for k, v in cleaner.pii.items()})
    passed = [b for b in writer.batches if b["status"] == "passed"]
    quarantined = [b for b in writer.batches if b["status"] == "quarantined"]
    counters.update({"gate.batches_passed": len(passed), "gate.batches_quarantined": len(quarantined),
                     "gate.records_quarantined": sum(b["records"] for b in quarantined)})
    domain_records = {d: c["records"] for d, c in _merge(writer.by_domain).items()}
    sources = source_entries(inputs)
    for src in sources:
        src.update(dict(build.per_source[src["name"]]))
    return {
        "name": data.name,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(seconds, 2),
        "build_key": inputs.key,
        "pipeline": {"version": PIPELINE_VERSION, "code_version": code_version(), "git_commit": commit,
                     "git_dirty": dirty},
        "config_hash": inputs.pipeline_hash,
        "config": data.model_dump(mode="json"),
        "seed": inputs.seed,
        "base_model": {"name": inputs.model["name"], "id": inputs.model["id"]},
        "tokenizer": inputs.tokenizer,
        "seq_len": data.seq_len,
        "pad_id": inputs.tokenizer["pad_id"],
        "pack": data.pack,
        "record_type": data.record_type,  # mlops.data.format.record_type: chat, or preference (row pairs)
        **_pairs(data.record_type, writer),
        "sources": sources,
        "eval_sets": [{"name": e["name"], "sha256": e["sha256"], "items": e.get("items", 0)}
                      for e in inputs.eval_files],
        "eval_sets_unmatched": inputs.eval_unmatched,
        "counts": {
            "samples": {s: idx["count"] for s, idx in writer.indexes.items()},
            "per_split": {s: dict(sum(rows.values(), Counter())) for s, rows in writer.by_domain.items()},
            "per_domain": {s: _table(rows) for s, rows in writer.by_domain.items()},
            "per_source": {s: _table(rows) for s, rows in writer.by_source.items()},
        },
        "counters": dict(sorted(counters.items())),
        "mixing": {**plan.as_dict(), "achieved": achieved(domain_records), "achieved_records": domain_records,
                   "history": writer.history},
        "gate": {"suite": writer.suite.key, "expectations": len(writer.suite.build(build.gate_params(plan.targets))),
                 "on_batch_failure": data.gate.on_batch_failure, "batch_size": data.batch_size,
                 "passed": len(passed), "quarantined": len(quarantined)},
        "batches": writer.batches,
        "dedup": {**build.dedup_params(), "against_snapshots": [sid for sid, _ in inputs.priors],
                  "near_candidates": counters.get("dedup.near_candidates", 0),
                  "near_confirmed": counters.get("dedup.near", 0) + counters.get("dedup.near_of_snapshot", 0),
                  **({"semantic": cleaner.semantic} if getattr(cleaner, "semantic", None) else {})},
        "decontam": {"ngram": data.decontam.ngram, "eval_items": eval_index.items,
                     "hits": len(cleaner.decontam_hits), "examples": cleaner.decontam_hits[:MAX_LISTED]},
        "issues": {"count": sum(v for k, v in counters.items() if k.startswith("bad_input.")),
                   "listed": build.issues[:MAX_LISTED], "file": "quarantine/bad_input.jsonl"},
        **_blocklist(inputs.blocklist, counters),
        "acceptance": build_report(build, cleaner, writer, counters),
    }


def _pairs(record_type: str, writer: Any) -> dict:
    """A preference snapshot counts its pairs per split, source and domain (each pair is two rows)."""
    if record_type != "preference":
        return {}

    def count(table: dict[str, Counter]) -> dict[str, int]:
        return {key: c.get("pairs", 0) for key, c in sorted(table.items())}

    per_source, per_domain = _merge(writer.by_source), _merge(writer.by_domain)
    return {"pairs": {"total": sum(count(per_source).values()),
                      "per_split": {s: sum(count(rows).values()) for s, rows in writer.by_source.items()},
                      "per_source": count(per_source), "per_domain": count(per_domain),
                      "rows_per_pair": 2, "order": "chosen (even row), rejected (odd row)"}}


def _blocklist(listed: Any, counters: Counter) -> dict:
    if listed is None:
        return {}
    return {"blocklist": {"path": listed.path, "sha256": listed.sha256, "entries": listed.entries,
                          "case_sensitive": listed.case_sensitive, "rejected": counters.get("filter.blocklist", 0)}}


def flat_counters(manifest: dict) -> dict[str, float]:
    metrics = {k.replace(":", "_"): float(v) for k, v in manifest.get("counters", {}).items()}
    for split, n in manifest.get("counts", {}).get("samples", {}).items():
        metrics[f"samples.{split}"] = float(n)
    for split, c in manifest.get("counts", {}).get("per_split", {}).items():
        for key, v in c.items():
            metrics[f"{key}.{split}"] = float(v)
    for domain, share in manifest.get("mixing", {}).get("achieved", {}).items():
        metrics[f"mix.achieved.{domain}"] = float(share)
    report = manifest.get("acceptance")
    if report:
        metrics["accept.rejected_share"] = float(report["verdict"]["rejected_share"])
        metrics["accept.suggested_max_seq_len"] = float(report["sequence"]["suggested_max_seq_len"])
        metrics["accept.tokens_per_word"] = float(report["fragmentation"]["tokens_per_word"])
    return metrics


def log_build(tracker: Any, result: Any) -> None:
    """Tags, counters, the manifest as an artifact and the snapshot as a dataset input of the run."""
    from mlops.lineage import Tag

    m = result.manifest
    tracker.set_tags({Tag.SNAPSHOT_ID: result.snapshot_id, Tag.STAGE: "data"})
    tracker.log_params({"data.name": m.get("name"), "data.build_key": m.get("build_key"),
                        "data.gate_suite": m.get("gate", {}).get("suite"),
                        "data.noop": result.noop, "data.seq_len": m.get("seq_len"),
                        "data.tokenizer_hash": m.get("tokenizer", {}).get("hash")})
    tracker.log_metrics(flat_counters(m))
    tracker.log_artifact(result.path / "manifest.json", "snapshot")
    for report in sorted(result.path.glob("quarantine/batches/*/validation.json")):  # GE results of refused batches
        tracker.log_artifact(report, f"snapshot/gate/{report.parent.name}")
    tracker.log_input(m.get("name", "snapshot"), result.snapshot_id, str(result.path), context="data_build")
    attest_build(tracker.run_id, result)


def attest_build(run_id: str, result: Any) -> str | None:
    """The builder signs what the data gate reads: the snapshot (its manifest's sha256) and its GE batch results
    (the registry's `attest` service; nothing is signed without one, or without an identity)."""
    from mlops.files import file_sha256
    from mlops.stages import service

    attest = service("attest")
    if attest is None:
        return None
    batches = result.manifest.get("batches", [])
    predicate = {"snapshot_id": result.snapshot_id, "data_run": run_id, "batches": len(batches),
                 "passed_batches": sum(b.get("status") == "passed" for b in batches),
                 "quarantined": sum(b.get("status") == "quarantined" for b in batches),
                 "admitted_failures": [b.get("batch") for b in batches if b.get("status") not in ("passed", "quarantined")
                                       or (b.get("status") == "passed" and b.get("failed"))]}
    return attest("data", {result.snapshot_id: file_sha256(result.path / "manifest.json")}, predicate,
                  subject_key=result.snapshot_id)


def describe(manifest: dict) -> str:
    """A readable summary of a manifest (`mlops data show`)."""
    lines = [
        f"snapshot   {manifest['snapshot_id']}  ({manifest.get('name')}, created {manifest.get('created_at')})",
        f"pipeline   v{manifest.get('pipeline', {}).get('version')}  code {manifest.get('pipeline', {}).get('code_version')}"
        f"  git {str(manifest.get('pipeline', {}).get('git_commit'))[:12]}",
        f"tokenizer  {manifest.get('tokenizer', {}).get('name')}  vocab {manifest.get('tokenizer', {}).get('vocab_hash', '')[:12]}"
        f"  template {manifest.get('tokenizer', {}).get('chat_template_hash', '')[:12]}  seq_len {manifest.get('seq_len')}",
        f"config     {manifest.get('config_hash', '')[:16]}",
    ]
    if manifest.get("pairs"):
        p = manifest["pairs"]
        lines.append(f"pairs      {p['total']} preference pairs (chosen, rejected rows): "
                     + "  ".join(f"{src}={n}" for src, n in p.get("per_source", {}).items()))
    counts = manifest.get("counts", {})
    lines.append("samples    " + "  ".join(f"{s}={n}" for s, n in counts.get("samples", {}).items()))
    for split, c in counts.get("per_split", {}).items():
        lines.append(f"  {split:10} records={c.get('records', 0)} tokens={c.get('tokens', 0)} "
                     f"loss_tokens={c.get('loss_tokens', 0)}")
    mixing = manifest.get("mixing", {})
    if mixing:
        lines.append("mix        domain: target -> achieved (records)")
        for d, share in mixing.get("achieved", {}).items():
            target = mixing.get("targets", {}).get(d, 0.0)
            lines.append(f"  {d:12} {target:6.1%} -> {share:6.1%} ({mixing.get('achieved_records', {}).get(d, 0)})")
        if mixing.get("history"):
            h = mixing["history"]
            lines.append(f"  history {h['snapshot']}: {h['samples']} samples, {h['achieved_ratio']:.1%} "
                         f"(target {h['target_ratio']:.0%})")
    lines.append("sources")
    for s in manifest.get("sources", []):
        lines.append(f"  {s['name']}  sha256 {s['sha256'][:12]}  records={s.get('records', 0)} issues={s.get('issues', 0)}")
    lines.append("counters")
    lines += [f"  {k:40} {v}" for k, v in manifest.get("counters", {}).items()]
    gate = manifest.get("gate", {})
    if gate:
        lines.append(f"gate       {gate.get('suite')}: {gate.get('passed')} passed, {gate.get('quarantined')} quarantined")
        for b in manifest.get("batches", []):
            if b["status"] != "passed":
                failed = ", ".join(f"{f['expectation']}({f.get('column') or ''})" for f in b.get("failed", []))
                lines.append(f"  batch {b['batch']}: {b['status']} ({b['records']} records) {failed} -> {b.get('report')}")
    decon = manifest.get("decontam", {})
    if decon.get("hits"):
        lines.append(f"decontam   {decon['hits']} hits")
        lines += [f"  {h['source']}:{h['line']} ~ {h['eval_file']}:{h['eval_line']} ({h['eval_id']}): "
                  f"\"{h['ngram'][:60]}\"" for h in decon.get("examples", [])[:10]]
    issues = manifest.get("issues", {})
    if issues.get("count"):
        lines.append(f"issues     {issues['count']}")
        lines += [f"  {i['file']}:{i['line']} [{i.get('code', '')}] {i['problem']}" for i in issues.get("listed", [])[:10]]
    from mlops.data.acceptance import describe as describe_acceptance

    lines += describe_acceptance(manifest.get("acceptance"))
    return "\n".join(lines)
