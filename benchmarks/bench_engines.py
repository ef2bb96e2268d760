"""The serving engines side by side in one run, on one model and one GGUF.

Streaming chat, `--max-tokens` new tokens per request, at concurrency 1, 4, 16 and 32: aggregate completion
tokens/s, TTFT and latency p50/p95/p99 for
- `hf` behind our gateway (`mlops serve`, float32 torch: the reference engine);
- `llamacpp` behind our gateway (`mlops serve`, the q8_0 GGUF: the CPU deployment form);
- bare `llama-server` on the same GGUF with the same threads and slots (no gateway: auth, limits, logs).
Goals (issue 21): llamacpp >= 5x hf at c=16; llamacpp >= 0.9x bare llama-server at c=16 (gateway overhead
<= 10%); the gateway adds <= 5 ms to TTFT p50 at c=1.

Traffic goes only to servers this script starts on 127.0.0.1; request counts are bounded. The load average
is printed before and after: on a shared 2-core machine only runs that start quiet are comparable.

    python benchmarks/bench_engines.py                 # SmolLM2-135M (`make bench`)
    python benchmarks/bench_engines.py --model tiny --requests 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.bench_serve import _body, _level, _stream  # noqa: E402 - bench_serve's load generator

LEVELS = (1, 4, 16, 32)


async def _levels(url: str, headers: dict, args) -> list[dict]:
    import httpx

    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as client:
        await _stream(client, _body(0, args.max_tokens))  # warm up
        return [await _level(client, c, max(args.requests, c), args.max_tokens) for c in LEVELS]


def gateway(path: Path, engine: str, args) -> list[dict]:
    from mlops.profile import load_profile
    from serving.process import ServerProcess

    work = Path(tempfile.mkdtemp(prefix=f"bench-{engine}-"))
    quant = "q8_0" if engine == "llamacpp" else None
    profile = load_profile(path).model_copy(update={"engine": engine, "quantization": quant})
    profile_file = profile.save_as(work / "profile.yaml")
    os.environ["MLOPS_SERVE_THREADS"] = str(args.threads)
    server = ServerProcess(path, profile_file, "bench", work / "server.log", force_profile=True)
    server.command += [f"serve.llamacpp.parallel={args.parallel}", f"serve.max_batch_rows={args.parallel}"]
    with server:
        server.start(900)
        return asyncio.run(_levels(server.url, server.headers, args))


def bare_llama_server(gguf: Path, args) -> list[dict]:
    from serving.engines.llamacpp.install import find_install
    from serving.engines.llamacpp.server_process import LlamaServer

    server = LlamaServer(find_install().server, gguf, threads=args.threads, batch_threads=args.threads,
                         parallel=args.parallel, ctx_per_slot=2048)
    try:
        return asyncio.run(_levels(server.url, {}, args))
    finally:
        server.stop()


def _row(name: str, r: dict) -> str:
    return (f"{name:16} c={r['concurrency']:<2} {r['tokens_per_s']:7.1f} tok/s  TTFT p50/p95/p99 "
            f"{r['ttft_p50_ms']:6.0f}/{r['ttft_p95_ms']:6.0f}/{r['ttft_p99_ms']:6.0f} ms  latency p50/p95/p99 "
            f"{r['p50_ms']:6.0f}/{r['p95_ms']:6.0f}/{r['p99_ms']:6.0f} ms  failures {r['innocent_failures']}")


def verdicts(report: dict) -> list[str]:
    def at(name: str, c: int) -> dict:
        return next(r for r in report[name] if r["concurrency"] == c)

    hf, ours, bare = at("hf", 16), at("llamacpp", 16), at("llama-server", 16)
    speedup = ours["tokens_per_s"] / hf["tokens_per_s"]
    share = ours["tokens_per_s"] / bare["tokens_per_s"]
    added = at("llamacpp", 1)["ttft_p50_ms"] - at("llama-server", 1)["ttft_p50_ms"]
    mark = {True: "met", False: "MISSED"}
    return [f"llamacpp vs hf at c=16: {speedup:.2f}x (goal >= 5: {mark[speedup >= 5]})",
            f"llamacpp behind the gateway vs bare llama-server at c=16: {share:.2f}x (goal >= 0.9: {mark[share >= 0.9]})",
            f"TTFT p50 added by the gateway at c=1: {added:+.1f} ms (goal <= 5 ms: {mark[added <= 5]})"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="a base model name (smollm2, tiny) or an HF folder")
    parser.add_argument("--requests", type=int, default=16, help="requests per level (at least c)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="compute threads of every engine (1 survives a "
                        "busy neighbour on 2 cores)")
    parser.add_argument("--parallel", type=int, default=16, help="llama.cpp slots / hf rows decoded together")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from mlops.base_models import ensure_base_model
    from serving.engines.llamacpp.artifact import gguf_for

    path = Path(args.model) if Path(args.model).is_dir() else Path(ensure_base_model(args.model)["path"])
    gguf = gguf_for(path, "q8_0")  # converted once (llama.cpp's own converter and quantizer), shared by both
    print(f"model {path}, GGUF {gguf} ({gguf.stat().st_size / 2**20:.0f} MB), threads {args.threads}, "
          f"slots {args.parallel}, {args.max_tokens} new tokens per request")
    print(f"load average before: {os.getloadavg()}")
    report = {"llama-server": bare_llama_server(gguf, args), "llamacpp": gateway(path, "llamacpp", args),
              "hf": gateway(path, "hf", args)}
    for name, rows in report.items():
        for r in rows:
            print(_row(name, r))
    for line in verdicts(report):
        print(line)
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    failures = sum(r["innocent_failures"] for rows in report.values() for r in rows)
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
