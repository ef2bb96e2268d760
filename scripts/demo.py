"""`make demo`: the whole release loop, as a newcomer meets it, on embedded defaults (SQLite, local artifacts).

Two rounds of data -> snapshot -> training -> deployment-form eval -> gates -> approval -> production, a served
model that follows the registry, a deliberately broken candidate the registry refuses, a rollback, and the loop
back (served requests with feedback become a round-3 increment, and `mlops loop check` builds its snapshot). It drives the real CLI; stages hand off through
MLflow run tags, `--json` output and registry aliases, never through printed text. Every act is keyed on what the
stored state already holds, so a rerun reuses it and ends with the same report.

  python scripts/demo.py                  # SmolLM2-135M on CPU (`make demo`)
  python scripts/demo.py --profile tiny   # the tiny model: the slow end-to-end test drives this
  python scripts/demo.py --quick          # `make demo-quick`: one round on the tiny model, in a few minutes
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_progress import Progress  # noqa: E402
from demo_serving import DemoServer, traffic_prompts  # noqa: E402

MODEL = "support-bot"
# Passphrases the registry accepts (12+ characters, 3 kinds, not the user's name), and no '!' for a shell to expand.
TRAINER = {"MLOPS_USER": "ada", "MLOPS_PASSWORD": "Lovelace-Demo-1843"}
APPROVER = {"MLOPS_USER": "grace", "MLOPS_PASSWORD": "Hopper-Demo-1906"}
ADMIN = {"MLOPS_USER": "admin", "MLOPS_PASSWORD": "Root-Demo-2026"}
# The evaluation service: a service identity the admin registers. It builds the snapshots and runs evals, gates and
# shadow reports, and signs each one's attestation; the release policy names it (by role) for that evidence.
SERVICE = {"MLOPS_USER": "ci-bot", "MLOPS_PASSWORD": "Service-Demo-2026"}
# The demo's eval config (configs/eval/demo.yaml): 12 items per task, so three evals fit the demo's time, with
# floors measured on the base model at that limit. `python -m evaluation.calibrate` scores every item.
PROFILES = {
    # Shorter than the recipe's 100 steps (the demo's time): round 1 at 60 steps still beats the base on the
    # business suite beyond the interval (0.275, [0.226, 0.325] against 0.186), and round 2 starts from v1's
    # weights: it adds the new round's data without having to relearn round 1's. The broken round is refused on
    # its contamination report before anything is scored, so its training only has to produce a version.
    "smollm2": {"base": "smollm2", "train": "configs/train/sft-smollm2-lora.yaml", "broken_steps": 2,
                "spot_n": 8, "shadow_requests": 20, "max_tokens": 48, "eval": [],
                "round1": ["train.max_steps=60", "train.eval_every=30", "train.checkpoint_every=30"],
                "round2": ["train.max_steps=20", "train.eval_every=10", "train.checkpoint_every=10"]},
    # The tiny model is random: its scores carry no signal, so the test holds it to no score floor.
    "tiny": {"base": "tiny", "train": "configs/train/tiny.yaml", "broken_steps": 4, "spot_n": 4,
             "shadow_requests": 6, "max_tokens": 8,
             "eval": ["eval.limit=3", "eval.gate.must_beat={}", "eval.gate.floors={}"],
             # served as the SmolLM2 recipe is (configs/train/sft-smollm2-lora.yaml), f16: its rows are too short for q8_0
             "form": ["train.serve_engine=llamacpp", "train.serve_quantization=f16"],
             # its random answers are a few characters against a corrected paragraph: no length ratio to gate on
             "pairs_build": ["data.pairs.max_length_ratio=1000"]},
}
EVAL_CONFIG = "configs/eval/demo.yaml"
STARTED = time.monotonic()
LLAMACPP_WAITED = False
QUICK_STEPS = [1, 2, 3, 4, 5]
FULL_ADDS = ("The full demo (`make demo`) goes on from here: a second round of data mixed with the first and "
             "trained from v1's weights, a shadow of it on live traffic, its release against the champion; a broken "
             "candidate the registry refuses; a rollback with the server following; and the loop back from served "
             "feedback to the next round's snapshot. On SmolLM2-135M, the loop took 28 minutes on 2 cores of an AMD "
             "EPYC with AVX-512, 37 without (measured).")


def sh(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    print("$ " + " ".join(shlex.quote(a) for a in args), flush=True)
    done = subprocess.run(args, env={**os.environ, **(env or {})}, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"demo stopped: `{' '.join(args)}` exited {done.returncode} (its message is above)")
    return done


def out_json(*args: str, env: dict | None = None):
    done = subprocess.run(args, env={**os.environ, **(env or {})}, text=True, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"demo stopped: `{' '.join(args)}` exited {done.returncode}:\n{done.stderr}{done.stdout}")
    return json.loads(done.stdout)


def mlflow_run(entry: str, *, env: dict | None = None, check: bool = True, **params: str):
    flags = [x for k, v in params.items() for x in ("-P", f"{k}={v}")]
    return sh("mlflow", "run", "mlproject", "-e", entry, "--env-manager", "local", "--experiment-name", "demo",
              *flags, env=env, check=check)


def latest_run(*tags: str, having: str) -> dict:
    return out_json("mlops", "tracking", "latest-run", *[x for t in tags for x in ("--tag", t)], "--having", having,
                    "--json")


def registry() -> dict:
    return out_json("mlops", "registry", "report", MODEL, "--json")


def acted(state: dict, action: str, version: str | None = None, to_stage: str | None = None) -> bool:
    return any(e["action"] == action and (version is None or e["version"] == version)
               and (to_stage is None or e["to_stage"] == to_stage) for e in state["ledger"])


# --------------------------------------------------------------------------- stages


def build_snapshot(config: str, name: str, *overrides: str) -> str:
    """A tracked snapshot build under `mlflow run`; the snapshot id comes back from the data run's tags."""
    mlflow_run("data", env=SERVICE, config=config, overrides=" ".join([f"run.run_name={name}", *overrides]))
    run = latest_run("mlops.stage=data", f"mlflow.runName={name}", having="mlops.data_snapshot_id")
    snapshot = run["tags"]["mlops.data_snapshot_id"]
    sh("mlops", "data", "show", snapshot)
    return snapshot


