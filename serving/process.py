"""The model server as a child process: started on a free port, awaited on /ready, stopped, its log kept.

The server runs with API keys like any other: the process makes a fresh key for this one server (its hash in a
keys file beside the log, the key only in memory here) and clients send `headers`. Another local user who
finds the port cannot use the model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from mlops.errors import MLOpsError
from mlops.files import free_port


class ServerError(MLOpsError):
    """The model server could not start, or died while in use."""


class ServerProcess:
    """`mlops serve` for one HF folder and profile file, as a context manager."""

    def __init__(self, hf_dir: Path, profile_file: Path, name: str, log_path: Path, *, force_profile: bool = False,
                 threads: int | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.keys_file = self.log_path.with_name(f"{self.log_path.stem}.api_keys.json")
        self.api_key = ""
        self.command = [
            sys.executable, "-m", "mlops", "serve", "--model", str(hf_dir), "--profile", str(profile_file),
            "--name", name, "--host", "127.0.0.1", "--port", str(self.port), "--keys-file", str(self.keys_file),
            *(["--force-profile"] if force_profile else []),
            *(["--threads", str(threads)] if threads else []),
            "serve.request_log.enabled=false",  # eval traffic is no user traffic: never harvested or spot-checked
        ]
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def headers(self) -> dict[str, str]:
        """What a client sends to be let in."""
        return {"Authorization": f"Bearer {self.api_key}"}

    def start(self, timeout: float) -> ServerProcess:
        """Launch and wait for /ready."""
        self.launch()
        self.wait_healthy(timeout)
        return self

    def launch(self) -> ServerProcess:
        """Start the process without waiting, so the caller can prepare work while the model loads."""
        from serving.auth import add_key

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.keys_file.unlink(missing_ok=True)
        self.api_key, _ = add_key(self.keys_file, "eval-runner")
        self._log = self.log_path.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("MLFLOW_RUN_ID", None)  # the server is no run of its own
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        return self

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"the model server exited with code {self.proc.returncode} before it was healthy. "
                    f"Its log ({self.log_path}) ends with:\n{self.log_tail()}\nFix: see the log above."
                )
            try:
                with urllib.request.urlopen(f"{self.url}/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerError(
            f"the model server was not ready (/ready) within {timeout:.0f} s. Its log ends with:\n{self.log_tail()}\n"
            "Fix: raise eval.server_start_timeout, or check the log for a stuck model load."
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def max_model_len(self) -> int:
        """The context the served model takes per request (the engine's, where it holds less than the profile)."""
        import httpx

        models = httpx.get(f"{self.url}/v1/models", headers=self.headers, timeout=30).json()["data"]
        return int(models[0]["max_model_len"])

    def check_alive(self) -> None:
        if not self.alive():
            code = self.proc.returncode if self.proc else None
            raise ServerError(
                f"the model server died during the eval (exit code {code}); no scores were recorded. "
                f"Its log ends with:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
