"""A real Ray cluster for tests: a head and more nodes started with `ray start`, as an operator would, on this
machine, in a private temp dir with their own ports.

Each node is its own process group (start_new_session), and `stop()` ends exactly the processes of this
cluster (the groups and everything under them, found by process tree and by the private temp dir): never
`ray stop`, which would end every Ray on the machine, other people's included.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

RAY = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))  # the kernel's ephemeral range, clear of Ray's worker ports (10002-19999)
        return s.getsockname()[1]


class RayCluster:
    def __init__(self, nodes: int = 2, cpus_per_node: int = 1, object_store_mb: int = 200, *,
                 dashboard: bool = False, head_cpus: int | None = None, env: dict | None = None) -> None:
        """`dashboard`: the head runs Ray's dashboard (the Jobs and state APIs the training service uses);
        `head_cpus`: the head's CPUs when they differ from the other nodes'; `env`: extra environment for
        every node (Ray settings such as RAY_health_check_period_ms)."""
        self.nodes = nodes
        self.cpus = cpus_per_node
        self.head_cpus = head_cpus if head_cpus is not None else cpus_per_node
        self.with_dashboard = dashboard
        self.env = env or {}
        self.dashboard = ""
        self.object_store = object_store_mb * 2**20
        # Short: Ray's unix socket paths live under it and must stay below ~107 characters.
        self.temp = Path(tempfile.mkdtemp(prefix="mlops-rc-"))
        self.groups: list[int] = []
        self.address = ""

    def _start(self, *args: str, cpus: int | None = None) -> None:
        ray = RAY if Path(RAY).exists() else "ray"
        # Explicit: with the mode unset, Ray turns token auth on for a head when ~/.ray/auth_token exists but not for
        # a joining node, which is then refused. No identity: the nodes run as nobody (jobs never inherit a user).
        env = {**{k: v for k, v in os.environ.items() if k not in ("MLOPS_USER", "MLOPS_PASSWORD", "RAY_ADDRESS")},
               "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", **self.env}
        cmd = [ray, "start", *args, f"--num-cpus={cpus or self.cpus}", f"--object-store-memory={self.object_store}",
               f"--temp-dir={self.temp}", f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"]
        proc = subprocess.Popen(cmd, start_new_session=True, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        self.groups.append(proc.pid)
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{out[-3000:]}")

    def start(self) -> RayCluster:
        port, dash = free_port(), free_port()
        self._start("--head", f"--port={port}", f"--include-dashboard={str(self.with_dashboard).lower()}",
                    "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", cpus=self.head_cpus)
        self.dashboard = f"http://127.0.0.1:{dash}" if self.with_dashboard else ""
        # The head writes the address it is reached at (this machine's IP, which drivers here must use too).
        self.address = (self.temp / "ray_current_cluster").read_text().strip()
        for _ in range(self.nodes - 1):
            self.add_node()
        return self

    def add_node(self) -> None:
        self._start(f"--address={self.address}")

    def processes(self, group: int | None = None) -> list[psutil.Process]:
        """This cluster's processes (one node's with `group`): its process groups, everything they started, and
        anything else that names its temp dir."""
        found: dict[int, psutil.Process] = {}
        groups = self.groups if group is None else [group]
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                mine = os.getpgid(proc.pid) in groups or (group is None and str(self.temp) in " ".join(
                    proc.info["cmdline"] or []))
            except (psutil.Error, ProcessLookupError):
                continue
            if mine:
                found[proc.pid] = proc
                try:
                    found.update({c.pid: c for c in proc.children(recursive=True)})
                except psutil.Error:
                    pass
        return list(found.values())

    def kill_raylet(self, node: int) -> int:
        """SIGKILL node `node`'s raylet (0 is the head): a lost machine as its cluster sees it. Its pid."""
        for proc in self.processes(self.groups[node]):
            try:
                if proc.name() == "raylet" or "raylet" in " ".join(proc.cmdline()[:1]):
                    proc.send_signal(signal.SIGKILL)
                    return proc.pid
            except psutil.Error:
                continue
        raise RuntimeError(f"node {node} has no raylet process")

    def kill_head(self) -> None:
        """SIGKILL the head node (GCS, its raylet and its workers): a lost head machine."""
        self._kill(self.processes(self.groups[0]), signal.SIGKILL)

    @staticmethod
    def _kill(procs: list[psutil.Process], sig: int) -> None:
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass

    def stop(self) -> None:
        procs = self.processes()
        self._kill(procs, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=3)  # a raylet drains for longer; nothing here needs it
        self._kill(alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
        subprocess.run(["rm", "-rf", str(self.temp)], check=False)

    def wait_gone(self, timeout: float = 10.0) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = [p for p in self.processes() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            if not left:
                return []
            time.sleep(0.2)
        return left
