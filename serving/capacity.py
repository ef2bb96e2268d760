"""`mlops release capacity`: what one server of a version sustains, measured before release and stored on it.

The version is served as its profile says (engine, quantization) by a server process of its own on 127.0.0.1;
streamed chats at rising concurrency give latency by concurrency up to the knee (the smallest concurrency
whose throughput is within `knee_share` of the ceiling: beyond it more clients only wait longer) and the
throughput ceiling; a soak at the knee then reports RSS and tokens/s per window, and their drift (last window
over first). The report is logged on a capacity run and named on the version (`mlops.capacity_run_id`).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from mlops.lineage import Tag

LEVELS = (1, 2, 4, 8, 16, 32)


def knee(rows: list[dict], share: float = 0.9) -> dict:
    """The smallest concurrency reaching `share` of the best throughput measured."""
    ceiling = max(r["tokens_per_s"] for r in rows)
    return next(r for r in sorted(rows, key=lambda r: r["concurrency"]) if r["tokens_per_s"] >= share * ceiling)


def drift(windows: list[dict], key: str) -> float:
    first, last = windows[0][key], windows[-1][key]
    return last / first if first else float("nan")


async def _measure(url: str, headers: dict, rss, *, name, levels, requests, max_tokens, soak_s, windows,
                   share) -> dict:
    import functools

    import httpx

    from mlops.errors import MLOpsError
    from serving import loadgen

    level = functools.partial(loadgen.level, model=name)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as client:
        warm = await level(client, 1, 1, max_tokens)
        if warm["failures"]:
            raise MLOpsError(f"the server of '{name}' at {url} answered no streamed chat; nothing to measure. "
                             "Its log is kept beside the capacity run's work folder.")
        rows = [await level(client, c, max(requests, c), max_tokens) for c in levels]
        at = knee(rows, share)
        soak, deadline = [], time.monotonic() + soak_s
        per_window = max(1.0, soak_s / windows)
        while time.monotonic() < deadline or not soak:
            started = time.monotonic()
            window = []
            while time.monotonic() - started < per_window:
                window.append(await level(client, at["concurrency"], at["concurrency"], max_tokens))
            wall = sum(w["wall_s"] for w in window)
            soak.append({"t_s": round(time.monotonic() - deadline + soak_s, 1), "rss_mb": rss() / 2**20,
                         "tokens_per_s": sum(w["tokens_per_s"] * w["wall_s"] for w in window) / wall,
                         "failures": sum(w["failures"] for w in window)})
    return {"levels": rows, "knee": at, "ceiling_tokens_per_s": max(r["tokens_per_s"] for r in rows),
            "soak": soak, "rss_drift": drift(soak, "rss_mb"), "tokens_per_s_drift": drift(soak, "tokens_per_s"),
            "failures": sum(r["failures"] for r in rows) + sum(w["failures"] for w in soak)}


def measure_capacity(ref: str, *, levels=LEVELS, requests: int = 16, max_tokens: int = 32, soak_s: float = 60.0,
                     windows: int = 6, share: float = 0.9, experiment: str = "capacity") -> tuple[str, dict]:
    """(capacity run id, report) for `ref` served in its deployment form."""
    import psutil

    from mlops.model_refs import resolve_model_ref
    from serving.process import ServerProcess

    model = resolve_model_ref(ref)
    profile = model.profile()

    def rss_of(pid: int):
        def rss() -> int:
            proc = psutil.Process(pid)  # the gateway and its engine's children (llama-server)
            return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
        return rss

    with tempfile.TemporaryDirectory(prefix="capacity-") as tmp:
        work = Path(tmp)
        profile_file = profile.save_as(work / "deployment_profile.yaml")
        with ServerProcess(model.hf_dir, profile_file, model.served_name, work / "server.log") as server:
            server.start(600)
            report = asyncio.run(_measure(server.url, server.headers, rss_of(server.proc.pid),
                                          name=model.served_name, levels=levels,
                                          requests=requests, max_tokens=max_tokens, soak_s=soak_s, windows=windows,
                                          share=share))
        report.update({"model_ref": ref, "deployment_form": profile.deployment_form(), "max_tokens": max_tokens,
                       "knee_share": share, "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        return _log_capacity(model, report, work / "server.log", experiment), report


def _log_capacity(model, report: dict, server_log: Path, experiment: str) -> str:
    """The capacity run (report, metrics, server log), named on the version; returns its id."""
    from mlops.lineage import collect_lineage
    from mlops.model_refs import set_version_tags
    from mlops.tracking import tracked_run

    form = report["deployment_form"]
    lineage = collect_lineage("capacity", 0, extra={Tag.STAGE: "capacity", Tag.MODEL_REF: report["model_ref"],
                                                    Tag.MODEL_KEY: model.key, Tag.EVAL_ENGINE: form})
    with tracked_run(experiment, run_name=f"capacity {model.served_name} on {form}", tags=lineage.as_tags()) as run:
        run.log_dict(report, "capacity/capacity.json")
        run.log_metrics({"ceiling_tokens_per_s": report["ceiling_tokens_per_s"],
                         "knee_concurrency": report["knee"]["concurrency"], "rss_drift": report["rss_drift"],
                         "tokens_per_s_drift": report["tokens_per_s_drift"]}, step=0)
        run.log_artifact(server_log, "capacity")
        set_version_tags(model, {Tag.CAPACITY_RUN: run.run_id})
        return run.run_id


def render(report: dict) -> str:
    lines = [f"capacity of {report['model_ref']} on {report['deployment_form']} ({report['max_tokens']} new tokens "
             "per streamed chat)"]
    for r in report["levels"]:
        mark = "  <- knee" if r["concurrency"] == report["knee"]["concurrency"] else ""
        lines.append(f"  c={r['concurrency']:<3} {r['tokens_per_s']:8.1f} tok/s  latency p50/p95/p99 "
                     f"{r['p50_ms']:6.0f}/{r['p95_ms']:6.0f}/{r['p99_ms']:6.0f} ms  TTFT p50 {r['ttft_p50_ms']:5.0f} ms"
                     f"{mark}")
    lines.append(f"  ceiling {report['ceiling_tokens_per_s']:.1f} tok/s; knee at c={report['knee']['concurrency']}")
    lines.append(f"  soak at the knee, {len(report['soak'])} windows: RSS {report['soak'][0]['rss_mb']:.0f} -> "
                 f"{report['soak'][-1]['rss_mb']:.0f} MB (drift {report['rss_drift']:.2f}), tokens/s drift "
                 f"{report['tokens_per_s_drift']:.2f}; failures {report['failures']}")
    return "\n".join(lines)
