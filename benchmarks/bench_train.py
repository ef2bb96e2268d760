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

5. The memory matrix (issue 28), 2 processes over gloo (torchrun, as `mlops train run --nproc 2` starts them), on
   the tiny model and SmolLM2-135M (full fine-tune): step time and peak memory per precision (fp32, bf16) x
   ZeRO stage (0, 2, 3) x activation checkpointing (off, on); the plan's memory estimate (`mlops train plan`,
   training.planner) against the measured peak per rank (goal 0.8-1.25x for every row); ZeRO-3 per-rank
   model-state memory against ZeRO-0 (goal <= 0.6x). Section 1 covers bf16 too: the bare loop runs the same
   model under `torch.autocast(bfloat16)` (torch's own mixed precision), the stack DeepSpeed's bf16.

How memory is measured per rank (section 5): a thread samples the rank's RssAnon (anonymous resident memory,
/proc/self/status) every 2 ms and keeps the maximum; the figure is that maximum minus RssAnon at the baseline,
taken after the imports (the modeling code too: the model is built once on the meta device first), the process
group and the checks before compute, right before the model is built.
Anonymous memory is what this rank allocated for itself (tensors, optimizer state, activations, allocator
slack). File-backed pages (the mmapped safetensors, shared libraries) and DeepSpeed's shared-memory
communication buffers are left out: they are shared between the ranks or are page cache, so adding them to each
rank would count them twice. torch has no CPU allocator statistics (torch.cpu has no memory_stats), and the
kernel's VmHWM counts the shared pages too; its delta is printed beside as a cross-check. Model-state memory is
the bytes of every live tensor storage of the rank (found through the garbage collector, each storage once)
after the last step's validation: weights or their ZeRO-3 shards, optimizer state and fp32 master copies, and
any gradient buffers DeepSpeed keeps between steps.

6. Training as a service (benchmarks/train_ray.py): step time under Ray Train against `mlops train run` on the
   same machine (goal <= 1.05x), submit to first step, and a lost node to training again.
7. DPO against SFT (benchmarks/train_dpo.py): step time and peak memory of a DPO step (LoRA: reference with the
   adapters off; full: reference precomputed) against an SFT step, each beside its plan.

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
SEQ_LEN = 64  # the benchmark snapshot's sequence length


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
    # bf16: torch's own mixed precision (bf16 matmuls, fp32 weights and AdamW), as DeepSpeed's bf16 computes in
    # bf16 and keeps fp32 master weights.
    cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=t.precision == "bf16")
    for _ in range(t.max_steps):
        started, cpu_started = time.perf_counter(), time.process_time()
        for mb in batches.next_step().micro:
            with cast:
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
    for precision, zero, goal in (("fp32", 0, 1.05), ("fp32", 2, 1.10), ("bf16", 0, 1.05)):
        run = [*base, f"train.zero_stage={zero}", f"train.max_steps={steps}", "train.checkpoint_every=100000",
               "train.eval_every=100000", "train.final_model=false", f"run.log_every={steps}",
               f"train.precision={precision}"]
        stack, bare = [], []
        for i in range(repeats):
            bare.append(bare_run(run))
            stack.append(stack_run(run, tmp, f"z{zero}-{precision}-{i}")[0])
        for kind, pos in (("wall", 0), ("cpu", 1)):
            best_stack, best_bare = min(x[pos] for x in stack), min(x[pos] for x in bare)
            ratio = best_stack / best_bare
            verdict = "ok" if ratio <= goal else "over goal"
            print(f"{precision} ZeRO-{zero} {kind:4}: stack {best_stack * 1e3:.1f} ms/step, bare "
                  f"{best_bare * 1e3:.1f} ms/step, ratio {ratio:.3f} (goal <= {goal}) {verdict}")


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


# ----------------------------------------------------------------------------------------- 5. memory matrix

def status_kib(field: str) -> int:
    import re

    with open("/proc/self/status") as fh:
        return int(re.search(rf"^{field}:\s+(\d+)", fh.read(), re.M)[1])


