"""Training speed and memory, measured side by side in one process.

    .venv/bin/python benchmarks/bench_train.py [--steps 30] [--repeats 2] [--skip-smollm2]

1. Step time of the stack (`training.trainer.train`) against a bare torch AdamW loop on the same model, data
   and steps, with ZeRO-0 and ZeRO-2 (goals <= 1.05 and <= 1.10). Runs alternate and the best of `repeats`
   is kept. Both wall time and process CPU time per step are reported: on a shared machine the CPU-time
   ratio is the one a neighbour's load cannot distort.
2. Checkpoint save time (what the step loop waits for) against `torch.save` of the very same objects
   DeepSpeed wrote (goal <= 1.3), plus the manifest's hashing time and resume-to-first-step time.
3. MFU against the measured fp32 matmul peak of this machine: tiny model (full) and SmolLM2-135M LoRA.
4. What resilience costs: the finite-weights check after every optimizer step (step time with and without it,
   goal <= 1.03), the durable commit of a checkpoint (fsync of files and folders, off the step loop), and the
   time from a SIGTERM to a checkpoint on disk and the process on its way out.

The load average is printed before and after: trust only runs that started quiet.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
WARM = 3  # steps left out of every timing: allocator and first-touch costs


def stack_run(cfg_overrides: list[str], tmp: Path, name: str):
    from mlops.config import load_config
    from mlops.tracking import MemoryTracker
    from training.drill import read_trace
    from training.trainer import train

    ckpt = tmp / name
    cfg = load_config(None, [*cfg_overrides, f"train.checkpoint.dir={ckpt}"])
    tracker = MemoryTracker()
    result = train(cfg, tracker)
    trace = read_trace(ckpt / "trace.jsonl")
    steps = sorted(trace)[WARM:]
    wall = statistics.median(trace[s]["step_s"] for s in steps)
    cpu = statistics.median(trace[s]["step_cpu_s"] for s in steps)
    return (wall, cpu), result, tracker


def bare_run(cfg_overrides: list[str]) -> tuple[float, float]:
    """The same model, batches and steps through a plain torch loop: AdamW, LambdaLR, clip_grad_norm_."""
    import torch

    from mlops.base_models import ensure_base_model
    from mlops.config import load_config
    from mlops.data.format import SnapshotReader
    from mlops.data.snapshot import resolve_snapshot
    from training.data_loader import RankBatches
    from training.engine import build_model, lr_lambda

    cfg = load_config(None, cfg_overrides)
    t = cfg.train
    model = build_model(ensure_base_model(cfg.base_model)["path"], t, cfg.run.seed)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=t.lr, betas=tuple(t.adam_betas), eps=t.adam_eps, weight_decay=t.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(t))
    reader = SnapshotReader(resolve_snapshot(t.snapshot))
    batches = RankBatches(reader, seed=cfg.run.seed, micro=t.micro_batch_size, accum=t.grad_accum, world=1, rank=0)
    times, cpu = [], []
    for _ in range(t.max_steps):
        started, cpu_started = time.perf_counter(), time.process_time()
        for mb in batches.next_step().micro:
            out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, labels=mb.labels)
            (out.loss / t.grad_accum).backward()
        torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    return statistics.median(times[WARM:]), statistics.median(cpu[WARM:])


def bench_step_time(base: list[str], steps: int, repeats: int, tmp: Path) -> None:
    print(f"\n== step time: stack vs bare torch AdamW loop ({steps} steps, median of steps > {WARM}) ==")
    for zero, goal in ((0, 1.05), (2, 1.10)):
        run = [*base, f"train.zero_stage={zero}", f"train.max_steps={steps}", "train.checkpoint_every=100000",
               "train.eval_every=100000", "train.final_model=false", f"run.log_every={steps}"]
        stack, bare = [], []
        for i in range(repeats):
            bare.append(bare_run(run))
            stack.append(stack_run(run, tmp, f"z{zero}-{i}")[0])
        for kind, pos in (("wall", 0), ("cpu", 1)):
            best_stack, best_bare = min(x[pos] for x in stack), min(x[pos] for x in bare)
            ratio = best_stack / best_bare
            verdict = "ok" if ratio <= goal else "over goal"
            print(f"ZeRO-{zero} {kind:4}: stack {best_stack * 1e3:.1f} ms/step, bare {best_bare * 1e3:.1f} ms/step, "
                  f"ratio {ratio:.3f} (goal <= {goal}) {verdict}")


def bench_checkpoint(base: list[str], tmp: Path) -> None:
    import torch

    from training.trainer import SimulatedCrash

    print("\n== checkpoint save vs torch.save of the same objects; resume to first step ==")
    run = [*base, "train.max_steps=13", "train.checkpoint_every=2", "train.final_model=false", "run.log_every=1",
           "train.checkpoint.keep_last=8"]
    for zero in (0, 2):
        cfg = [*run, f"train.zero_stage={zero}"]
        try:
            stack_run([*cfg, "train.debug.crash_after_step=2"], tmp, f"ck{zero}")
        except SimulatedCrash:
            pass
        folder = tmp / f"ck{zero}" / "step-00000002"
        files = sorted(p for p in folder.iterdir() if p.suffix == ".pt")
        objects = [torch.load(p, map_location="cpu", weights_only=False) for p in files]
        plain_times = []
        for _ in range(5):  # the same objects, the same number of files, best of 5 like the saves below
            out = Path(tempfile.mkdtemp(dir=tmp))
            started = time.perf_counter()
            for p, obj in zip(files, objects, strict=True):
                torch.save(obj, out / p.name)
            plain_times.append(time.perf_counter() - started)
        plain = min(plain_times)
        _, _, tracker = stack_run(cfg, tmp, f"ck{zero}")  # resumes from step 2, saves at 4, 6, ..., 12, 13
        metrics = {k: v for _, m in tracker.metrics for k, v in m.items()}
        save = min(m["checkpoint_save_s"] for _, m in tracker.metrics if "checkpoint_save_s" in m)
        from training.checkpoint import file_table

        started = time.perf_counter()
        file_table(folder)
        hashing = time.perf_counter() - started
        size = sum(p.stat().st_size for p in files)
        print(f"ZeRO-{zero}: save {save * 1e3:.1f} ms vs torch.save {plain * 1e3:.1f} ms for {size / 2**20:.1f} MiB "
              f"(best of {len(plain_times)}): "
              f"ratio {save / plain:.2f} (goal <= 1.3); manifest hashing {hashing * 1e3:.1f} ms (background); "
              f"resume: checkpoint load {metrics['resume_load_s']:.2f} s, engine setup + load + first step "
              f"{metrics['start_to_first_step_s']:.2f} s")


def bench_resilience(base: list[str], steps: int, repeats: int, tmp: Path) -> None:
    import re

    from training.saver import fsync_tree
    from training.stopping import Preempted, graceful_signals

    print(f"\n== resilience: finite-weights check, durable commit, SIGTERM to checkpoint ({steps} steps) ==")
    run = [*base, "train.zero_stage=0", f"train.max_steps={steps}", "train.checkpoint_every=100000",
           "train.eval_every=100000", "train.final_model=false", f"run.log_every={steps}"]
    checked, unchecked = [], []
    for i in range(repeats):  # alternate, keep the best of each
        unchecked.append(stack_run([*run, "train.guards.finite_weights=false"], tmp, f"nf{i}")[0])
        checked.append(stack_run([*run, "train.guards.finite_weights=true"], tmp, f"f{i}")[0])
    for kind, pos in (("wall", 0), ("cpu", 1)):
        on, off = min(x[pos] for x in checked), min(x[pos] for x in unchecked)
        verdict = "ok" if on / off <= 1.03 else "over goal"
        print(f"finite-weights check {kind:4}: {on * 1e3:.1f} vs {off * 1e3:.1f} ms/step, ratio {on / off:.3f} "
              f"(goal <= 1.03) {verdict}")
    folder = next((tmp / "f0").glob("step-*"))
    times = []
    for _ in range(5):
        started = time.perf_counter()
        fsync_tree(folder)
        times.append(time.perf_counter() - started)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"durable commit: fsync of {size / 2**20:.1f} MiB of checkpoint files and folders {min(times) * 1e3:.1f} ms "
          "(best of 5, in the background thread with the hashes)")
    notice = [*run, "train.max_steps=12", "train.debug.sigterm_at_step=6"]
    try:
        with graceful_signals():
            stack_run(notice, tmp, "notice")
    except Preempted as err:
        after = re.search(r"written ([0-9.]+) s after the notice", str(err))
        print(f"SIGTERM during step 6 -> checkpoint step-00000006 on disk {after.group(1) if after else '?'} s later "
              "(the rest of step 6, the save, its hashes, fsync and rename)")


def bench_mfu(name: str, overrides: list[str], tmp: Path) -> None:
    from training.metrics import measured_peak_flops

    _, result, tracker = stack_run(overrides, tmp, f"mfu-{name}")
    peak = measured_peak_flops()
    mfu = [m["mfu"] for _, m in tracker.metrics if "mfu" in m]
    rate = [m["tokens_per_s"] for _, m in tracker.metrics if "tokens_per_s" in m]
    print(f"{name}: {statistics.median(rate):.0f} tokens/s, MFU {statistics.median(mfu):.1%} of the measured "
          f"fp32 matmul peak {peak / 1e9:.1f} GFLOP/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-smollm2", action="store_true", help="skip the SmolLM2 LoRA MFU line")
    parser.add_argument("--parts", default="step,checkpoint,resilience,mfu", help="which measurements to run")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    os.environ.setdefault("MLOPS_HOME", str(tmp / "home"))
    from mlops.base_models import import_base_model
    from training.testing import make_snapshot

    cache = REPO / ".mlops" / "test-cache" / "models"
    tiny = import_base_model("tiny", root=cache)
    snap = make_snapshot(train=512, validation=16, seq_len=64)
    base = [f"base_model={tiny['path']}", f"train.snapshot={snap}", "train.mode=full", "train.micro_batch_size=4",
            "train.grad_accum=2", "train.warmup_steps=2", "train.lr=1e-3", "train.progress=false"]
    print(f"torch threads {__import__('torch').get_num_threads()}, tiny model {tiny['id']}, snapshot {snap}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    parts = set(args.parts.split(","))
    try:
        run_parts(parts, args, base, snap, cache, tmp)
    finally:
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")


def run_parts(parts: set[str], args, base: list[str], snap: str, cache: Path, tmp: Path) -> None:
    from mlops.base_models import import_base_model

    if "step" in parts:
        bench_step_time(base, args.steps, args.repeats, tmp)
    if "checkpoint" in parts:
        bench_checkpoint(base, tmp)
    if "resilience" in parts:
        bench_resilience(base, args.steps, args.repeats, tmp)
    if "mfu" not in parts:
        return
    print("\n== MFU (CPU, fp32) ==")
    bench_mfu("tiny (full)", [*base, "train.max_steps=12", "run.log_every=4", "train.final_model=false"], tmp)
    if not args.skip_smollm2:
        smol = import_base_model("smollm2", root=cache)
        bench_mfu("SmolLM2-135M LoRA", [f"base_model={smol['path']}", f"train.snapshot={snap}", "train.mode=lora",
                                        "train.micro_batch_size=2", "train.grad_accum=1", "train.max_steps=8",
                                        "run.log_every=2", "train.final_model=false", "train.progress=false",
                                        "train.eval_samples=4"], tmp)


if __name__ == "__main__":
    main()
