"""`llama-server` as a child process on a free loopback port: started, health-checked, stopped with its owner.

Only our gateway talks to it (127.0.0.1, no key of its own); its log goes to a file beside the model's cache
so a failure to start can be quoted in the error.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from mlops.child_env import child_env, new_home, remove_home
from mlops.errors import MLOpsError

log = logging.getLogger("mlops.serve")


class LlamaServerError(MLOpsError):
    """llama-server did not start, or died."""


class LlamaServer:
    def __init__(self, binary: Path, gguf: Path, *, threads: int, batch_threads: int, parallel: int,
                 ctx_per_slot: int, start_timeout: float = 120.0) -> None:
        from mlops.files import free_port

        self.gguf, self.port = gguf, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        cmd = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(threads), "-tb", str(batch_threads), "-np", str(parallel),
               "-c", str(parallel * ctx_per_slot), "--cont-batching", "--no-webui", "--metrics",
               "--no-warmup", "-lv", "2"]
        # None of our secrets (the registry's URL and credentials): it parses a file a trainer produced.
        self._home = new_home("mlops-llama-server-")
        # Its own process group: a SIGINT meant for `mlops serve` must not kill it before we drain.
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, env=child_env(self._home))
        atexit.register(self.stop)  # a server that exits without closing its engines leaves no llama-server behind
        self._wait_ready(start_timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                hint = ("it died of SIGILL: this llama.cpp build uses instructions this CPU does not run. Fix: "
                        "delete its folder under ~/.cache/mlops-llm and run `make install` to rebuild it"
                        if code == -4 else "Fix: read its log above (a truncated or foreign GGUF fails here)")
                raise LlamaServerError(f"llama-server exited with {code} while loading {self.gguf}:"
                                       f"\n{self.log_tail()}\n{hint}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise LlamaServerError(f"llama-server did not load {self.gguf} within {timeout:.0f} s "
                               f"(serve.llamacpp.start_timeout):\n{self.log_tail()}")

    def alive(self) -> bool:
        return self._proc.poll() is None

    def log_tail(self, lines: int = 12) -> str:
        try:
            return "\n".join(Path(self._log.name).read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> None:
        atexit.unregister(self.stop)
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)
        remove_home(self._home)
