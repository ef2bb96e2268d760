"""Registry transitions: latency of promote and rollback against a bare alias move, and a 20-process race.

Run: .venv/bin/python benchmarks/bench_registry.py [--iterations 30] [--racers 20] [--rounds 3] [--no-postgres]
Prints, for SQLite and PostgreSQL: p50/p95 of a bare `set_registered_model_alias`, of a governed promotion to
staging (compare-and-set + ledger), to production (plus approvals and every gate read from stored evidence) and of a
rollback (plus the artifact hash check), the ratios to the bare call; then processes racing to promote conflicting
versions: winners per round (must be exactly 1) and rounds/s, and whether `verify` is clean afterwards.
Goals: p95 < 100 ms and <= 3x the bare call for promote and rollback; exactly one winner per round.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLOPS_NO_REAP", "1")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1000


DISPLAY: list[float] = []


def timed(fn) -> float:
    """One act's latency: serialized, verified, gated and committed to the ledger, when it is in force for every
    consumer. MLflow's display copies it leaves (aliases, stage tags) are written after it by a writer that holds
    the act lock, so they are flushed before the clock starts and timed on their own line."""
    from registry.transition import flush_display

    flushed = time.perf_counter()
    flush_display()
    DISPLAY.append(time.perf_counter() - flushed)
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def setup(home: Path, uri: str, tiny: dict, n_versions: int):
    os.environ["MLOPS_HOME"] = str(home)
    os.environ["MLFLOW_TRACKING_URI"] = uri
    from mlops.tracking import init_experiment
    from registry.release import register
    from registry.testing import make_identities, training_run

    init_experiment("registry-test")
    who = make_identities()
    runs = [training_run(Path(tiny["path"]), tmp=home, variant=i) for i in (1, 2)]
    versions = [register(who["tina"], r, "bot") for r in runs]
    return who, versions, runs[0]


def latencies(who, versions, iterations: int) -> dict[str, list[float]]:
    from mlops.tracking import client
    from registry.audit import model_state
    from registry.release import decide, promote, request, rollback
    from registry.testing import gate_evidence

    c = client()
    v1, v2 = versions
    bare = [timed(lambda i=i: c.set_registered_model_alias("bot", "bench", versions[i % 2]))
            for i in range(iterations)]
    staging = []
    for i in range(iterations):
        staging.append(timed(lambda i=i: promote(who["bob"], "bot", versions[i % 2], "staging")))
    # v1 to production once (floors), then cycle: v2 up to production, rollback to v1.
    content = {v: model_state("bot").versions[v].content_id for v in versions}
    gate_evidence("bot", v1)
    if model_state("bot").stage_of(v1) != "staging":
        promote(who["bob"], "bot", v1, "staging")
    request(who["tina"], "bot", v1, "production", "bench")
    decide(who["alice"], "bot", v1, "bench", approve=True)
    promote(who["bob"], "bot", v1, "production")
    gate_evidence("bot", v2, champion=(v1, content[v1]))
    production, rollbacks = [], []
    for _ in range(iterations):
        if model_state("bot").stage_of(v2) == "rolled_back":
            promote(who["bob"], "bot", v2, "staging")
        request(who["tina"], "bot", v2, "production", "bench")
        decide(who["alice"], "bot", v2, "bench", approve=True)
        production.append(timed(lambda: promote(who["bob"], "bot", v2, "production")))
        rollbacks.append(timed(lambda: rollback(who["bob"], "bot", "bench")))
    return {"bare alias move": bare, "promote to staging": staging, "promote to production": production,
            "rollback": rollbacks, "display copies (async)": [d for d in DISPLAY if d > 0.001] or [0.0]}


def race_rounds(who, home: Path, tiny: dict, racers: int, rounds: int) -> dict:
    from registry.audit import verify
    from registry.release import register
    from registry.testing import race, training_run

    model = f"race-{uuid.uuid4().hex[:6]}"
    runs = [training_run(Path(tiny["path"]), tmp=home / "race", variant=100 + i) for i in range(racers)]
    versions = [register(who["tina"], run_id, model) for run_id in runs]
    winners, expected, started = [], "none", time.perf_counter()
    for _ in range(rounds):
        pool = [v for v in versions if v != expected]
        outcomes = race(model, pool, "staging", expected=expected)
        won = [o["version"] for o in outcomes if o["won"]]
        winners.append(len(won))
        expected = won[0] if won else expected
    wall = time.perf_counter() - started
    return {"winners_per_round": winners, "rounds_per_s": rounds / wall, "verify_clean": verify(model).ok}


def report(name: str, lat: dict[str, list[float]], race: dict) -> None:
    bare95 = pct(lat["bare alias move"], 0.95)
    print(f"\n== {name}")
    print(f"{'operation':24} {'p50 ms':>8} {'p95 ms':>8} {'p95 / bare':>11}  goal")
    for op, values in lat.items():
        ratio = pct(values, 0.95) / bare95 if bare95 else float("nan")
        goal = "" if op in ("bare alias move", "display copies (async)") else ("met" if pct(values, 0.95) < 100 and ratio <= 3 else "MISSED")
        print(f"{op:24} {pct(values, 0.5):8.1f} {pct(values, 0.95):8.1f} {ratio:11.2f}  {goal}")
    ok = all(w == 1 for w in race["winners_per_round"])
    print(f"race: winners per round {race['winners_per_round']} ({'exactly one: met' if ok else 'MISSED'}), "
          f"{race['rounds_per_s']:.2f} rounds/s (process start included), verify clean: {race['verify_clean']}")


def postgres_url() -> str | None:
    try:
        import psycopg

        admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True, connect_timeout=3)
    except Exception as err:  # noqa: BLE001
        print(f"PostgreSQL not reachable ({err}): skipping it")
        return None
    name = f"mlops_bench_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--racers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    from mlops.base_models import import_base_model

    root = Path(tempfile.mkdtemp(prefix="bench-registry-"))
    tiny = import_base_model("tiny", root=root / "models")
    stores = [("SQLite (embedded)", lambda home: f"sqlite:///{home}/.mlops/mlflow.db")]
    if not args.no_postgres and (pg := postgres_url()):
        stores.append(("PostgreSQL", lambda home: pg))
    for name, uri_of in stores:
        home = root / name.split()[0].lower()
        home.mkdir(parents=True)
        who, versions, _ = setup(home, uri_of(home), tiny, 2)
        lat = latencies(who, versions, args.iterations)
        report(name, lat, race_rounds(who, home, tiny, args.racers, args.rounds))
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
