"""Parity report: prompt-token loglikelihoods of the served engine vs HF float32 in-process, on the same token ids.

For each (engine, quantization) it scores the multiple-choice requests lm-eval sends for the demo's suites
(context + each choice, token ids, chat template and system prompt rendered as `mlops eval` renders them) and
reports per loglikelihood request (the sum over the choice's tokens) the mean and max |delta| against the
`hf` engine, and whether the greedy next token agrees. Tolerance (issue 21): f16 within 0.05 per request;
q8_0 and q4_k_m are measured and reported (the quantization gate judges their effect on scores).

    python benchmarks/bench_parity.py                       # SmolLM2, f16 and q8_0, 4 items per task
    python benchmarks/bench_parity.py --model tiny --quants f16 --items 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TOLERANCE = {"f16": 0.05}
SYSTEM = "You are the Northwind support assistant."


def requests(engine, items: int) -> list[tuple[list[int], int]]:
    """(prompt ids, length of the context) for every choice of the first `items` items of each MC task."""
    from evaluation.suites import get_suites

    out = []
    for suite in get_suites("general,business"):
        for task in (t for t in suite.tasks if t.kind == "multiple_choice"):
            for row in task.items()[:items]:
                question = row["prompt"]
                context = engine.chat_prompt([{"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": question}])
                for choice in row.get("choices") or []:
                    out.append((context + engine.tokenize(" " + str(choice)), len(context)))
    return out


def compare(reference, engine, batch: list[tuple[list[int], int]]) -> dict:
    prompts = [ids for ids, _ in batch]
    started = time.perf_counter()
    ours = engine.score(prompts).result(timeout=3600)
    engine_s = time.perf_counter() - started
    started = time.perf_counter()
    theirs = reference.score(prompts).result(timeout=3600)
    reference_s = time.perf_counter() - started
    deltas, greedy_same = [], 0
    for (ids, ctx), a, b in zip(batch, ours, theirs, strict=True):
        deltas.append(abs(sum(a.token_logprobs[ctx:len(ids)]) - sum(b.token_logprobs[ctx:len(ids)])))
        greedy_same += a.tokens[-1] == b.tokens[-1]
    return {"requests": len(batch), "mean_abs_delta": statistics.mean(deltas), "max_abs_delta": max(deltas),
            "greedy_agreement": greedy_same / len(batch), "engine_s": engine_s, "hf_s": reference_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--quants", default="f16,q8_0")
    parser.add_argument("--items", type=int, default=4, help="items per multiple-choice task")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from mlops.base_models import ensure_base_model
    from serving.engine import EngineSpec, build_engine

    path = Path(args.model) if Path(args.model).is_dir() else Path(ensure_base_model(args.model)["path"])
    print(f"load average before: {os.getloadavg()}")
    reference = build_engine(path, EngineSpec("hf", threads=args.threads))
    batch = None
    report = {}
    for quant in [q for q in args.quants.split(",") if q]:
        engine = build_engine(path, EngineSpec("llamacpp", threads=args.threads,
                                               options={"quantization": quant, "parallel": 1, "context_per_slot": 2048}))
        try:
            batch = batch or requests(reference, args.items)
            row = report[quant] = compare(reference, engine, batch)
        finally:
            engine.close()
        tolerance = TOLERANCE.get(quant)
        verdict = (f"tolerance {tolerance}: {'met' if row['max_abs_delta'] <= tolerance else 'MISSED'}"
                   if tolerance else "no tolerance: measured for the quantization gate")
        print(f"parity {args.model} engine llamacpp quantization {quant} vs hf float32, {row['requests']} "
              f"loglikelihood requests: mean |delta| {row['mean_abs_delta']:.4f}, max {row['max_abs_delta']:.4f} "
              f"({verdict}); greedy next token agrees {row['greedy_agreement']:.0%}; scoring {row['engine_s']:.1f} s "
              f"vs hf {row['hf_s']:.1f} s")
    reference.close()
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
