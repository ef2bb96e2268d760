#!/usr/bin/env bash
# llama.cpp's one-time build runs in the background of the install, and whoever needs it first waits for it:
# `make install` at its end, `make demo` only before its first deployment-form eval (minutes into the loop), so a
# fresh machine's build overlaps the demo's first steps instead of holding the whole demo back.
#   start VENV_PYTHON  begin the compile (build_llamacpp.sh --build-only) at the lowest CPU priority, so it takes
#                      what the pip installs and the demo leave idle; a no-op while one is running
#   wait VENV_PYTHON   wait for a started compile (or compile here when none was started or the last one failed),
#                      then install the bindings and write the venv's llamacpp.json (build_llamacpp.sh)
# The bindings are installed by `wait`, never in the background: two pip installs into one venv can collide.
set -euo pipefail
usage="usage: llamacpp_background.sh start|wait VENV_PYTHON"
cmd=${1:?$usage}
PY=${2:?$usage}
VENV=$(dirname "$(dirname "$PY")")
HERE=$(cd "$(dirname "$0")" && pwd)
PID=$VENV/llamacpp-build.pid RC=$VENV/llamacpp-build.rc LOG=$VENV/llamacpp-build.log

running() { [ -f "$PID" ] && kill -0 "$(cat "$PID")" 2>/dev/null && [ ! -f "$RC" ]; }

case $cmd in
start)
  running && exit 0
  rm -f "$RC"
  # Detached from the caller's output (a `make demo | tee` would otherwise wait for it); its exit status in $RC.
  (rc=0; nice -n 19 bash "$HERE/build_llamacpp.sh" "$PY" --build-only >"$LOG" 2>&1 || rc=$?; echo "$rc" >"$RC") \
    </dev/null >/dev/null 2>&1 &
  echo $! >"$PID"
  ;;
wait)
  if running; then
    echo "waiting for llama.cpp's one-time build, started with the install (log: $LOG)"
    started=$SECONDS
    while running; do sleep 2; done
    echo "llama.cpp's build ended (waited $((SECONDS - started)) s)"
  fi
  if [ -f "$RC" ] && [ "$(cat "$RC")" != 0 ]; then
    cat "$LOG"
    rm -f "$RC" "$PID"  # the next try builds in the foreground instead of reading this failure again
    echo "llama.cpp build failed (log above). Fix: see the log's last error, then rerun."
    exit 1
  fi
  # Ready already: the venv's manifest (written last, after the bindings) names a built llama-server and no compile
  # has finished since. A caller whose environment differs from the install's (another MLOPS_LLAMACPP_CACHE, as in
  # a test's clean environment) must not start a second build.
  if [ -f "$VENV/llamacpp.json" ] && ! [ "$RC" -nt "$VENV/llamacpp.json" ] && "$PY" -c 'import json, pathlib, sys
sys.exit(not pathlib.Path(json.load(open(sys.argv[1]))["bin"], "llama-server").is_file())' "$VENV/llamacpp.json"; then
    exit 0
  fi
  bash "$HERE/build_llamacpp.sh" "$PY"  # cached: the bindings alone; never started: the whole build, here
  ;;
*)
  echo "$usage" >&2
  exit 2
  ;;
esac
