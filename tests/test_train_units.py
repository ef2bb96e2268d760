"""Fast checks without DeepSpeed: config validation, bad input before compute, data order, checkpoints on disk,
guards and the cost model."""

from __future__ import annotations

import pytest

from mlops.config import load_config
from mlops.errors import ConfigError, MLOpsError
from training.checkpoint import MANIFEST, atomic_json, file_table, retention, select_resume, tag_for, verify
from training.guards import SpikeRule, check_finite
from training.testing import make_snapshot, tiny_overrides


@pytest.fixture
def snapshot(mlops_home):
    return make_snapshot()


def cfg_for(snapshot, tiny_model, tmp_path, **extra):
    extra.setdefault("train.checkpoint.dir", str(tmp_path / "ckpt"))
    return load_config(None, tiny_overrides(snapshot, base_model=tiny_model["path"], **extra))


def fake_checkpoint(root, step, *, complete=True, **fields):
    folder = root / tag_for(step)
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(bytes([step % 256]) * 100)
    if complete:
        manifest = {"step": step, "world_size": 1, "zero_stage": 0, "data": {"position": 4 * step},
                    "files": file_table(folder), "complete": True, **fields}
        atomic_json(folder / MANIFEST, manifest)
    return folder


def test_global_batch_that_does_not_divide_is_rejected_naming_the_field(snapshot, tiny_model, tmp_path):
    cfg = cfg_for(snapshot, tiny_model, tmp_path, **{"train.global_batch_size": 6})
    with pytest.raises(ConfigError, match=r"train.global_batch_size=6 .* multiple of 4"):
        cfg.train.batch_layout(2)
    assert cfg.train.batch_layout(1) == (2, 3, 6)


def test_unknown_or_corrupt_snapshot_fails_before_compute(snapshot, tiny_model, tmp_path, mlops_home):
    from training.prepare import prepare

    with pytest.raises(MLOpsError, match="unknown data snapshot 'snap-nope'"):
        prepare(cfg_for("snap-nope", tiny_model, tmp_path))
    shard = next((mlops_home / ".mlops" / "snapshots" / snapshot / "train").glob("*.input_ids.npy"))
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x07")
    with pytest.raises(MLOpsError, match="failed verification"):
        prepare(cfg_for(snapshot, tiny_model, tmp_path))


def test_latest_resolves_to_the_newest_snapshot(snapshot, tiny_model, tmp_path):
    from training.prepare import prepare

    prep = prepare(cfg_for("latest", tiny_model, tmp_path))
    assert prep.snapshot_id == snapshot and prep.cfg.train.snapshot == snapshot


def test_world_size_mismatch_needs_universal_conversion(snapshot, tiny_model, tmp_path):
    from training.prepare import prepare

    cfg = cfg_for(snapshot, tiny_model, tmp_path, **{"train.zero_stage": 2, "train.global_batch_size": 8})
    fake_checkpoint(tmp_path / "ckpt", 2, world_size=2, zero_stage=2, snapshot_id=snapshot)
    with pytest.raises(ConfigError, match="written by 2 processes under ZeRO-2, and this run has 1"):
        prepare(cfg)
    cfg.train.checkpoint.universal = True
    assert prepare(cfg).universal


def test_disk_too_small_for_k_checkpoints_is_refused(snapshot, tiny_model, tmp_path, monkeypatch):
    import shutil

    from training.prepare import prepare

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(MLOpsError, match="train.checkpoint.keep_last"):
        prepare(cfg_for(snapshot, tiny_model, tmp_path))


def test_resume_picks_newest_verified_and_sets_corrupt_aside(tmp_path):
    root = tmp_path / "c"
    fake_checkpoint(root, 2)
    good = fake_checkpoint(root, 4)
    bad = fake_checkpoint(root, 6)
    fake_checkpoint(root, 8, complete=False)  # killed mid-save
    (bad / "mp_rank_00_model_states.pt").write_bytes(b"\x00" * 100)
    warnings = []
    folder, manifest = select_resume(root, warn=warnings.append)
    assert folder == good and manifest["step"] == 4
    assert "sha256" in warnings[0] and not (bad / MANIFEST).exists()
    assert verify(good) == (True, "")


def test_retention_keeps_last_k_and_every_nth_and_drops_incomplete(tmp_path):
    root = tmp_path / "c"
    for step in (2, 4, 6, 8, 10):
        fake_checkpoint(root, step)
    fake_checkpoint(root, 7, complete=False)
    retention(root, keep_last=2, keep_every=4)
    assert sorted(p.name for p in root.iterdir()) == [tag_for(4), tag_for(8), tag_for(10)]