class AnonPeak:
    """RssAnon high-water of this process above the moment it started, sampled by a thread (see the docstring)."""

    def __init__(self, every_s: float = 0.002) -> None:
        import threading

        self.every_s, self.base, self.peak = every_s, status_kib("RssAnon"), 0
        self.phase, self.phases = "setup", {}  # the peak within each named phase (forward, backward, step)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS: the cross-check's baseline
        self.hwm_base = status_kib("VmHWM")

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._note(status_kib("RssAnon"))
            self._stop.wait(self.every_s)

    def _note(self, anon_kib: int) -> None:
        self.peak = max(self.peak, anon_kib)
        self.phases[self.phase] = max(self.phases.get(self.phase, 0), anon_kib)

    def enter(self, phase: str) -> None:
        """Samples from now on count toward `phase` (the call's own start and end are sampled too)."""
        self._note(status_kib("RssAnon"))
        self.phase = phase
        self._note(status_kib("RssAnon"))

    def start(self) -> AnonPeak:
        self._thread.start()
        return self

    def read(self) -> dict:
        self._note(status_kib("RssAnon"))
        return {"peak_bytes": (self.peak - self.base) * 1024.0,
                "hwm_bytes": (status_kib("VmHWM") - self.hwm_base) * 1024.0,
                "phase_peak_bytes": {k: (v - self.base) * 1024.0 for k, v in self.phases.items()}}

    def watch(self, owner, names: tuple[str, ...]) -> None:
        """Wrap owner's methods so their calls are phases of their own name."""
        for name in names:
            original = getattr(owner, name)

            def wrapped(*args, _original=original, _name=name, **kwargs):
                outer = self.phase
                self.enter(_name)
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.enter(outer)

            setattr(owner, name, wrapped)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def model_state_bytes() -> float:
    """Bytes of this rank's model state: the module's weights (their ZeRO-3 shards where partitioned) and the
    torch optimizer's parameters (fp32 master copies where DeepSpeed keeps them) and state (AdamW moments), each
    storage counted once (after the last step: ZeRO-3 weights still gathered count too). Found through the garbage
    collector, so no DeepSpeed internals are named. Not counted:
    gradients (freed after each step here) and DeepSpeed's communication buckets (allocated whole, e.g. a
    5e8-element ZeRO-3 reduce buffer, but only the pages written become resident on a CPU)."""
    import gc

    import torch

    gc.collect()
    storages: dict[int, int] = {}

    def add(tensor) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and tensor.numel():
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()

    for obj in gc.get_objects():
        if type(obj).__name__ == "DeepSpeedEngine":
            for p in obj.module.parameters():
                add(getattr(p, "ds_tensor", None))  # a ZeRO-3 shard
                add(p.data)  # a full weight: ZeRO-0/1/2, a ZeRO-3 persistent (small) one, or one still gathered
        elif isinstance(obj, torch.optim.Optimizer):
            for group in obj.param_groups:
                for p in group["params"]:
                    add(p.data)
            for state in obj.state.values():
                for value in state.values():
                    add(value)
    return float(sum(storages.values()))