def train_and_register(p: dict, snapshot: str, name: str, *overrides: str) -> str:
    """Train on a snapshot (a rerun returns the finished run) and register it as the trainer; the version."""
    mlflow_run("train", config=p["train"], env=TRAINER,
               overrides=" ".join([f"train.snapshot={snapshot}", f"run.run_name={name}", *p.get("form", []),
                                   *overrides]))
    # By its snapshot, not its name: a rerun returns the finished run under the name it was first given.
    run = latest_run("mlops.stage=train", f"mlops.data_snapshot_id={snapshot}", having="mlops.model_content_id")
    version = out_json("mlops", "registry", "register", "--run", run["run_id"], "--name", MODEL, "--json",
                       env=TRAINER)["version"]
    print(f"training run {run['run_id']} ({name}) is models:/{MODEL}/{version}")
    return str(version)


def llamacpp_ready() -> None:
    """llama.cpp's one-time build starts with the install and goes on in the background (`make demo` starts once the
    Python side is in): the first step that serves a model waits for it here, and installs its bindings."""
    global LLAMACPP_WAITED
    if not LLAMACPP_WAITED:
        sh("bash", str(Path(__file__).resolve().parent / "llamacpp_background.sh"), "wait", sys.executable)
        LLAMACPP_WAITED = True


def eval_and_gate(p: dict, version: str) -> bool:
    """Deployment-form eval, then the gate against the champion now (floors and must_beat without one)."""
    llamacpp_ready()
    overrides = " ".join(p["eval"])
    mlflow_run("eval", env=SERVICE, model=f"models:/{MODEL}/{version}", suites="general,business",
               config=EVAL_CONFIG, overrides=overrides)
    # The release form is a quantized GGUF on llama.cpp: the quantization gate also needs the version as trained.
    # Unless the eval stopped at its contamination report: the gate refuses such a model on that report alone,
    # so it has no quantized score for the reference form to be compared with.
    if scored(version):
        mlflow_run("eval_reference", env=SERVICE, model=f"models:/{MODEL}/{version}", suites="general,business",
                   config=EVAL_CONFIG, overrides=overrides)
    # The gate counts only evals of the same suites and limit as its own config: the same config and overrides.
    gate = mlflow_run("gate", env=SERVICE, check=False, challenger=f"models:/{MODEL}/{version}",
                      champion=f"models:/{MODEL}@production", config=EVAL_CONFIG, overrides=overrides)
    print(f"gate of v{version}: {'passed' if gate.returncode == 0 else 'FAILED (the report above says why)'}")
    return gate.returncode == 0


