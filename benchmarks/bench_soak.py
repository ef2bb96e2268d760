"""Soak `mlops serve` (with a 20% shadow and the request log) under mixed load for as long as you like.

Answers, streams, poison bodies, clients that leave mid-stream, and feedback posts, from `--clients` clients
against a server this script starts on 127.0.0.1; per window: RSS, p50/p95 latency, 5xx and unexpected
outcomes; then the drift of the last third against the first (`serving.soak`). Goals: RSS ratio
<= 1.10, p50 ratio <= 1.5 on a quiet machine, no 5xx, nothing unexpected. The load average is printed before and
after: on a shared 2-core machine only runs that start quiet are comparable.

    python benchmarks/bench_soak.py --seconds 600           # ten minutes, tiny model
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or an HF folder")
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--shadow-share", type=float, default=0.2)
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    from bench_shadow import _start

    from mlops.base_models import ensure_base_model
    from serving.soak import render, soak

    print(f"load average before: {os.getloadavg()}")
    model = args.model if Path(args.model).is_dir() else ensure_base_model(args.model)["path"]
    home = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    proc, url = _start(str(model), home, "soak", ["--shadow", str(model), "--shadow-share", str(args.shadow_share)])
    try:
        report = soak(url, seconds=args.seconds, clients=args.clients, window_s=args.seconds / args.windows,
                      pid=proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    print(render(report))
    print(f"server exit code after SIGTERM: {code} (goal 0); server log: {home / 'soak.log'}")
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    raise SystemExit(1 if report["errors_5xx"] or report["unexpected"] or code else 0)


if __name__ == "__main__":
    main()
