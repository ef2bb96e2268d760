"""Everything a run checks before it spends compute: snapshot, batch layout, base model, the checkpoint folder's
lock (one writer), the checkpoint to resume and what the resume may change, world size against that checkpoint,
disk room for K checkpoints, and the lineage it will carry."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from mlops.errors import ConfigError, MLOpsError
from training.config import ADAPTER_MODES, RESUME_NONE
from training.results import FINAL

log = logging.getLogger(__name__)
SMOKE_DIR = "smoke"


@dataclass
class Prepared:
    cfg: object  # the root config, with train.snapshot resolved to a concrete id
    snapshot_id: str
    snapshot_dir: Path
    base: dict  # {"name", "id", "path"}
    world_size: int
    micro: int
    accum: int
    global_batch: int
    ckpt_dir: Path
    config_hash: str
    lineage: object  # mlops.lineage.Lineage
    resume_from: Path | None = None
    resume_manifest: dict = field(default_factory=dict)
    universal: bool = False
    completed: dict | None = None  # final.json of a finished run of this exact config
    smoke: bool = False
    changes: dict = field(default_factory=dict)  # {dotted key: (checkpoint's value, this run's)} on a resume
    lock: object | None = None  # training.lock.TrainLock, held from here until the run ends
    precision: str = "fp32"  # train.precision resolved for this machine's device
    suites: list = field(default_factory=list)  # train.eval.suites, loaded (evaluation.suites.Suite)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    @property
    def train(self):
        return self.cfg.train


def apply_smoke(cfg) -> None:
    """A smoke run: a few dozen steps, own checkpoints (a `smoke/` folder), no final model."""
    t = cfg.train
    t.max_steps = t.smoke.steps
    t.warmup_steps = min(t.warmup_steps, max(1, t.smoke.steps // 5))
    t.checkpoint.resume = "never"
    t.final_model = False


def default_ckpt_dir(config_hash: str) -> Path:
    from mlops.paths import checkpoints_dir

    return checkpoints_dir() / config_hash[:16]


def data_run_of(snapshot_id: str) -> str | None:
    """The data run that built a snapshot (its manifest and GE results are that run's artifacts)."""
    from mlops.lineage import Tag
    from mlops.run_store import latest_run

    return latest_run({Tag.SNAPSHOT_ID: snapshot_id, Tag.STAGE: "data"})


def prepare(cfg, world_size: int = 1, *, smoke: bool = False, verify_inputs: bool = True,
            lock: bool = True, ckpt_dir: Path | None = None) -> Prepared:
    """Every check before compute. `verify_inputs=False` skips re-hashing the snapshot and `lock=False` skips
    the folder lock (workers of a multi-process run, whose launcher did both, holds the lock and passes the
    folder it chose as `ckpt_dir`)."""
    from mlops.base_models import ensure_base_model
    from mlops.config import config_hash, require_section
    from mlops.lineage import Tag, collect_lineage, enforce_release
    from training.data_loader import open_snapshot, resolve_snapshot_id

    t = require_section(cfg, "train")
    t.snapshot = resolve_snapshot_id(t.snapshot)  # hash the concrete id, never "latest"
    vetted = config_hash(cfg)  # the real run's hash: a smoke run of it records this one (training.smoke_rule)
    if smoke:
        apply_smoke(cfg)
    micro, accum, global_batch = t.batch_layout(world_size)
    digest = config_hash(cfg)
    early = collect_lineage(digest, cfg.run.seed, base_model=cfg.base_model, snapshot_id=t.snapshot)
    enforce_release(early, cfg.run.release)
    snapshot_dir, manifest = open_snapshot(t.snapshot, verify=verify_inputs)
    _check_seq_len(manifest, snapshot_dir)
    from training.pairs import check_record_type

    check_record_type(manifest, t.objective, t.snapshot)  # pairs to DPO, chats to SFT: refused before compute
    from training.inrun_eval import check_suites

    suites = check_suites(t.eval, t.select.metric)
    base = ensure_base_model(cfg.base_model)
    if lock:  # the launcher (or the only process) checks; its workers trust it
        from training.consistency import check_tokenizer

        check_tokenizer(manifest, t.snapshot, base)
    precision, verdict = _check_plan(cfg, world_size, base["path"], checked=lock)
    smoke_tags = {}
    if lock:  # the launcher (or the only process) decides; its workers trust it
        from training.smoke_rule import smoke_tags as rule

        smoke_tags = rule(cfg, world_size, base["path"], vetted, smoke=smoke)
    lineage = collect_lineage(
        digest, cfg.run.seed, base_model=base["name"], base_model_id=base["id"], snapshot_id=t.snapshot,
        extra={Tag.STAGE: "train", Tag.WORLD_SIZE: world_size, Tag.ZERO_STAGE: t.zero_stage,
               **({Tag.DATA_RUN: data_run} if (data_run := data_run_of(t.snapshot)) else {}),
               Tag.PRECISION: precision, **({Tag.PLAN_VERDICT: verdict} if verdict else {}),
               Tag.TRAIN_MODE: t.mode, Tag.TRAIN_OBJECTIVE: t.objective, Tag.SMOKE: str(smoke).lower(),
               Tag.RELEASE: str(cfg.run.release).lower(),
               **smoke_tags},
    )
    prep = Prepared(cfg, t.snapshot, snapshot_dir, base, world_size, micro, accum, global_batch,
                    ckpt_dir or _ckpt_dir(t, digest, smoke), digest, lineage, smoke=smoke, precision=precision,
                    suites=suites)
    if lock:
        from training.lock import TrainLock

        prep.lock = TrainLock(prep.ckpt_dir).acquire()
    try:
        _under_lock(prep, lock)
    except BaseException:
        prep.release()
        raise
    return prep


def _check_plan(cfg, world_size: int, base_path: str, *, checked: bool) -> tuple[str, str | None]:
    """(precision, plan verdict tag): the precision for this machine's device, refused before any folder or run
    exists when the device cannot run it; and the memory plan, refused when it does not fit (unless
    train.allow_unfit). Workers of a multi-process run (`checked=False`) trust their launcher's verdict."""
    from training import hardware
    from training.consistency import check_mode_on_device
    from training.planner import refuse_unfit, resolve_precision

    local = hardware.local(measure=False)
    precision = resolve_precision(cfg.train.precision, local)
    check_mode_on_device(cfg.train, precision, "cuda" if local.gpu else "cpu")
    if not checked:
        return precision, None
    plan = refuse_unfit(cfg, world_size, base_path)
    if plan["fits"]:
        return precision, "fits"
    gib = 2**30
    return precision, (f"does not fit (run with train.allow_unfit=true): {plan['memory_total_bytes'] / gib:.1f} GiB "
                       f"per rank planned, {plan['memory_limit_bytes'] / gib:.1f} GiB usable")


def _ckpt_dir(t, digest: str, smoke: bool) -> Path:
    resume = t.checkpoint.resume
    if resume not in ("auto", *RESUME_NONE):
        return Path(resume).expanduser().resolve().parent  # the folder of the named checkpoint
    folder = Path(t.checkpoint.dir).expanduser().resolve() if t.checkpoint.dir else default_ckpt_dir(digest)
    # Smoke runs keep their own folder even under an explicit train.checkpoint.dir: a real run must never
    # resume from (or continue the MLflow run of) a 30-step smoke check.
    return folder / SMOKE_DIR if smoke else folder


def _under_lock(prep: Prepared, holder: bool) -> None:
    from training.checkpoint import remove_partials

    t = prep.train
    final = prep.ckpt_dir / FINAL
    if t.checkpoint.resume == "auto" and final.is_file():
        done = json.loads(final.read_text())
        if done.get("config_hash", prep.config_hash) == prep.config_hash:
            prep.completed = done
            return
        # The same folder with changed settings (a larger max_steps, say): continue from its last checkpoint.
    if holder:
        remove_partials(prep.ckpt_dir)
    _pick_resume(prep)
    _check_disk(prep)


def _check_seq_len(manifest: dict, folder: Path) -> None:
    if not manifest.get("seq_len"):
        raise MLOpsError(f"snapshot {folder} has no seq_len in its manifest. Fix: rebuild it with `mlops data build`.")


def _pick_resume(prep: Prepared) -> None:
    from training import resume
    from training.checkpoint import CorruptCheckpoints, read_manifest, select_resume, verify

    mode = prep.train.checkpoint.resume
    if mode in RESUME_NONE:
        return
    if mode == "auto":
        try:
            found = select_resume(prep.ckpt_dir)
        except CorruptCheckpoints as err:
            fail_runs({f["run_id"] for f in err.failures if f.get("run_id")}, str(err))
            raise
        if found is None:
            return
        prep.resume_from, prep.resume_manifest = found
    else:
        folder = Path(mode).expanduser().resolve()
        ok, reason = verify(folder)
        if not ok:
            raise ConfigError(
                f"train.checkpoint.resume='{mode}' cannot be used: {reason}. "
                "Fix: point it at a complete checkpoint folder (step-XXXXXXXX), or use `auto` or `none`."
            )
        prep.resume_from, prep.resume_manifest = folder, read_manifest(folder) or {}
    prep.changes = resume.check(prep)
    _check_world_size(prep)


def _check_world_size(prep: Prepared) -> None:
    m, t = prep.resume_manifest, prep.train
    written = int(m.get("world_size", 1))
    if written != prep.world_size and t.zero_stage >= 1:
        if not t.checkpoint.universal:
            raise ConfigError(
                f"checkpoint {prep.resume_from} was written by {written} processes under ZeRO-{t.zero_stage}, and "
                f"this run has {prep.world_size}: its optimizer shards only load at world size {written}. Fix: run "
                f"with --nproc {written}, or set train.checkpoint.universal=true to convert it with DeepSpeed's "
                "universal checkpoint."
            )
        prep.universal = True
    position = int(m.get("data", {}).get("position", 0))
    if position % prep.global_batch:
        raise ConfigError(
            f"checkpoint {prep.resume_from} stopped at sample {position}, which is not a step boundary of this run's "
            f"global batch ({prep.global_batch}). Fix: set train.global_batch_size={m.get('global_batch')} so the "
            "batch stays the same at any world size."
        )


def fail_runs(run_ids: set[str], reason: str) -> None:
    """Mark runs whose checkpoints all failed verification FAILED (unless they finished)."""
    from mlops.tracking import MlflowTracker

    for run_id in run_ids:
        try:
            tracker = MlflowTracker.existing(run_id)
            if tracker.status() != "FINISHED":
                tracker.close("FAILED", reason=reason[:4000])
        except Exception as err:  # noqa: BLE001 - the refusal itself must still reach the user
            log.warning("could not mark run %s failed: %s", run_id, err)


def estimate_counts(base_path: str, t):
    """Parameter counts read from the safetensors headers, without loading any weight."""
    from safetensors import safe_open

    from training.metrics import ParamCounts

    total = lora = mm = 0
    for file in sorted(Path(base_path).glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            for key in fh.keys():
                shape = fh.get_slice(key).get_shape()
                n = 1
                for d in shape:
                    n *= d
                total += n
                if len(shape) == 2 and "embed" not in key:
                    mm += n
                    if any(key.endswith(f"{m}.weight") for m in t.lora.target_modules):
                        lora += t.lora.r * (shape[0] + shape[1])
    if t.mode in ADAPTER_MODES:
        return ParamCounts(total + lora, lora, lora, mm)
    return ParamCounts(total, total, mm, 0)


def _check_disk(prep: Prepared) -> None:
    from training.metrics import checkpoint_bytes

    t = prep.train
    counts = estimate_counts(prep.base["path"], t)
    one = checkpoint_bytes(counts, mode=t.mode, zero_stage=t.zero_stage)
    kept = t.checkpoint.keep_last + 1  # the one being written exists before the oldest is deleted
    if t.checkpoint.keep_every:
        kept += t.max_steps // t.checkpoint.keep_every
    probe = prep.ckpt_dir
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    existing = sum(f.stat().st_size for f in prep.ckpt_dir.rglob("*") if f.is_file()) if prep.ckpt_dir.is_dir() else 0
    if one * kept > free + existing:
        raise MLOpsError(
            f"the disk at {probe} has {free / 2**30:.2f} GiB free, but {kept} checkpoints of about "
            f"{one / 2**30:.2f} GiB each need {one * kept / 2**30:.2f} GiB. Fix: lower "
            "train.checkpoint.keep_last or train.checkpoint.keep_every, free space, or set train.checkpoint.dir "
            "to a larger disk."
        )