def scored(version: str) -> bool:
    """Whether the newest deployment-form eval of a version served and scored it (eval.contamination.when_found=stop
    tags a model with leaked eval items mlops.eval_not_scored instead)."""
    run = latest_run("mlops.stage=eval", f"mlops.model_ref=models:/{MODEL}/{version}", "mlops.eval_reference=false",
                     having="mlops.model_key")
    return "mlops.eval_not_scored" not in run["tags"]


def spot_check(p: dict, version: str) -> None:
    """grace draws a blind sample and records a verdict per item (`demo_serving.review`, a scripted stand-in)."""
    from demo_serving import review

    check = out_json("mlops", "registry", "spot-check", "create", MODEL, version, "--n", str(p["spot_n"]),
                     "--seed", "7", "--json", env=APPROVER)
    check_id = check["check_id"]
    items = subprocess.run(["mlops", "registry", "spot-check", "export", check_id], capture_output=True, text=True,
                           check=True).stdout
    verdicts = Path(".mlops/demo") / f"spot-{check_id}.jsonl"
    verdicts.write_text("".join(json.dumps(review(json.loads(line))) + "\n" for line in items.splitlines() if line))
    sh("mlops", "registry", "spot-check", "import", str(verdicts), env=APPROVER)


def release(p: dict, version: str, state: dict, *, first: bool) -> None:
    """Spot-check, request (trainer), approve and promote (approver): the version goes to production."""
    spot_check(p, version)
    if first and not acted(state, "override", version):
        # The policy asks for shadow evidence, and a first release has no champion whose traffic it could shadow.
        sh("mlops", "registry", "override", MODEL, version, "--gate", "shadow", "--reason",
           "first release: no champion serves traffic yet to shadow", env=ADMIN)
    if not first:  # the shadow gate reads the stored report: the serving stage's comparison of the shadow's answers
        sh("mlops", "shadow", "report", MODEL, version, env=SERVICE)
    if not any(r.get("version") == version for r in state.get("pending", [])):
        sh("mlops", "registry", "request", MODEL, version, "--to", "production", "--comment",
           f"round {'1' if first else '2'} of the demo", env=TRAINER, check=False)
    sh("mlops", "registry", "approve", MODEL, version, "--comment", "gates, spot-check and shadow reviewed",
       env=APPROVER, check=False)  # a rerun after a crash may find it approved already: promote says if not
    sh("mlops", "registry", "promote", MODEL, version, "--to", "production", env=APPROVER)


PEOPLE = {"ada": ("trainer", TRAINER), "grace": ("approver", APPROVER), "ci-bot": ("service", SERVICE)}


