"""Deployment-form eval speed, measured side by side in one run.

1. Eval wall time: the same tasks, model, chat template and system prompt, through the served endpoint on each
   engine (server subprocess start + lm-eval `local-completions`/`local-chat-completions`, as `mlops eval`
   runs it) and in-process with lm-eval's `hf` model. Goals: `hf` served ratio <= 1.5; `llamacpp` (q8_0, the
   deployment form) ratio <= 1.0 (faster than in-process float32).
2. Server throughput at concurrency 1, 4 and 16: requests/s, tokens/s (generated for chat, scored for
   loglikelihood requests) and p50/p95/p99 latency.

Run: .venv/bin/python benchmarks/bench_eval.py [--models tiny,smollm2] [--limit 8]
Traffic goes only to a server this script starts on 127.0.0.1; request counts are bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SYSTEM = "You are the Northwind support assistant."


def _tasks(limit_tasks: list[str] | None):
    from evaluation.suites import get_suites, task_config

    suites = get_suites("general,business")
    return [task_config(s, t) for s in suites for t in s.tasks if not limit_tasks or t.name in limit_tasks]


def in_process(path: str, limit: int, tasks: list[str] | None, batch_size: int, threads: int) -> float:
    import torch
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    torch.set_num_threads(threads)

    started = time.perf_counter()
    configs = _tasks(tasks)
    mc = [c for c in configs if c["output_type"] == "multiple_choice"]
    gen = [c for c in configs if c["output_type"] == "generate_until"]
    for group in (g for g in (mc, gen) if g):
        simple_evaluate(model="hf", model_args={"pretrained": path, "dtype": "float32"}, tasks=group,
                        task_manager=TaskManager(include_defaults=False), device="cpu", batch_size=batch_size,
                        limit=limit, apply_chat_template=True, system_instruction=SYSTEM, bootstrap_iters=0)
    return time.perf_counter() - started


def _subset(suites, tasks):
    if not tasks:
        return suites
    picked = [s.__class__(s.name, s.version, s.description, s.folder, s.fingerprint,
                          [t for t in s.tasks if t.name in tasks]) for s in suites]
    return [s for s in picked if s.tasks]


def deployment(path: str, limit: int, tasks: list[str] | None, batch_size: int, concurrency: int,
               engine: str = "hf", quantization: str | None = None) -> tuple[float, float]:
    """(wall including server start, lm-eval part only), served on `engine` (GGUF conversion cached before)."""
    from evaluation.config import EvalConfig
    from evaluation.runner import _lm_eval, prepare_tasks
    from evaluation.suites import get_suites
    from mlops.profile import load_profile
    from serving.process import ServerProcess

    started = time.perf_counter()
    suites = _subset(get_suites("general,business"), tasks)
    profile = load_profile(path).model_copy(update={"system_prompt": SYSTEM, "engine": engine,
                                                    "quantization": quantization})
    work = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    profile_file = profile.save_as(work / "profile.yaml")
    cfg = EvalConfig(limit=limit, batch_size=batch_size, concurrency=concurrency, bootstrap_iters=0)
    # The benchmark's system prompt is not the base model's released profile: serve it forced.
    with ServerProcess(Path(path), profile_file, "bench", work / "server.log", force_profile=True,
                       threads=cfg.server_threads or os.cpu_count()) as server:  # as `mlops eval` serves it
        server.launch()
        tasks_ready = prepare_tasks(suites)  # as `mlops eval` does: overlaps the model load
        server.wait_healthy(600)
        served = time.perf_counter()
        print(f"server healthy after {served - started:.1f} s")
        _lm_eval(server, Path(path), "bench", profile, suites, cfg, None, 1234, tasks_ready)
    done = time.perf_counter()
    return done - started, done - served


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def throughput(path: str, levels: list[int], requests: int, max_tokens: int) -> list[dict]:
    import httpx

    from mlops.profile import load_profile
    from serving.process import ServerProcess

    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    profile_file = load_profile(path).save_as(work / "profile.yaml")
    rows = []
    with ServerProcess(Path(path), profile_file, "bench", work / "server.log") as server:
        server.start(600)
        client = httpx.Client(base_url=server.url, timeout=600, headers=server.headers)
        lock = threading.Lock()
        prompt = [int(t) for t in client.post("/tokenize", json={
            "prompt": "Customer question: How many days do I have to return a jacket? " * 4}).json()["tokens"]]
        workloads = {
            "chat": ("/v1/chat/completions", lambda i: {
                "model": "bench", "max_tokens": max_tokens, "temperature": 0,
                "messages": [{"role": "user", "content": f"Question {i}: where is my order?"}]}),
            "score": ("/v1/completions", lambda i: {
                "model": "bench", "prompt": [prompt[: len(prompt) - i % 7]], "max_tokens": 1, "logprobs": 1,
                "echo": True, "temperature": 0}),
        }
        client.post("/v1/chat/completions", json=workloads["chat"][1](0))  # warm up
        for name, (url, body) in workloads.items():
            for level in levels:
                latencies: list[float] = []
                tokens = [0]

                def one(i: int, url=url, body=body, latencies=latencies, tokens=tokens, name=name) -> None:
                    started = time.perf_counter()
                    out = client.post(url, json=body(i))
                    out.raise_for_status()
                    with lock:
                        latencies.append(time.perf_counter() - started)
                        # chat: generated tokens; scoring: prompt tokens scored
                        usage = out.json()["usage"]
                        tokens[0] += usage["completion_tokens"] if name == "chat" else usage["prompt_tokens"]

                started = time.perf_counter()
                with ThreadPoolExecutor(level) as pool:
                    list(pool.map(one, range(requests)))
                wall = time.perf_counter() - started
                rows.append({
                    "workload": name, "concurrency": level, "requests": requests, "req_per_s": requests / wall,
                    "tokens_per_s": tokens[0] / wall, "p50_ms": 1000 * statistics.median(latencies),
                    "p95_ms": 1000 * _percentile(latencies, 95), "p99_ms": 1000 * _percentile(latencies, 99),
                })
    return rows


def _model_path(name: str) -> str:
    from mlops.base_models import ensure_base_model

    return ensure_base_model(name)["path"] if not Path(name).is_dir() else name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--limit", type=int, default=8, help="items per task in the eval comparison")
    parser.add_argument("--eval-models", default="tiny", help="models for the eval wall-time comparison")
    parser.add_argument("--tasks", default="", help="comma-separated task subset (default: all)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32, help="requests per throughput level")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--hf-threads", default="1,2", help="torch threads tried for in-process hf; the fastest is the reference")
    parser.add_argument("--engines", default="hf,llamacpp", help="engines the deployment-form eval is served on")
    args = parser.parse_args()
    tasks = [t for t in args.tasks.split(",") if t] or None
    report: dict = {"eval": [], "throughput": {}}
    for name in [m for m in args.eval_models.split(",") if m]:
        path = _model_path(name)
        by_threads = {int(n): in_process(path, args.limit, tasks, args.batch_size, int(n))
                      for n in args.hf_threads.split(",") if n}
        ref = min(by_threads.values())
        print("in-process hf by torch threads: " + ", ".join(f"{k}: {v:.1f} s" for k, v in by_threads.items()))
        for engine in [e for e in args.engines.split(",") if e]:
            quant = "q8_0" if engine == "llamacpp" else None
            if quant:  # the one-time conversion is a release step (`mlops release package`), not eval time
                from serving.engines.llamacpp.artifact import gguf_for

                gguf_for(Path(path), quant)
            wall, lm_part = deployment(path, args.limit, tasks, args.batch_size, args.concurrency, engine, quant)
            goal = 1.0 if engine == "llamacpp" else 1.5
            row = {"model": name, "engine": engine, "quantization": quant, "limit": args.limit, "deployment_s": wall,
                   "deployment_lm_eval_s": lm_part, "in_process_hf_s": ref, "in_process_hf_by_threads": by_threads,
                   "ratio": wall / ref, "ratio_excluding_server_start": lm_part / ref}
            report["eval"].append(row)
            print(f"eval wall  {name:8} served on {engine} {quant or ''} {wall:7.1f} s (lm-eval {lm_part:6.1f} s)  "
                  f"in-process hf {ref:7.1f} s  ratio {row['ratio']:.2f} (goal <= {goal}: "
                  f"{'met' if row['ratio'] <= goal else 'MISSED'}; {row['ratio_excluding_server_start']:.2f} without "
                  "server start)")
    for name in [m for m in args.models.split(",") if m]:
        rows = throughput(_model_path(name), [1, 4, 16], args.requests, args.max_tokens)
        report["throughput"][name] = rows
        for r in rows:
            print(f"serve {name:8} {r['workload']:5} c={r['concurrency']:<2} {r['req_per_s']:7.2f} req/s "
                  f"{r['tokens_per_s']:8.1f} tok/s  p50 {r['p50_ms']:7.0f} ms  p95 {r['p95_ms']:7.0f} ms  "
                  f"p99 {r['p99_ms']:7.0f} ms")
        base = {r["workload"]: r["req_per_s"] for r in rows if r["concurrency"] == 1}
        for r in rows:
            if r["concurrency"] > 1:
                print(f"  {name} {r['workload']} c={r['concurrency']} / c=1 throughput ratio "
                      f"{r['req_per_s'] / base[r['workload']]:.2f}")
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "bench_eval.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
