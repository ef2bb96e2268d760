"""Section 7 of bench_train.py: a DPO step against an SFT step, each side by side with its plan.

    .venv/bin/python benchmarks/bench_train.py --parts dpo [--steps 30]

On the tiny model, for LoRA (the reference is the same weights with the adapters off: one more forward per step)
and for full fine-tuning (the reference is precomputed once before the first step): the median step time and the
peak anonymous memory above the start (each run in a process of its own, sampled as in section 5), against the
plan's warm-up step time and memory estimate. A DPO micro batch of m pairs is 2m sequences, so its step does twice
an SFT step's tokens at the same micro batch size: the per-token ratio is printed too.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WARM = 3


def one_run(spec: dict) -> dict:
    """One training in this process (a child): its step times, plan and peak memory."""
    sys.path.insert(0, str(REPO))
    from benchmarks.bench_train import AnonPeak
    from mlops.config import load_config
    from mlops.tracking import MemoryTracker
    from training.drill import read_trace
    from training.trainer import train

    ckpt = Path(spec["ckpt"])
    cfg = load_config(None, [*spec["overrides"], f"train.checkpoint.dir={ckpt}"])
    peak = AnonPeak().start()
    tracker = MemoryTracker()
    train(cfg, tracker)
    memory = peak.read()
    peak.stop()
    trace = read_trace(ckpt / "trace.jsonl")
    steps = sorted(trace)[WARM:]
    params = tracker.params
    return {"step_s": statistics.median(trace[s]["step_s"] for s in steps),
            "tokens": statistics.median(m["tokens_per_s"] * m["step_time_s"] for _, m in tracker.metrics
                                        if "tokens_per_s" in m),
            "plan_step_s": float(params["plan.warmup_step_s"]), "plan_memory": float(params["plan.memory_total_bytes"]),
            "peak_bytes": memory["peak_bytes"], "reference_s": float(params.get("plan.dpo_reference_s", 0.0))}


def run_child(spec: dict, tmp: Path) -> dict:
    path = tmp / f"{spec['name']}.json"
    path.write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, __file__, "--one", str(path)], capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"{spec['name']} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_dpo(base: list[str], steps: int, tmp: Path) -> None:
    from training.testing import make_pair_snapshot

    pairs = make_pair_snapshot(train=512, validation=16, seq_len=64)
    common = [*base, f"train.max_steps={steps}", "train.final_model=false", "run.log_every=2",
              "train.eval_every=1000", "train.checkpoint_every=1000"]
    print(f"\n== DPO against SFT (tiny model, {steps} steps, micro 4 x accum 2; a DPO sample is a pair) ==")
    print(f"{'run':<12}{'step s':>9}{'plan s':>9}{'ratio':>7}{'peak MiB':>10}{'plan MiB':>10}{'ratio':>7}"
          f"{'tok/step':>10}")
    measured = {}
    for mode in ("lora", "full"):
        for objective, snapshot in (("sft", base_snapshot(base)), ("dpo", pairs)):
            name = f"{objective}-{mode}"
            spec = {"name": name, "ckpt": str(tmp / name), "overrides": [
                *common, f"train.snapshot={snapshot}", f"train.mode={mode}", f"train.objective={objective}"]}
            row = measured[name] = run_child(spec, tmp)
            mib = 2**20
            print(f"{name:<12}{row['step_s']:>9.3f}{row['plan_step_s']:>9.3f}{row['step_s'] / row['plan_step_s']:>7.2f}"
                  f"{row['peak_bytes'] / mib:>10.0f}{row['plan_memory'] / mib:>10.0f}"
                  f"{row['peak_bytes'] / row['plan_memory']:>7.2f}{row['tokens']:>10.0f}")
    for mode in ("lora", "full"):
        sft, dpo = measured[f"sft-{mode}"], measured[f"dpo-{mode}"]
        per_token = (dpo["step_s"] / dpo["tokens"]) / (sft["step_s"] / sft["tokens"])
        print(f"{mode}: DPO/SFT step time {dpo['step_s'] / sft['step_s']:.2f}x (plan "
              f"{dpo['plan_step_s'] / sft['plan_step_s']:.2f}x), per token {per_token:.2f}x; peak memory "
              f"{dpo['peak_bytes'] / sft['peak_bytes']:.2f}x (plan {dpo['plan_memory'] / sft['plan_memory']:.2f}x)"
              + (f"; reference pass planned {dpo['reference_s']:.1f} s" if dpo["reference_s"] else ""))


def base_snapshot(base: list[str]) -> str:
    return next(o.split("=", 1)[1] for o in base if o.startswith("train.snapshot="))


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--one":
    print(json.dumps(one_run(json.loads(Path(sys.argv[2]).read_text()))))