def rank_worker(spec_path: str) -> None:
    """One rank of a matrix row, started by torchrun: the checks a worker of `mlops train run` does, then the
    baseline, then `train()`; memory read at the last step's report (before the final checkpoint's save)."""
    import json

    from mlops.config import load_config
    from mlops.tracking import MemoryTracker
    from training.consistency import check_ranks
    from training.engine import init_world
    from training.launch import shutdown_world
    from training.prepare import prepare
    from training.trainer import train

    spec = json.loads(Path(spec_path).read_text())
    cfg = load_config(None, [*spec["overrides"], f"train.checkpoint.dir={spec['ckpt']}"])
    world = init_world(cfg.train.deepspeed.backend)
    check_ranks(world)
    prep = prepare(cfg, world.size, verify_inputs=False, lock=False, ckpt_dir=Path(spec["ckpt"]))
    # The model once on the meta device: it imports the modeling code (~120 MiB of one-off module state a rank
    # of the tiny model would otherwise show as training memory), as the launcher's plan check does in-process.
    from training.planner import meta_model

    meta_model(prep.base["path"], cfg.train)
    import gc

    gc.collect()
    sampler = AnonPeak().start()
    from deepspeed.runtime.engine import DeepSpeedEngine

    sampler.watch(DeepSpeedEngine, ("forward", "backward", "step"))  # which phase holds the peak
    measured: dict = {}
    import training.steps

    run_step = training.steps.run_step

    def first_step_marks_setup(run, window):  # the peak of loading and engine setup, before any step
        measured.setdefault("setup_peak_bytes", sampler.read()["peak_bytes"])
        return run_step(run, window)

    training.steps.run_step = first_step_marks_setup

    def report(step: int, _metrics: dict) -> None:
        if step == cfg.train.max_steps:
            measured.update(sampler.read(), model_state_bytes=model_state_bytes())

    try:
        train(cfg, MemoryTracker(), prepared=prep, report=report)
    finally:
        sampler.stop()
    Path(spec["out"], f"rank{world.rank}.json").write_text(json.dumps(measured))
    shutdown_world()


ALL_ROWS = [(precision, zero, ckpt) for precision in ("fp32", "bf16") for zero in (0, 2, 3) for ckpt in (False, True)]


def matrix_row(overrides: list[str], tmp: Path, name: str, nproc: int) -> dict:
    """Train one row on `nproc` ranks: per-rank measurements and rank 0's median step time."""
    import json
    import subprocess

    from mlops.files import free_port
    from mlops.tracking import client
    from training.drill import read_trace

    out, ckpt = tmp / f"mx-{name}", tmp / f"mx-{name}" / "ckpt"
    out.mkdir(parents=True)
    client().search_experiments()  # the store's schema exists before two ranks could both create it
    (out / "spec.json").write_text(json.dumps({"overrides": overrides, "ckpt": str(ckpt), "out": str(out)}))
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc)), "DS_ACCELERATOR": "cpu"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(free_port()), __file__, "--rank-worker", str(out / "spec.json")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    row = {"name": name, "overrides": overrides, "nproc": nproc}
    if done.returncode or len(ranks) != nproc:
        (out / "log.txt").write_text(done.stdout + done.stderr)
        errors = [line for line in done.stderr.splitlines() if "Error" in line and "elastic" not in line]
        return {**row, "error": f"{errors[-1] if errors else done.returncode} (log {out / 'log.txt'})"}
    trace = read_trace(ckpt / "trace.jsonl")
    return {**row, "ranks": ranks, "step_s": statistics.median(trace[s]["step_s"] for s in sorted(trace)[WARM:])}


def bench_matrix(model: str, base: list[str], steps: int, tmp: Path, rows=ALL_ROWS, nproc: int = 2,
                 saved: Path | None = None) -> dict:
    """Measure every row (a dict keyed by (precision, zero, checkpointing)), printing each as it ends."""
    print(f"\n== memory matrix: {model}, {nproc} processes (gloo), {steps} steps; per rank: measured peak (RssAnon "
          f"above baseline; VmHWM delta) vs plan; live model state ==", flush=True)
    measured = {}
    for precision, zero, ckpt in rows:
        name = f"{model}-{precision}-z{zero}-{'ckpt' if ckpt else 'nockpt'}"
        run = [*base, f"train.precision={precision}", f"train.zero_stage={zero}",
               f"train.activation_checkpointing={str(ckpt).lower()}", f"train.max_steps={steps}",
               "train.checkpoint_every=100000", "train.eval_every=100000", "train.final_model=false",
               f"run.log_every={steps}", "train.eval_samples=4"]
        measured[(precision, zero, ckpt)] = matrix_row(run, tmp, name, nproc)
        print(matrix_line(measured[(precision, zero, ckpt)]), flush=True)
        if saved:
            save_matrix(saved, model, measured)
    return measured