def set_up_registry() -> None:
    """The registry's trust root, once: bootstrap (its key, the first admin, the project's release policy), then
    the demo's people, each added by the admin as a ledgered act. A rerun finds them and changes nothing."""
    if subprocess.run(["mlops", "registry", "user", "list", "--json"], capture_output=True, text=True,
                      env={**os.environ, **ADMIN}).returncode != 0:
        sh("mlops", "registry", "bootstrap", "--admin", "admin",
           env={**ADMIN, "MLOPS_NEW_PASSWORD": ADMIN["MLOPS_PASSWORD"]})
    known = {u["name"] for u in out_json("mlops", "registry", "user", "list", "--json", env=ADMIN)}
    for name, (role, who) in PEOPLE.items():
        if name not in known:
            sh("mlops", "registry", "user", "add", name, "--role", role,
               env={**ADMIN, "MLOPS_NEW_PASSWORD": who["MLOPS_PASSWORD"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default=os.environ.get("DEMO_PROFILE", "smollm2"))
    parser.add_argument("--quick", action="store_true", help="one round on the tiny model: register, eval, gate, "
                        "approve, promote, serve (a few minutes); the full demo reuses it")
    args = parser.parse_args()
    profile = "tiny" if args.quick else args.profile
    p = PROFILES[profile]
    steps = QUICK_STEPS if args.quick else list(range(1, 13))
    progress = Progress(profile, steps, out_dir=Path(".mlops/demo"))
    step, skip = progress.start, progress.skip
    Path(".mlops/demo").mkdir(parents=True, exist_ok=True)
    started = Path(".mlops/demo/started_at")
    if not started.exists():  # the harvest window: everything this demo home ever served
        started.write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    sh("mlops", "tracking", "init", "--experiment", "demo")
    set_up_registry()

    step(1, "base model and smoke check (converted once; a rerun is a no-op)")
    sh("mlops", "base-model", "import", p["base"])
    mlflow_run("smoke", base_model=p["base"], max_new_tokens="16")

    step(2, "round-1 snapshot: sample data -> cleaned, PII-scrubbed, deduplicated, GE-gated, tokenized")
    sh("mlops", "data", "sample", "--out", "data/generated")
    sh("mlops", "data", "sample", "--round", "2", "--out", "data/generated-round2")
    # Round 1 also runs the model-based steps: semantic dedup (all-MiniLM-L6-v2) and the perplexity filter, scored
    # by the base model being fine-tuned on each record's first 32 tokens.
    round1 = build_snapshot("configs/data/sample.yaml", "data-round1", "data.dedup.semantic=true",
                            "data.filters.perplexity.enabled=true", f"data.filters.perplexity.model={p['base']}",
                            "data.filters.perplexity.max_tokens=32")

    step(3, "round 1: train (LoRA under DeepSpeed), register as ada, eval in deployment form, gate on floors")
    v1 = train_and_register(p, round1, f"train-round1-{p['base']}", *p.get("round1", []))
    state = registry()
    release_v1 = f"release v{v1}: spot-check and approval by grace (four-eyes), promote to production"
    if not acted(state, "promote", v1, "production"):
        eval_and_gate(p, v1)
        step(4, release_v1)
        release(p, v1, state, first=True)
    else:
        skip(4, release_v1, "done before")

    step(5, "serve production with --follow, shadowing the newest candidate")
    llamacpp_ready()
    with DemoServer(MODEL, log=Path(".mlops/demo/serve.log")) as server:
        if not server.served_before():  # a rerun adds no traffic: the harvest stays the same
            server.send(traffic_prompts(4), max_tokens=p["max_tokens"], feedback=True)
        if args.quick:
            sh("mlops", "registry", "verify", MODEL)
            print("\n" + finish(progress) + f"\n\nquick demo finished in {(time.monotonic() - STARTED) / 60:.1f} "
                  f"min: v{v1} is in production and served.\n{FULL_ADDS}")
            return

        step(6, "round-2 snapshot: new data mixed 7:3 with round 1, deduplicated against it")
        round2 = build_snapshot("configs/data/sample-round2.yaml", "data-round2",
                                f"data.mix.history.snapshot={round1}", f"data.dedup.against_snapshots=[{round1}]")

        step(7, f"round 2: continue training from v{v1} on the round-2 snapshot, register (the server starts "
             "shadowing it), eval, gate against the champion")
        # From the released weights, not from the base model: starting over on 30% of round 1's data made round 2
        # forget billing and refunds facts, and the gate refused it (-0.23 and -0.21 on those dimensions).
        v2 = train_and_register(p, round2, f"train-round2-{p['base']}", f"base_model=models:/{MODEL}/{v1}",
                                *p.get("round2", []))
        state = registry()
        release_v2 = f"release v{v2}: spot-check against v{v1} by grace, approve, promote; the server switches"
        if not acted(state, "promote", v2, "production"):
            server.wait_for_shadow(v2)
            server.send(traffic_prompts(p["shadow_requests"], offset=4), max_tokens=p["max_tokens"], feedback=True)
            server.wait_for_shadow_rows(v2, p["shadow_requests"])
            sh("mlops", "shadow", "report", MODEL, v2, env=SERVICE)
            eval_and_gate(p, v2)
            step(8, release_v2)
            release(p, v2, state, first=False)
            server.wait_for_version(v2, max_tokens=p["max_tokens"])
        else:
            skip(8, release_v2, "done before")

        step(9, "a broken candidate: a round whose build skipped decontamination (the eval set leaked in)")
        leaky = build_snapshot("configs/data/sample.yaml", "data-broken", "data.name=support-sample-leaky",
                               "data.decontam.eval_sets=[]")
        v3 = train_and_register(p, leaky, f"train-broken-{p['base']}", f"train.max_steps={p['broken_steps']}")
        state = registry()
        if not next(v for v in state["versions"] if v["version"] == v3)["gate"]:
            eval_and_gate(p, v3)
        sh("mlops", "registry", "request", MODEL, v3, "--to", "production", "--comment", "broken round",
           env=TRAINER, check=False)
        refused = sh("mlops", "registry", "approve", MODEL, v3, "--comment", "try it", env=APPROVER, check=False)
        if refused.returncode == 0:
            raise SystemExit(f"demo stopped: the registry approved the broken v{v3}")
        print(f"the registry refused v{v3} (exit {refused.returncode}); it stays a candidate")

        step(10, f"roll production back to v{v1} with a reason; the server switches back")
        if not acted(registry(), "rollback"):
            sh("mlops", "registry", "rollback", MODEL, "--to", v1, "--reason",
               f"demo: customers report v{v2} answers regressed", env=APPROVER)
        server.wait_for_version(v1, max_tokens=p["max_tokens"])

    step(11, "the loop back: served requests with thumbs-down and corrections -> a reviewed round-3 increment; "
         "`mlops loop check` opens round 3 by the recorded policy and builds its snapshot (it never promotes)")
    sh("mlops", "data", "harvest", "--since", started.read_text().strip(), "--out", "data/harvest/round3",
       "--model", MODEL)
    accept_corrections(Path("data/harvest/round3/increment.jsonl"))
    sh("mlops", "data", "harvest", "accept", "data/harvest/round3")
    # The history is production's own snapshot (v1 after the rollback: round 1), read from the ledger.
    sh("mlops", "loop", "check", MODEL, "--increment", "data/harvest/round3", "--config", "configs/data/sample.yaml",
       "--experiment", "demo")

    step(12, "the release report, read back from the stored state")
    sh("mlops", "registry", "report", MODEL)
    sh("mlops", "registry", "verify", MODEL)
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    print("\nwhere the time went (also in .mlops/demo/timings.md and the demo-report run):\n" + finish(progress))
    print("\nNext, preference tuning from the same feedback: `make demo-dpo` (pairs from the corrections and the "
          "shadow's answers, DPO from production, the held-out pair accuracy and the gate; about 10 min)")
    print(f"\nLook at it with:\n  .venv/bin/mlflow ui --backend-store-uri {uri}   # runs by stage, model and "
          f"round\n  make app                                   # the release-approval app on the same store\n"
          f"demo finished in {(time.monotonic() - STARTED) / 60:.1f} min")


def finish(progress: Progress) -> str:
    """The closing table of step times, saved beside the demo and as the artifacts of its report run."""
    from mlops.tracking import tracked_run

    table = progress.finish()
    with tracked_run("demo", run_name="demo-report", tags={"mlops.stage": "report"}, attach_env_run=False) as run:
        for name in ("timings.md", "timings.json"):
            run.log_artifact(progress.out_dir / name, "demo")
    return table


def accept_corrections(path: Path) -> None:
    """The reviewer's part of the harvest, scripted: accept every row that carries a correction."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        if row["accepted"] is None:
            row["accepted"] = bool((row.get("correction") or "").strip())
            row["note"] = "demo review: the agent's correction is right" if row["accepted"] else "no correction"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{sum(r['accepted'] for r in rows)} of {len(rows)} harvested requests accepted")


if __name__ == "__main__":
    main()
