"""Sufficiency in the acceptance report: a snapshot below data.min_records or a domain below
data.accept.min_records_per_domain is refused, naming the domain and how many more records it needs; with
data.accept.sufficiency=warn it is published and the report carries the shortfall as a warning."""

from __future__ import annotations

import pytest

from mlops.config import config_hash, validate_config
from mlops.data.acceptance import AcceptanceError, judge, rejections, shortfalls
from mlops.data.config import AcceptConfig
from mlops.data.labelled_dedup import conversations
from mlops.data.manifest import describe
from mlops.data.snapshot import list_snapshots
from mlops.data.testing import quick_build, quick_config
from mlops.errors import ConfigError

HELD = {"records": 50, "by_domain": {"billing": 12, "general": 38}}


def report(held: dict = HELD) -> dict:
    return {"rejected": rejections({}, held["records"]), "sufficiency": held}


def test_a_domain_below_its_floor_fails_the_verdict_naming_the_domain_and_the_shortfall():
    verdict = judge(report(), AcceptConfig(min_records_per_domain={"billing": 20, "general": 30}))
    assert verdict["status"] == "failed"
    assert verdict["sufficiency"] == {"mode": "fail", "short": [
        {"domain": "billing", "records": 12, "floor": 20, "needs": 8,
         "key": "data.accept.min_records_per_domain.billing"}]}


def test_one_number_applies_to_every_domain_and_the_snapshot_floor_is_data_min_records():
    short = shortfalls(HELD, AcceptConfig(min_records_per_domain=40), min_records=60)
    assert [(s["domain"], s["needs"], s["key"]) for s in short] == [
        (None, 10, "data.min_records"), ("billing", 28, "data.accept.min_records_per_domain"),
        ("general", 2, "data.accept.min_records_per_domain")]
    # a domain the floor names and the snapshot lacks needs the whole floor
    (missing,) = shortfalls(HELD, AcceptConfig(min_records_per_domain={"refunds": 5}), min_records=1)
    assert (missing["domain"], missing["records"], missing["needs"]) == ("refunds", 0, 5)


def test_warn_mode_passes_with_the_shortfall_as_a_warning():
    verdict = judge(report(), AcceptConfig(min_records_per_domain={"billing": 20}, sufficiency="warn"))
    assert verdict["status"] == "passed"
    assert verdict["warnings"] == ["domain 'billing' holds 12 record(s), 8 short of "
                                   "data.accept.min_records_per_domain.billing=20"]


def test_without_floors_the_verdict_is_unchanged():
    assert judge(report(), AcceptConfig()) == {"status": "passed", "rejected_share": 0.0, "max_rejected_share": 0.05,
                                               "on_fail": "fail", "reasons": []}


@pytest.mark.parametrize("floors", [-1, {"billing": -5}, "many"])
def test_a_bad_floor_is_refused_naming_the_field(floors):
    with pytest.raises(ConfigError, match="data.accept.min_records_per_domain"):
        validate_config({"data": {"accept": {"min_records_per_domain": floors}}})


def test_floors_and_mode_leave_the_config_hash_alone(tmp_path):
    plain = quick_config([tmp_path / "a.jsonl"], tmp_path)
    floors = quick_config([tmp_path / "a.jsonl"], tmp_path,
                          accept={"min_records_per_domain": {"billing": 10}, "sufficiency": "warn"})
    assert config_hash(floors) == config_hash(plain)


def rows() -> list[dict]:
    # 30 general, 10 billing conversations, all clean
    return [{**row, "domain": "billing" if i % 4 == 0 else "general"} for i, row in enumerate(conversations(40, seed=4))]


@pytest.fixture
def build(tiny_model, tmp_path, mlops_home):
    def run(**data):
        return quick_build(rows(), base_model=tiny_model["path"], workdir=tmp_path, **data)

    return run


def test_a_snapshot_with_a_domain_below_its_floor_is_refused_and_nothing_is_published(build):
    with pytest.raises(AcceptanceError) as err:
        build(accept={"min_records_per_domain": {"billing": 25, "general": 25}})
    message = str(err.value)
    assert "domain 'billing' holds 10 record(s), 15 short of data.accept.min_records_per_domain.billing=25" in message
    assert "general" not in message.split("Fix:")[0]  # 30 general records meet their floor
    assert "nothing was published" in message and "Fix: add records to data.sources (15 more 'billing')" in message
    assert "data.accept.sufficiency=warn" in message
    assert list_snapshots() == []


def test_warn_mode_publishes_with_the_warning_in_the_report(build):
    result = build(min_records=60, accept={"min_records_per_domain": 25, "sufficiency": "warn"})
    report = result.manifest["acceptance"]
    assert report["sufficiency"] == {"records": 40, "by_domain": {"billing": 10, "general": 30}}
    assert report["verdict"]["status"] == "passed"
    assert report["verdict"]["warnings"] == [
        "the snapshot holds 40 record(s), 20 short of data.min_records=60",
        "domain 'billing' holds 10 record(s), 15 short of data.accept.min_records_per_domain=25"]
    shown = describe(result.manifest)
    assert "records held 40 (billing 10, general 30)" in shown
    assert "short (warn): domain 'billing' holds 10 record(s), 15 short" in shown
    assert [m["snapshot_id"] for m in list_snapshots()] == [result.snapshot_id]


def test_a_published_snapshot_is_refused_again_under_a_higher_floor(build):
    first = build()
    assert first.manifest["acceptance"]["verdict"]["status"] == "passed"
    with pytest.raises(AcceptanceError, match=f"snapshot {first.snapshot_id} .* domain 'billing' holds 10 record"
                                              r"\(s\), 2 short .* stays published"):
        build(accept={"min_records_per_domain": {"billing": 12}})
