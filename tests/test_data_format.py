"""The snapshot on-disk format: writer, reader, resume, lookup and verification."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlops.data.format import SnapshotReader, write_snapshot
from mlops.data.snapshot import list_snapshots, resolve_snapshot, verify_snapshot
from mlops.errors import MLOpsError, NotFoundError


def _samples(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(3, 16))
        ids = rng.integers(3, 1000, size=length).tolist()
        mask = [0] * (length // 2) + [1] * (length - length // 2)
        out.append((ids, mask))
    return out


def test_written_snapshot_reads_back_every_sample(mlops_home):
    train = _samples(23)
    folder = write_snapshot({"train": train, "validation": _samples(4, 1)}, seq_len=16, pad_id=2, shard_size=5)
    assert resolve_snapshot(folder.name) == folder
    reader = SnapshotReader(folder, "train")
    assert len(reader) == 23 and reader.seq_len == 16
    assert len(reader.manifest["files"]) > 0 and len(reader._shards) == 5
    for i, (ids, mask) in enumerate(train):
        sample = reader.get(i)
        n = len(ids)
        assert sample.input_ids.dtype == np.int32 and sample.loss_mask.dtype == np.uint8
        assert sample.input_ids[:n].tolist() == ids and set(sample.input_ids[n:].tolist()) <= {2}
        assert sample.attention_mask.tolist() == [1] * n + [0] * (16 - n)
        assert sample.loss_mask.tolist() == mask + [0] * (16 - n)
        assert sample.sample_id == f"train-{i}"
    assert len(SnapshotReader(folder, "validation")) == 4


def test_same_content_gives_same_id_and_rewrite_is_noop(mlops_home):
    first = write_snapshot({"train": _samples(10)}, seq_len=16)
    mtime = (first / "manifest.json").stat().st_mtime_ns
    second = write_snapshot({"train": _samples(10)}, seq_len=16)
    assert first == second and (second / "manifest.json").stat().st_mtime_ns == mtime
    third = write_snapshot({"train": _samples(10, seed=5)}, seq_len=16)
    assert third.name != first.name
    assert {m["snapshot_id"] for m in list_snapshots()} == {first.name, third.name}


def test_resumed_reader_yields_exactly_the_uninterrupted_tail(mlops_home):
    folder = write_snapshot({"train": _samples(7)}, seq_len=16, shard_size=3)
    full = SnapshotReader(folder)
    uninterrupted = [(g, full.get(i).sample_id) for g, i in itertools.islice(full.global_order(seed=42), 30)]
    for k in (0, 1, 6, 7, 13, 29):
        fresh = SnapshotReader(folder)  # a new process would start with nothing cached
        resumed = [(g, fresh.get(i).sample_id) for g, i in itertools.islice(fresh.global_order(42, start=k), 30 - k)]
        assert resumed == uninterrupted[k:]
    epoch0 = sorted(i for _, i in itertools.islice(full.global_order(42), 7))
    assert epoch0 == list(range(7))  # every epoch is a permutation
    orders = [[i for _, i in itertools.islice(full.global_order(42, start=7 * e), 7)] for e in range(3)]
    assert orders[0] != orders[1] or orders[1] != orders[2]  # epochs reshuffle
    other = [i for _, i in itertools.islice(full.global_order(43), 7)]
    assert other != orders[0] or len(full) < 3


def test_unknown_id_suggests_close_match(mlops_home):
    folder = write_snapshot({"train": _samples(3)}, seq_len=16)
    typo = folder.name[:-1] + ("0" if folder.name[-1] != "0" else "1")
    with pytest.raises(NotFoundError, match=f"did you mean '{folder.name}'"):
        resolve_snapshot(typo)
    assert resolve_snapshot(folder.name[:10]) == folder  # unique prefix


def test_folder_without_complete_manifest_is_not_a_snapshot(mlops_home):
    folder = write_snapshot({"train": _samples(3)}, seq_len=16)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["complete"] = False
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(NotFoundError, match="no complete manifest"):
        resolve_snapshot(folder.name)
    with pytest.raises(MLOpsError, match="not a complete snapshot"):
        SnapshotReader(folder)


def test_verify_names_the_changed_shard(mlops_home):
    folder = write_snapshot({"train": _samples(6)}, seq_len=16, shard_size=3)
    assert verify_snapshot(folder.name)["ok"]
    shard = folder / "train" / "shard-00001.loss_mask.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(MLOpsError, match="shard-00001.loss_mask.npy' changed"):
        verify_snapshot(folder.name)
    (folder / "train" / "extra.txt").write_text("x")
    with pytest.raises(MLOpsError, match="extra.txt' is not in the manifest"):
        verify_snapshot(folder)


def test_overlong_sample_is_refused(mlops_home):
    with pytest.raises(MLOpsError, match="17 tokens"):
        write_snapshot({"train": [list(range(17))]}, seq_len=16)
    assert list_snapshots() == []
    assert not [p for p in (mlops_home / ".mlops" / "snapshots").iterdir()]  # staging cleaned up


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), seed=st.integers(0, 2**32 - 1), start=st.integers(0, 60))
def test_any_resume_point_matches_the_uninterrupted_order(n, seed, start):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_snapshot({"train": [[i + 3] for i in range(n)]}, seq_len=4, root=Path(tmp), shard_size=5)
        reader = SnapshotReader(folder)
        whole = list(itertools.islice(reader.global_order(seed), start + 2 * n))
        resumed = list(itertools.islice(SnapshotReader(folder).global_order(seed, start=start), 2 * n))
        assert resumed == whole[start:]
        for epoch in range((start + 2 * n) // n):
            assert sorted(i for _, i in whole[epoch * n : (epoch + 1) * n]) == list(range(n))