def test_rank_batches_split_steps_without_overlap_and_resume_anywhere(snapshot, mlops_home):
    from mlops.data.format import SnapshotReader
    from mlops.data.snapshot import resolve_snapshot
    from training.data_loader import RankBatches

    reader = SnapshotReader(resolve_snapshot(snapshot))
    whole = RankBatches(reader, seed=3, micro=2, accum=2, world=1, rank=0)
    single = [whole.next_step(all_ids=True).step_sample_ids for _ in range(20)]  # > 1 epoch of 64
    ranks = [RankBatches(reader, seed=3, micro=1, accum=2, world=2, rank=r) for r in (0, 1)]
    for step in range(3):
        parts = [b.next_step(all_ids=True) for b in ranks]
        assert parts[0].step_sample_ids == single[step]
        mine = [i for p in parts for mb in p.micro for i in mb.sample_ids]
        assert sorted(mine) == sorted(single[step])
    resumed = RankBatches(reader, seed=3, micro=2, accum=2, world=1, rank=0, start=4 * 15)
    assert resumed.next_step(all_ids=True).step_sample_ids == single[15]
    epoch = [s for step in single[:16] for s in step]
    assert len(set(epoch)) == 64


def test_guards_reject_non_finite_and_spikes():
    assert check_finite(1.0, float("nan"))[0] is False
    assert "loss" in check_finite(float("inf"), 1.0)[1]
    rule = SpikeRule(5.0, window=10, warmup=3)
    for value in (1.0, 1.2, 0.9, 1.1):
        assert rule.check(value)[0]
        rule.accept(value)
    ok, reason = rule.check(8.0)
    assert not ok and "spike_factor" in reason


def test_lora_flops_count_frozen_weights_at_four_and_trainable_at_six(tiny_model):
    from training.engine import build_model
    from training.metrics import count_params, flops_per_token

    cfg = load_config(None, ["train.mode=lora"]).train
    counts = count_params(build_model(tiny_model["path"], cfg, 0))
    assert 0 < counts.trainable < counts.total and counts.matmul_frozen > counts.matmul_trainable
    per_token = flops_per_token(counts, layers=2, hidden=64, seq_len=32)
    assert per_token == 6 * counts.matmul_trainable + 4 * counts.matmul_frozen + 12 * 2 * 64 * (32 + 1) / 2


def test_nproc_from_mlflow_arrives_as_float_text():
    from training.cli import _flag, _nproc

    assert _nproc("2.0") == 2 and _flag("True", "smoke") is True
    with pytest.raises(ConfigError, match="whole number"):
        _nproc("1.5")


def test_batches_are_cut_to_their_longest_sample_with_labels_only_on_the_loss_mask():
    import numpy as np

    from mlops.data.format import Sample
    from training.data_loader import to_tensors

    def sample(ids, attn, loss, name):
        return Sample(np.array(ids, np.int32), np.array(attn, np.uint8), np.array(loss, np.uint8), name)

    a = sample([5, 6, 7, 0, 0, 0], [1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0], "a")
    b = sample([8, 9, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], "b")
    mb = to_tensors([a, b])
    assert tuple(mb.input_ids.shape) == (2, 3) and mb.sample_ids == ["a", "b"]
    assert mb.labels.tolist() == [[-100, 6, 7], [-100, -100, -100]]
    assert mb.tokens == 5 and mb.loss_tokens == 2
    assert tuple(to_tensors([a], max_len=2).input_ids.shape) == (1, 2)


def test_launcher_commands_run_the_worker_module_under_torchrun_or_deepspeed():
    from training.launch import launcher_command

    torchrun = launcher_command("torchrun", 2, 29500, None)
    assert torchrun[1:3] == ["-m", "torch.distributed.run"] and torchrun[-1] == "-m" and "2" in torchrun
    ds = launcher_command("deepspeed", 2, 29500, None)
    assert ds[-1] == "--module" and "--no_local_rank" in ds and ds[ds.index("--num_gpus") + 1] == "2"
    nodes = launcher_command("deepspeed", 2, 29500, "/etc/hosts.ds")
    assert nodes[nodes.index("--hostfile") + 1] == "/etc/hosts.ds" and "--num_gpus" not in nodes
