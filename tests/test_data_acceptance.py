"""The acceptance report in the manifest: lengths before and after cleaning per source and domain, the rejected
share judged against data.accept, a suggested max_seq_len, tokenizer fragmentation; a failing acceptance
publishes nothing and leaves earlier snapshots alone."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from mlops.config import validate_config
from mlops.data.acceptance import AcceptanceError, judge, rejections, sequence_lengths
from mlops.data.config import AcceptConfig
from mlops.data.labelled_dedup import conversations
from mlops.data.lengths import percentile
from mlops.data.manifest import describe
from mlops.data.snapshot import list_snapshots, verify_snapshot
from mlops.data.testing import chat, quick_build
from mlops.errors import ConfigError


def test_percentiles_are_nearest_rank_on_the_exact_histogram():
    hist = Counter({10: 90, 100: 9, 1000: 1})
    assert [percentile(hist, p) for p in (5, 50, 90, 95, 99, 100)] == [10, 10, 10, 100, 100, 1000]
    assert percentile(Counter(), 50) == 0


def test_quality_rejections_are_judged_and_duplicates_only_reported():
    counters = {"filter.too_short": 3, "bad_input.malformed_json": 1, "dedup.exact": 40, "record.truncated": 5,
                "gate.records_quarantined": 2, "gate.batches_passed": 9, "dedup.near_candidates": 7}
    r = rejections(counters, 100)
    assert r["judged_rejected"] == 6 and r["judged_share"] == 0.06 and r["not_judged_rejected"] == 40
    assert set(r["reasons"]) == {"filter.too_short", "bad_input.malformed_json", "dedup.exact", "gate.batch_failed"}
    report = {"rejected": r}
    assert judge(report, AcceptConfig())["status"] == "failed"
    assert judge(report, AcceptConfig(on_fail="flag"))["status"] == "flagged"
    ok = judge(report, AcceptConfig(max_rejected_share=0.1))
    assert ok["status"] == "passed" and ok["reasons"] == []


def test_a_handful_of_rows_over_the_threshold_is_flagged_not_failed():
    report = {"rejected": rejections({"filter.short_answer": 1}, 4)}  # one bad row of a 4-row harvest: 25%
    verdict = judge(report, AcceptConfig())
    assert verdict["status"] == "flagged" and verdict["too_few_rows_to_fail"] == 100
    assert judge(report, AcceptConfig(min_rows=4))["status"] == "failed"


def test_the_suggested_max_seq_len_covers_p99_and_the_chosen_length_says_what_it_truncates():
    hist = Counter({100: 90, 300: 9, 2000: 1})
    s = sequence_lengths(hist, chosen=256)
    assert s["p95"] == 300 and s["suggested_max_seq_len"] == 320
    assert s["truncated_share_at_chosen"] == 0.1 and s["truncated_share_at_suggested"] == 0.01


@pytest.mark.parametrize("key, value", [("max_rejected_share", 1.5), ("max_rejected_share", -0.1),
                                        ("max_seq_len", 4), ("on_fail", "warn")])
def test_thresholds_out_of_range_are_refused_naming_the_field(key, value):
    with pytest.raises(ConfigError, match=f"data.accept.{key}"):
        validate_config({"data": {"accept": {key: value}}})


def clean_rows(n: int = 40) -> list[dict]:
    return [{**row, "domain": "billing" if i % 2 else "general"} for i, row in enumerate(conversations(n, seed=4))]


def dirty_rows() -> list[dict]:
    return clean_rows() + [chat("hi", "ok")] * 6 + ['{"messages": [']


@pytest.fixture
def build(tiny_model, tmp_path, mlops_home):
    def run(rows, **data):
        data.setdefault("on_bad_record", "skip")
        return quick_build(rows, base_model=tiny_model["path"], workdir=tmp_path, **data)

    return run


def test_the_report_holds_lengths_rejections_sequence_and_fragmentation(build):
    result = build(dirty_rows(), accept={"on_fail": "flag", "min_rows": 40})
    report = result.manifest["acceptance"]
    domains = report["lengths"]["by_domain"]
    assert set(domains) == {"billing", "general"}
    general = domains["general"]
    assert general["before"]["records"] == 26 and general["after"]["records"] == 20  # 6 too short went
    assert general["before"]["chars"]["p5"] < general["after"]["chars"]["p5"]
    assert 0 < general["after"]["tokens"]["p50"] < general["after"]["chars"]["p50"]
    (source,) = report["lengths"]["by_source"].values()
    assert source["before"]["records"] == 46
    rej = report["rejected"]
    assert rej["rows_read"] == 47 and rej["reasons"]["filter.too_short"]["count"] == 6
    assert rej["reasons"]["bad_input.malformed_json"]["count"] == 1 and rej["judged_share"] == round(7 / 47, 4)
    assert report["verdict"] == {"status": "flagged", "rejected_share": round(7 / 47, 4), "max_rejected_share": 0.05,
                                 "on_fail": "flag", "reasons": ["filter.too_short", "bad_input.malformed_json"]}
    seq = report["sequence"]
    assert seq["records"] == 40 and seq["chosen_max_seq_len"] == 256 and seq["suggested_max_seq_len"] % 64 == 0
    frag = report["fragmentation"]
    assert frag["records_sampled"] == 40 and frag["tokens_per_word"] > 0 and frag["baseline_tokens_per_word"] > 0
    assert all(t["tokens"] >= 1 and t["count"] >= 3 for t in frag["most_split_terms"])
    shown = describe(result.manifest)
    assert "acceptance FLAGGED: rejected 14.9% of 47 rows read" in shown and "suggested max_seq_len" in shown


def test_a_failing_acceptance_publishes_nothing_and_leaves_earlier_snapshots_alone(build, mlops_home):
    first = build(clean_rows(), accept={"on_fail": "fail"})
    assert first.manifest["acceptance"]["verdict"]["status"] == "passed"
    with pytest.raises(AcceptanceError) as err:
        build(dirty_rows(), name="dirty.jsonl", accept={"on_fail": "fail", "min_rows": 40})
    message = str(err.value)
    assert "14.9% of 47 rows read" in message and "data.accept.max_rejected_share=0.05" in message
    assert "filter.too_short 12.8% (6)" in message and "nothing was published" in message and "Fix:" in message
    assert [m["snapshot_id"] for m in list_snapshots()] == [first.snapshot_id]
    verify_snapshot(first.snapshot_id)
    kept = list((first.path.parent / ".failed").glob("*-acceptance.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["acceptance"]["verdict"]["status"] == "failed"
    assert not list(first.path.parent.glob(".staging-*"))


def test_a_published_snapshot_is_judged_again_under_stricter_thresholds(build):
    first = build(dirty_rows(), accept={"on_fail": "flag"})
    again = build(dirty_rows(), accept={"on_fail": "flag", "max_rejected_share": 0.5})
    assert again.noop and again.snapshot_id == first.snapshot_id
    with pytest.raises(AcceptanceError, match=f"snapshot {first.snapshot_id} .* stays published"):
        build(dirty_rows(), accept={"on_fail": "fail", "min_rows": 40})
    verify_snapshot(first.snapshot_id)
