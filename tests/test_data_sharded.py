"""The sharded data build: partitions read on the workers, LSH sharded by band, clusters resolved by the smallest
key, so every executor and worker count gives one snapshot, and cross-partition and history duplicates are
still dropped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mlops.data import lsh, lshtasks, partitions
from mlops.data.dedup import exact_hash, signature
from mlops.data.lsh import dedup_texts
from mlops.data.partitions import plan_partitions, read_partition
from mlops.data.records import read_source
from mlops.data.testing import BASE, DIFFERENT, SIMILAR


def test_dedup_texts_keeps_the_first_text_of_each_cluster_and_names_it():
    texts = [DIFFERENT, BASE, SIMILAR, BASE.upper() + "!!", DIFFERENT + " Thanks."]
    got = dedup_texts(texts)
    assert [d.kept for d in got] == [True, True, False, False, False]
    assert (got[2].reason, got[2].duplicate_of) == ("near", 1) and 0.7 <= got[2].similarity < 1
    assert (got[3].reason, got[3].duplicate_of, got[3].similarity) == ("exact", 1, 1.0)
    assert (got[4].reason, got[4].duplicate_of) == ("near", 0)
    assert [d.kept for d in dedup_texts(texts, near=False)] == [True, True, True, False, True]


def test_clusters_keep_their_smallest_key_whatever_the_edge_order():
    low, high = np.array([5, 2, 9, 1]), np.array([7, 7, 11, 3])
    roots = lsh.components(low, high)
    assert roots == {3: 1, 5: 2, 7: 2, 11: 9}  # the kept keys 1, 2, 9 are nobody's duplicates
    assert lsh.components(low[::-1].copy(), high[::-1].copy()) == roots


def test_partitions_read_the_same_records_and_issues_as_the_whole_file(tmp_path):
    path = tmp_path / "chats.jsonl"
    rows = [json.dumps({"messages": [{"role": "user", "content": f"question {i} " * 8},
                                     {"role": "assistant", "content": f"answer {i}"}]}).encode() for i in range(60)]
    rows[7] = b'{"messages": ['  # malformed
    rows[20] = b""  # blank lines are skipped, but counted
    rows[33] = '{"text": "caf\u00e9 \xff"}'.encode("latin-1")  # not UTF-8
    rows[41] = b'{"question": "?"}'  # unknown shape
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(rows) + b"\n")
    from mlops.data.format import file_sha256

    src = {"name": "chats.jsonl", "path": path, "format": "jsonl", "domain": "general",
           "sha256": file_sha256(path)}
    parts = plan_partitions([src], part_bytes=700)
    assert len(parts) > 5 and parts[0].first_line == 1
    pieces = [item for part in parts for item in read_partition(part)]
    assert pieces == list(read_source(path, "chats.jsonl", "jsonl", "general", src["sha256"]))
    assert plan_partitions([src]) == [partitions.Partition(0, src)]  # small files stay whole


def _segment(folder: Path, texts: list[str], base: int, bands: int, rows: int) -> lshtasks.Segment:
    folder.mkdir(parents=True)
    sigs = np.stack([signature(t, 128, 3) for t in texts])
    np.save(folder / "exact.npy", np.asarray([exact_hash(t) for t in texts], dtype="<u8"))
    np.save(folder / "ids.npy", np.arange(base, base + len(texts), dtype="<u8"))
    np.save(folder / "sigs.npy", sigs)
    np.save(folder / "bands.npy", lsh.band_hashes(sigs, bands, rows))
    return lshtasks.partition_segment(base, len(texts), folder, near=True)


def test_band_tasks_split_by_hash_range_find_the_edges_of_one_task(tmp_path, monkeypatch):
    bands, rows = lsh.lsh_params(0.7, 128)
    texts = [BASE, DIFFERENT, SIMILAR, f"{DIFFERENT} Thanks.", "Where is my parcel, it was due on Friday?"]
    segments = [_segment(tmp_path / "a", texts[:2], 0, bands, rows), _segment(tmp_path / "b", texts[2:], 2, bands, rows)]

    def edges(name: str) -> set:
        work = tmp_path / name
        work.mkdir()
        found = set()
        for task in lshtasks.plan_dedup(segments, work, True, True, bands, rows, 0.7):
            lshtasks.band_task(task)
            found |= {tuple(e) for e in np.load(task["out"]).T.tolist()}
        return found

    whole = edges("whole")
    monkeypatch.setattr(lshtasks, "SHARD_RECORDS", 2)  # 5 keys -> 3 hash ranges per band
    assert whole == edges("sharded") == {(0, 2), (1, 3)}


# ----------------------------------------------------------------- whole builds (slow: five real builds)

SMALL_PARTS = 16384  # ~40 sample chats per partition


def _near(row: dict) -> dict:
    """A light edit (Jaccard well above 0.7): an appended sign-off."""
    if "text" in row:
        return {**row, "text": row["text"] + " Cheers, and take care."}
    messages = [dict(m) for m in row["messages"]]
    messages[-1]["content"] += " Cheers, and take care."
    return {**row, "messages": messages}


@pytest.fixture(scope="module")
def sample_sources(tmp_path_factory):
    """The sample corpus (its support chats cut to 700 rows to stay quick; planted duplicates and bad rows
    included), a history snapshot of its help-centre articles, and a source of planted copies: near copies of
    early support chats (other partitions than their originals) and of history articles."""
    from mlops.data.sample import generate
    from mlops.data.testing import write_jsonl

    folder = tmp_path_factory.mktemp("sharded")
    generate(folder / "sample", scale=1)
    chats_path = folder / "sample" / "support_chats.jsonl"
    chats = chats_path.read_bytes().split(b"\n")[:700]
    chats_path.write_bytes(b"\n".join(chats) + b"\n")
    articles = [json.loads(x) for x in (folder / "sample" / "kb_articles.jsonl").read_text().splitlines()]
    rows = [json.loads(x) for x in chats[:60] if x.startswith(b'{"messages"')]
    # Long enough that the sign-off keeps the Jaccard above 0.7 (a ten-word chat plus four words would not be).
    originals = [r for r in rows if len(" ".join(m["content"] for m in r["messages"]).split()) >= 40][:4]
    planted = write_jsonl(folder / "planted.jsonl", [_near(r) for r in originals] + [_near(a) for a in articles[:3]])
    sources = [chats_path, folder / "sample" / "instructions.parquet", folder / "sample" / "legacy_export.csv",
               folder / "sample" / "kb_articles.jsonl", planted]
    return folder, sources, originals, articles


def _build(tiny_model, folder: Path, sources: list[Path], out: str, **data):
    from mlops.data.build import build_snapshot
    from mlops.data.testing import quick_config
    from mlops.tracking import MemoryTracker

    data.setdefault("on_bad_record", "skip")
    for sid in data.get("dedup", {}).get("against_snapshots", []):  # each build's own root holds the history
        if not (folder / out / sid).exists():
            shutil.copytree(folder / "snapshots" / sid, folder / out / sid)
    cfg = quick_config(sources, tiny_model["path"], output_dir=str(folder / out), **data)
    return build_snapshot(cfg, MemoryTracker())


@pytest.mark.slow
def test_local_builds_at_one_two_three_workers_and_ray_give_one_snapshot_with_every_duplicate_found(
        sample_sources, tiny_model, monkeypatch, mlops_home):
    from mlops.data.records import record_id

    folder, sources, originals, articles = sample_sources
    history = _build(tiny_model, folder, [sources[3]], "snapshots")
    against = {"against_snapshots": [history.snapshot_id]}
    whole = _build(tiny_model, folder, sources, "snapshots", workers=1, dedup=against)  # one partition per file
    monkeypatch.setattr(partitions, "PARTITION_BYTES", SMALL_PARTS)
    from mlops.data.format import file_sha256

    chats = {"name": "chats", "path": sources[0], "format": "jsonl", "sha256": file_sha256(sources[0])}
    assert len(plan_partitions([chats])) >= 4  # the chats are cut into several partitions
    results = [whole] + [_build(tiny_model, folder, sources, f"w{w}", workers=w, dedup=against) for w in (2, 3)]
    results.append(_build(tiny_model, folder, sources, "ray", executor="ray", workers=2, dedup=against))
    assert len({r.snapshot_id for r in results}) == 1
    assert len({json.dumps(r.manifest["counters"], sort_keys=True) for r in results}) == 1

    dropped = {}
    for line in (whole.path / "quarantine" / "records.jsonl").read_text().splitlines():
        row = json.loads(line)
        dropped.setdefault(row["source"], {})[row["line"]] = row
    planted = dropped[str(sources[4])]
    set_aside = {row["record_id"] for rows in dropped.values() for row in rows.values()}
    kept = [(line, record_id("chat", o["messages"])) for line, o in enumerate(originals, start=1)]
    kept = [(line, rid) for line, rid in kept if rid not in set_aside]
    assert len(kept) >= 3
    for line, rid in kept:  # near copies in another source, so in other partitions: dropped naming the original
        assert (planted[line]["reason"], planted[line]["duplicate_of"]) == ("near", rid)
    for line in range(len(originals) + 1, len(originals) + 4):  # near copies of history articles
        assert planted[line]["reason"] == "near_of_snapshot"
        assert planted[line]["duplicate_of"].startswith(history.snapshot_id + "#")
    kb = dropped[str(sources[3])]  # the history's own articles: exact duplicates of what it kept
    assert len([r for r in kb.values() if r["reason"] == "exact_of_snapshot"]) == history.manifest["counters"][
        "cleaning.kept"]
    assert whole.manifest["counters"]["dedup.near"] >= len(originals) + 1  # the sample's own near copies too