def matrix_line(row: dict) -> str:
    """One row against the plan the current planner makes for its config (so a saved run can be re-planned)."""
    from mlops.config import load_config
    from training import hardware
    from training.planner import plan_job

    mib = 2**20
    label = row["name"]
    if "error" in row:
        return f"{label}: FAILED {row['error']}"
    plan = plan_job(load_config(None, row["overrides"]), hw=hardware.cpu(measure=False), gpus=row["nproc"],
                    tokens=1.0, seq_len=SEQ_LEN)
    planned = plan["memory_total_bytes"] + plan["memory_host_bytes"]
    planned_state = plan["memory_weights_bytes"] + plan["memory_optimizer_bytes"]  # what model_state_bytes counts
    peak = max(r["peak_bytes"] for r in row["ranks"])
    ratio = planned / peak
    setup = max(r.get("setup_peak_bytes", float("nan")) for r in row["ranks"])
    phases = {}
    for r in row["ranks"]:
        for phase, value in r.get("phase_peak_bytes", {}).items():
            phases[phase] = max(phases.get(phase, 0.0), value)
    by_phase = ", ".join(f"{k} {v / mib:.0f}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1]))
    return (f"{label}: {row['step_s'] * 1e3:8.1f} ms/step; peak/rank {peak / mib:7.1f} MiB (VmHWM "
            f"{max(r['hwm_bytes'] for r in row['ranks']) / mib:.1f}; before the first step {setup / mib:.1f}), "
            f"plan {planned / mib:7.1f} MiB: plan/measured "
            f"{ratio:.2f} (goal 0.8-1.25) {'ok' if 0.8 <= ratio <= 1.25 else 'MISSED'}; model state/rank "
            f"{max(r['model_state_bytes'] for r in row['ranks']) / mib:.1f} MiB (plan {planned_state / mib:.1f})"
            + (f"; peak by phase (MiB): {by_phase}" if by_phase else ""))


def matrix_summary(model: str, measured: dict) -> None:
    def state(key):
        row = measured.get(key, {})
        return max(r["model_state_bytes"] for r in row["ranks"]) if "ranks" in row else None

    for precision in ("fp32", "bf16"):
        z0, z3 = state((precision, 0, False)), state((precision, 3, False))
        if z0 and z3:
            print(f"{model} {precision}: ZeRO-3 model state per rank / ZeRO-0 = {z3 / z0:.2f} (goal <= 0.6) "
                  f"{'ok' if z3 / z0 <= 0.6 else 'MISSED'}")
    b0, f0 = measured.get(("bf16", 0, False), {}), measured.get(("fp32", 0, False), {})
    if "step_s" in b0 and "step_s" in f0:
        print(f"{model}: bf16 / fp32 step time at ZeRO-0 = {b0['step_s'] / f0['step_s']:.2f} (this CPU)")


def save_matrix(path: Path, model: str, measured: dict) -> None:
    import json

    data = json.loads(path.read_text()) if path.exists() else {}
    data[model] = [{"key": list(k), **v} for k, v in measured.items()]
    path.write_text(json.dumps(data, indent=1))


def replan(path: Path) -> None:
    """Print a saved matrix again against the current planner: measurements as they were, plans as they are."""
    import json

    for model, rows in json.loads(path.read_text()).items():
        print(f"\n== memory matrix (saved): {model} ==")
        measured = {tuple(r.pop("key")): r for r in rows}
        for row in measured.values():
            print(matrix_line(row))
        matrix_summary(model, measured)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-smollm2", action="store_true", help="skip the SmolLM2 LoRA MFU line")
    parser.add_argument("--parts", default="step,checkpoint,resilience,mfu,matrix,ray,dpo",
                        help="which measurements to run")
    parser.add_argument("--ray-steps", type=int, default=60, help="steps of each Ray Train job (section 6)")
    parser.add_argument("--matrix-steps", type=int, default=8, help="steps per row of the memory matrix")
    parser.add_argument("--matrix-json", type=Path, help="write the matrix's measurements here (JSON)")
    parser.add_argument("--replan", type=Path, help="print a saved --matrix-json against the current planner; no run")
    parser.add_argument("--smollm2-rows", default="basic",
                        help="SmolLM2's rows: basic (fp32 all six, bf16 ZeRO-0 and ZeRO-3 without checkpointing), "
                             "all, or a list like fp32-z0-off,bf16-z3-on")
    parser.add_argument("--tiny-rows", default="all", help="the tiny model's rows (all, or a list as above)")
    parser.add_argument("--matrix-models", default="tiny,smollm2", help="models of the memory matrix")
    parser.add_argument("--rank-worker", help=argparse.SUPPRESS)  # one rank of a matrix row (torchrun starts it)
    args = parser.parse_args()
    if args.rank_worker:
        return rank_worker(args.rank_worker)
    if args.replan:
        return replan(args.replan)
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    os.environ.setdefault("MLOPS_HOME", str(tmp / "home"))
    from mlops.base_models import import_base_model
    from training.testing import make_snapshot

    cache = REPO / ".mlops" / "test-cache" / "models"
    tiny = import_base_model("tiny", root=cache)
    snap = make_snapshot(train=512, validation=16, seq_len=SEQ_LEN)
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
    smol = None if args.skip_smollm2 else import_base_model("smollm2", root=cache)
    if "mfu" in parts:
        print("\n== MFU (CPU, fp32) ==")
        bench_mfu("tiny (full)", [*base, "train.max_steps=12", "run.log_every=4", "train.final_model=false"], tmp)
        if smol:
            bench_mfu("SmolLM2-135M LoRA", [f"base_model={smol['path']}", f"train.snapshot={snap}", "train.mode=lora",
                                            "train.micro_batch_size=2", "train.grad_accum=1", "train.max_steps=8",
                                            "run.log_every=2", "train.final_model=false", "train.progress=false",
                                            "train.eval_samples=4"], tmp)
    if "dpo" in parts:
        from benchmarks.train_dpo import bench_dpo

        bench_dpo(base, args.steps, tmp)
    if "ray" in parts:
        from benchmarks.train_ray import bench_ray

        bench_ray(base, args.ray_steps, tmp)
    if "matrix" in parts:
        # Global batch 8 at 2 ranks: micro 4 x accum 1 per rank (the tiny model), micro 2 x accum 2 (SmolLM2).
        saved = args.matrix_json or tmp / "matrix.json"
        for model, overrides, rows in matrix_models(args, base, snap, smol):
            measured = bench_matrix(model, overrides, args.matrix_steps, tmp, rows, saved=saved)
            matrix_summary(model, measured)
        print(f"matrix measurements saved to {saved} (re-plan them with --replan)")


def matrix_models(args, base: list[str], snap: str, smol: dict | None) -> list:
    """The tiny model (micro 4 per rank, its logits dominate memory) and SmolLM2-135M full fine-tune (micro 1 per
    rank: its model state dominates). bf16 steps run ~10x slower than fp32 on this CPU (no AMX), so SmolLM2's
    bf16 rows are the two the ZeRO-3 ratio needs unless --smollm2-bf16 all."""
    models = set(args.matrix_models.split(","))
    out = [("tiny", [*base, "train.grad_accum=1"], parse_rows(args.tiny_rows))] if "tiny" in models else []
    if smol and "smollm2" in models:
        out.append(("SmolLM2-135M", [f"base_model={smol['path']}", f"train.snapshot={snap}", "train.mode=full",
                                     "train.micro_batch_size=1", "train.grad_accum=1", "train.lr=2e-5",
                                     "train.warmup_steps=2", "train.progress=false"], parse_rows(args.smollm2_rows)))
    return out


def parse_rows(spec: str) -> list[tuple[str, int, bool]]:
    """Rows from their names: all, basic (SmolLM2's default) or a list like fp32-z0-off,bf16-z3-on."""
    if spec == "all":
        return ALL_ROWS
    if spec == "basic":
        return [r for r in ALL_ROWS if r[0] == "fp32"] + [("bf16", 0, False), ("bf16", 3, False)]
    rows = []
    for item in spec.split(","):
        precision, zero, ckpt = item.split("-")
        rows.append((precision, int(zero.lstrip("z")), ckpt == "on"))
    return rows


if __name__ == "__main__":
    main()
