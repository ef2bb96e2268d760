"""The whole build on small inputs: manifest, tracking, per-record isolation, gate quarantine, no-op rebuilds,
incremental mode, bad input policy, privacy of what is quarantined, crash safety and empty builds."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from mlops.data.batches import GateError
from mlops.data.build import EmptySnapshotError
from mlops.data.format import SnapshotReader, read_manifest
from mlops.data.labelled_dedup import conversations
from mlops.data.records import BadInputError
from mlops.data.snapshot import list_snapshots, verify_snapshot
from mlops.data.testing import chat, quick_build
from mlops.errors import MLOpsError
from mlops.lineage import Tag
from mlops.tracking import MemoryTracker


def good_records(n: int, seed: int = 1) -> list[dict]:
    return [{**row, "domain": "domain" if i % 2 else "general"} for i, row in enumerate(conversations(n, seed))]


def token_dense(seed: int = 9) -> dict:
    """Clean text under max_chars but far more tokens than a 256-token seq_len (a long answer, so a truncated
    copy still has assistant tokens to train on)."""
    answer = " ".join(c["messages"][0]["content"] for c in conversations(6, seed=seed))
    return chat("Can you walk me through everything I should try with the router, step by step?", answer)


def all_meta(folder: Path) -> list[dict]:
    return [m for split in ("train", "validation") for m in SnapshotReader(folder, split).iter_meta()]


@pytest.fixture
def build(tiny_model, tmp_path, mlops_home):
    def run(records, **kwargs):
        kwargs.setdefault("workdir", tmp_path)
        return quick_build(records, base_model=tiny_model["path"], **kwargs)

    return run


def test_build_cleans_and_describes_everything_in_the_manifest(build, tmp_path):
    records = good_records(30)
    leak_q = "A customer says their router lights blink orange after a storm and the internet is down. What now?"
    evals = tmp_path / "evals.jsonl"
    evals.write_text(json.dumps({"id": "sup-001", "prompt": leak_q}) + "\n")
    records += [
        chat("Please update my email to jane.doe@example.com and call +1 415-555-0132 today.",
             "Done, both are updated on your profile now."),
        dict(records[3]),  # exact duplicate
        {**records[5], "messages": [*records[5]["messages"][:-1],
                                    {"role": "assistant", "content": records[5]["messages"][-1]["content"] + " Cheers."}]},
        chat("▒░▓ ��� ■□ ^^^ ¤¤¤ ~~~ ||| ▀▄ " * 4, "Noted, we will look into it."),
        chat(f"Hello! {leak_q}", "Check the cables first, then restart the router."),
        {"text": "Knowledge base: unplug the router for ten seconds, then plug it back in and wait."},
    ]
    tracker = MemoryTracker()
    result = build(records, tracker=tracker, decontam={"eval_sets": [str(evals)]})
    m = result.manifest
    c = m["counters"]
    assert (c["pii.email"], c["pii.phone"], c["dedup.exact"], c["filter.symbol_ratio"], c["decontam.eval_overlap"]) == (
        1, 1, 1, 1, 1)
    assert c["dedup.near"] >= 1
    assert m["decontam"]["examples"][0]["eval_id"] == "sup-001"
    kept = c["cleaning.kept"]
    assert sum(m["counts"]["samples"].values()) == kept and m["counts"]["samples"]["validation"] >= 1
    assert m["tokenizer"]["vocab_hash"] and m["tokenizer"]["chat_template_hash"] and m["pipeline"]["git_commit"]
    assert m["sources"][0]["sha256"] and m["sources"][0]["records"] == len(records)
    assert all(b["status"] == "passed" for b in m["batches"]) and m["gate"]["suite"] == "snapshot_batch@v2"
    per_domain = m["counts"]["per_domain"]["train"]
    assert set(per_domain) <= {"general", "domain"} and all(v["loss_tokens"] > 0 for v in per_domain.values())
    assert m["created_at"] and m["config_hash"] and m["snapshot_id"] == result.path.name
    # PII never reaches the shards or the quarantine; rejected records keep a redacted excerpt only.
    rejected = [json.loads(x) for x in (result.path / "quarantine" / "records.jsonl").read_text().splitlines()]
    assert rejected and all("messages" not in r and r["excerpt"] for r in rejected)
    assert not any("@example.com" in json.dumps(r) for r in rejected)
    near = [r for r in rejected if r["reason"] == "near"]
    assert near and all(r["duplicate_of"].startswith("r-") and 0.7 <= r["similarity"] < 1 for r in near)
    assert tracker.tags[str(Tag.SNAPSHOT_ID)] == result.snapshot_id
    assert tracker.artifacts[f"input:{m['name']}"]["digest"] == result.snapshot_id
    assert "snapshot/manifest.json" in tracker.artifacts
    assert verify_snapshot(result.snapshot_id)["ok"]


@pytest.mark.parametrize("overlong", ["drop", "truncate"])
def test_a_record_longer_than_seq_len_costs_only_itself(build, overlong):
    records = good_records(40)
    records.insert(17, token_dense())  # clean text, far more tokens than seq_len
    result = build(records, seq_len=256, batch_size=10, overlong=overlong)
    m = result.manifest
    assert all(b["status"] == "passed" for b in m["batches"]) and m["gate"]["quarantined"] == 0
    written = {meta["id"] for meta in all_meta(result.path)}
    if overlong == "drop":
        assert m["counters"]["record.too_many_tokens"] == 1 and len(written) == m["counters"]["cleaning.kept"] - 1
        (line,) = [json.loads(x) for x in (result.path / "quarantine" / "records.jsonl").read_text().splitlines()
                   if json.loads(x)["stage"] == "record"]
        assert line["reason"] == "too_many_tokens" and line["n_tokens"] > 256 and line["seq_len"] == 256
    else:
        assert m["counters"]["record.truncated"] == 1 and len(written) == m["counters"]["cleaning.kept"]


def test_failing_batch_is_quarantined_with_its_ge_report_while_the_rest_builds(build):
    records = conversations(40, seed=3)  # one domain: batches follow file order
    # Mostly answers with little to train on: a batch-level fact (mean loss share) that only the suite sees.
    lopsided = [chat(" ".join(c["messages"][0]["content"] for c in conversations(3, seed=i)), "Restart the router now.")
                for i in range(100, 110)]
    records = records[:20] + lopsided + records[20:]
    result = build(records, batch_size=10, gate={"on_batch_failure": "quarantine", "min_loss_share": 0.12})
    m = result.manifest
    bad = [b for b in m["batches"] if b["status"] == "quarantined"]
    assert bad and len(bad) < len(m["batches"])
    assert {(f["expectation"], f["column"]) for f in bad[0]["failed"]} == {
        ("expect_column_mean_to_be_between", "loss_share")}
    report = json.loads((result.path / bad[0]["report"]).read_text())
    assert report["success"] is False and report["suite_name"] == "snapshot_batch@v2"
    quarantined = [json.loads(x) for x in (result.path / bad[0]["report"]).with_name("records.jsonl").read_text().splitlines()]
    assert len(quarantined) == bad[0]["records"] and all("excerpt" in q and "messages" not in q for q in quarantined)
    written = {m_["id"] for m_ in all_meta(result.path)}
    assert written.isdisjoint({q["record_id"] for q in quarantined})
    assert m["gate"]["quarantined"] == len(bad) and m["counters"]["gate.records_quarantined"] == sum(
        b["records"] for b in bad)


def test_failing_batch_with_fail_policy_stops_and_leaves_no_snapshot(build, mlops_home):
    with pytest.raises(GateError, match=r"failed expectation suite snapshot_batch@v2: .*loss_share"):
        build(good_records(12), batch_size=8, gate={"min_loss_share": 0.99})
    root = mlops_home / ".mlops" / "snapshots"
    assert list_snapshots() == []
    assert not [p for p in root.iterdir() if p.name.startswith(".staging")]
    kept = list((root / ".failed").iterdir())
    assert len(kept) == 1 and (kept[0] / "validation.json").exists()


def test_rebuild_is_a_noop_with_the_same_id(build):
    records = good_records(24)
    first = build(records)
    manifest_mtime = (first.path / "manifest.json").stat().st_mtime_ns
    second = build(records)
    assert second.noop and second.snapshot_id == first.snapshot_id
    assert (first.path / "manifest.json").stat().st_mtime_ns == manifest_mtime
    forced = build(records, force=True)  # really rebuilt: same bytes, same id
    assert not forced.noop and forced.snapshot_id == first.snapshot_id
    other = build(records, seed=99)
    assert other.snapshot_id != first.snapshot_id  # the split and the order depend on the seed


def test_resumed_reader_yields_the_same_samples_as_an_uninterrupted_read(build):
    result = build(good_records(30))
    full = SnapshotReader(result.path)
    n = len(full)
    stream = list(itertools.islice(full.global_order(seed=5), 2 * n + 3))
    for k in (0, 1, n - 1, n, n + 2, 2 * n):
        resumed = SnapshotReader(result.path).global_order(seed=5, start=k)
        for (g, i), (g2, i2) in zip(stream[k:], resumed, strict=False):
            assert (g, i) == (g2, i2)
            a, b = full.get(i), SnapshotReader(result.path).get(i2)
            assert a.sample_id == b.sample_id and np.array_equal(a.input_ids, b.input_ids)


def test_mixing_targets_and_achieved_ratios_are_recorded(build):
    records = [*conversations(30, 4, "general"), *conversations(30, 5, "safety"), *conversations(30, 6, "domain")]
    ratios = {"general": 0.5, "safety": 0.25, "domain": 0.25}
    m = build(records, mix={"ratios": ratios}).manifest
    mixing = m["mixing"]
    assert mixing["targets"] == {"domain": 0.25, "general": 0.5, "safety": 0.25}
    take = mixing["take"]
    assert take["general"] == 2 * take["safety"] and abs(take["domain"] - take["safety"]) <= 1
    assert all(abs(mixing["achieved"][d] - t) < 0.02 for d, t in mixing["targets"].items())
    assert m["counters"]["mix.not_selected.domain"] > 0


def test_incremental_build_mixes_history_and_drops_what_it_has_seen(build, tmp_path):
    old = build(good_records(40, seed=1), name="old.jsonl")
    new_records = good_records(30, seed=2) + good_records(40, seed=1)[:5]  # 5 already in the old snapshot
    result = build(new_records, name="new.jsonl", mix={"history": {"snapshot": old.snapshot_id, "ratio": 0.3}})
    m = result.manifest
    assert m["counters"]["dedup.exact_of_snapshot"] == 5
    history = m["mixing"]["history"]
    assert history["snapshot"] == old.snapshot_id and abs(history["achieved_ratio"] - 0.3) < 0.05
    sources = {meta["source"] for meta in SnapshotReader(result.path).iter_meta()}
    assert sources == {f"snapshot:{old.snapshot_id}", str(tmp_path / "new.jsonl")}
    with pytest.raises(EmptySnapshotError, match=r"kept 0 record.*\(top reasons: dedup.exact_of_snapshot 30\)"):
        build(good_records(30, seed=2), name="again.jsonl", dedup={"against_snapshots": [result.snapshot_id]})


def test_bad_input_fails_or_is_quarantined_by_policy(build, tmp_path):
    records = good_records(10) + ['{"messages": [', {"question": "?"}]
    with pytest.raises(BadInputError, match=r"records.jsonl, line 11: malformed JSON"):
        build(records)
    m = build(records, on_bad_record="skip").manifest
    assert m["counters"]["bad_input.malformed_json"] == 1 and m["counters"]["bad_input.unknown_shape"] == 1
    assert [(i["line"], i["code"]) for i in m["issues"]["listed"]] == [(11, "malformed_json"), (12, "unknown_shape")]


def test_under_skip_every_kind_of_bad_record_is_set_aside_alone(build, tmp_path):
    """Role order, schema, a template the tokenizer cannot render: each costs its own record, and no raw text of
    any of them reaches the manifest or the quarantine."""
    records = good_records(24)
    records += [
        {"messages": [{"role": "assistant", "content": "Hello jane.doe@example.com, how can I help you today?"},
                      {"role": "user", "content": "My router is broken again since Monday night."}]},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "assistant", "content": "Call me on +1 415 555 0132 about the router, please."}]},
        {"text": {"body": "jane.doe@example.com"}},
        {"messages": [{"role": "user", "content": "What is my plan called, jane.doe@example.com asks?"}]},
        chat("Why was I charged twice for the March invoice on my fiber plan?", "Yes."),
    ]
    result = build(records, on_bad_record="skip")
    m = result.manifest
    c = m["counters"]
    assert c["bad_input.role_order"] == 2 and c["bad_input.wrong_type"] == 1
    assert c["filter.no_assistant_turn"] == 1 and c["filter.short_answer"] == 1
    assert c["cleaning.kept"] == 24 and sum(m["counts"]["samples"].values()) == 24
    everything = json.dumps(m) + "".join(p.read_text() for p in (result.path / "quarantine").glob("*.jsonl"))
    assert "jane.doe" not in everything and "555 0132" not in everything


def test_a_build_that_keeps_nothing_fails_and_publishes_nothing(build, mlops_home):
    junk = [chat("Why was I charged twice this month on my fiber plan?", "Ok") for _ in range(5)]
    with pytest.raises(EmptySnapshotError, match=r"kept 0 record\(s\) after cleaning.*from 5 row.*filter.short_answer 5"):
        build(junk)
    with pytest.raises(EmptySnapshotError, match="fewer than data.min_records=50"):
        build(good_records(20), min_records=50)
    root = mlops_home / ".mlops" / "snapshots"
    assert list_snapshots() == [] and not [p for p in root.iterdir() if p.name.startswith(".staging")]


def test_force_replaces_a_published_snapshot_that_fails_verification(build):
    first = build(good_records(16))
    shard = first.path / "train" / "shard-00000.input_ids.npy"
    shard.write_bytes(b"tampered")
    with pytest.raises(MLOpsError, match=rf"mlops data rebuild {first.snapshot_id}"):
        verify_snapshot(first.snapshot_id)
    assert build(good_records(16)).noop  # without --force: the recorded build is trusted
    forced = build(good_records(16), force=True)
    assert forced.snapshot_id == first.snapshot_id and not forced.noop
    assert verify_snapshot(first.snapshot_id)["ok"]


def test_a_build_that_dies_half_way_leaves_nothing_that_looks_complete(build, mlops_home, monkeypatch):
    from mlops.data import batches

    def crash(self):
        raise RuntimeError("killed while writing shards")

    with monkeypatch.context() as patch:  # undone on leaving; MLOPS_HOME (the mlops_home fixture's) stays
        patch.setattr(batches.BatchWriter, "close", crash)
        with pytest.raises(RuntimeError, match="killed"):
            build(good_records(12))
    root = mlops_home / ".mlops" / "snapshots"
    assert list_snapshots() == [] and not [p for p in root.iterdir() if p.name.startswith(".staging")]
    result = build(good_records(12))  # the next build is not fooled by the crash
    assert result.path.parent == root
    assert not result.noop and read_manifest(result.path)["complete"]


@pytest.mark.slow
def test_workers_and_index_location_do_not_change_the_snapshot(build):
    records = good_records(60)
    one = build(records, workers=1)
    two = build(records, workers=2, force=True)
    in_memory = build(records, workers=2, dedup={"index": "memory"}, force=True)
    assert one.snapshot_id == two.snapshot_id == in_memory.snapshot_id


def test_the_driver_reads_no_record_its_workers_mix_check_and_write_every_batch(build, monkeypatch):
    import os

    from mlops.data import batchtasks, checks, clean, format

    driver = os.getpid()
    hash_on_driver = format.file_sha256

    def hash_no_shard(path):  # the workers hash the shards they wrote; the driver hashes the rest
        shard = path.parent.name in format.SPLITS and path.name != format.INDEX
        assert os.getpid() != driver or not shard, f"the driver hashed {path}"
        return hash_on_driver(path)

    def only_on_workers(fn):
        def guarded(*args, **kwargs):
            assert os.getpid() != driver, f"the driver ran {fn.__name__}"
            return fn(*args, **kwargs)
        return guarded

    records = good_records(60)
    with monkeypatch.context() as patch:
        for module, name in ((clean, "parse_spill"), (batchtasks, "check_batch"), (checks, "check_record")):
            patch.setattr(module, name, only_on_workers(getattr(module, name)))
        patch.setattr(format, "file_sha256", hash_no_shard)
        built = build(records, workers=2, batch_size=8, shard_size=16)  # several groups and shards per split
    assert verify_snapshot(built.snapshot_id)["ok"]  # the workers' digests are the files' own
    index = json.loads((built.path / "train" / "index.json").read_text())
    assert len(index["shards"]) > 2 and index["count"] == sum(s["count"] for s in index["shards"])
    assert built.manifest["counts"]["samples"]["train"] == index["count"]
    assert build(records, workers=1, batch_size=8, shard_size=16, force=True).snapshot_id == built.snapshot_id


def test_packing_puts_several_records_in_one_sequence(build):
    records = good_records(30)
    padded = build(records)
    packed = build(records, pack=True, seq_len=512)
    n_padded = sum(padded.manifest["counts"]["samples"].values())
    n_packed = sum(packed.manifest["counts"]["samples"].values())
    assert n_packed < n_padded / 2
    reader = SnapshotReader(packed.path)
    metas = list(reader.iter_meta())
    assert sum(len(m["records"]) for m in metas) == packed.manifest["counts"]["per_split"]["train"]["records"]
    sample = reader.get(0)
    assert sample.attention_mask.sum() <= 512 and 0 < sample.loss_mask.sum() < sample.attention_mask.sum()
    tokens = packed.manifest["counts"]["per_split"]["train"]["loss_tokens"]
    assert sum(int(reader.get(i).loss_mask.sum()) for i in range(len(reader))) == tokens


def test_a_record_that_breaks_a_step_costs_only_itself(build, monkeypatch):
    from mlops.data import filters

    real = filters.markup_ratio

    def fragile(text):
        if "trigger-the-bug" in text:
            raise RecursionError("maximum recursion depth exceeded")
        return real(text)

    monkeypatch.setattr(filters, "markup_ratio", fragile)
    records = good_records(20) + [chat("Please look at trigger-the-bug in my account, it fails again.",
                                       "We looked at it and fixed the account settings for you today.")]
    m = build(records).manifest
    assert m["counters"]["error.RecursionError"] == 1 and m["counters"]["cleaning.kept"] == 20
