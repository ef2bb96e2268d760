"""`data.executor: ray`: the ordered, bounded map of mlops.data.parallel over Ray tasks instead of local processes.

The driver (the build process) only coordinates: it plans partitions and tasks, sums what they report and writes
the batches it is handed. Every per-record step of the cleaning runs in tasks (mlops.data.sharded): reading and
parsing a partition of a source, PII scrub, filters, decontamination, exact hashes, MinHash signatures and band
hashes; the LSH lookup sharded by band; the clustering; then tokenization, per-record checks and the GE batch
suite. Duplicate clusters keep their smallest (source order, line) key, so the snapshot is byte-identical to a
local build at any worker count.

Faults:
  * a worker or node dies: Ray reruns the task (`data.ray.max_retries`); tasks are pure functions of their
    chunk, so a rerun gives the same result and no record is lost or counted twice. Retries used up end the
    build with `RayWorkerLost`.
  * the head is lost: Ray has no GCS to schedule with and ends the driver process 60 s later. The driver
    checks the head's port while it waits and fails after `data.ray.head_timeout_s` with `RayHeadLost`,
    so the build's usual cleanup runs (the staging folder goes, nothing is published).
Workers need the same checkout and virtualenv as the driver (they import `mlops`), and the sources and the
snapshot root (data.output_dir) at the same paths: tasks read their partition of a source and write their
partition's files in the build's staging folder, so on a multi-machine cluster both live on a shared filesystem.
The tokenizer files travel in the object store.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from mlops.data.config import RayConfig
from mlops.errors import MLOpsError, WorkerDied

LOG = logging.getLogger(__name__)
POLL_S = 0.5  # how often a wait for a result looks at the head
# Tests only: a path (and optionally ":<function name>"). The first task to run that function creates the file and
# SIGKILLs its own worker, as the OS or an operator would; the rerun finds the file and goes on.
KILL_ONCE_ENV = "MLOPS_TEST_RAY_KILL_ONCE"
# Passed to every worker: offline hubs stay offline on the cluster, and the tokenizer's threads stay off.
FORWARDED_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM",
                 KILL_ONCE_ENV)


class RayUnavailable(MLOpsError):
    """Ray is not installed, or the cluster at data.ray.address cannot be reached."""


class RayHeadLost(MLOpsError):
    """The Ray head stopped answering during the build; nothing was published."""


class RayWorkerLost(WorkerDied):
    """A task's worker died more often than data.ray.max_retries allows."""


_WORKER: dict[str, Any] = {}


def _run(init: list, fn: Callable[[Any], Any], chunk: Any) -> tuple[str, Any]:
    """One task in a Ray worker: (its node id, fn(chunk)). `init` is [(build key, ObjectRef)] (in a list so Ray
    does not fetch the ref on every call): a worker takes the build's environment and runs its initializer once,
    on its first task of that build."""
    key, ref = init[0]
    if _WORKER.get("key") != key:
        import ray

        initializer, initargs, env = ray.get(ref)
        for name in FORWARDED_ENV:  # set here, not as a runtime_env: Ray's prestarted workers then take tasks
            if name in env:
                os.environ[name] = env[name]
            else:
                os.environ.pop(name, None)
        initializer(*initargs)
        _WORKER.update(key=key, node=ray.get_runtime_context().get_node_id())
    _kill_once(getattr(fn, "__name__", ""))
    return _WORKER["node"], fn(chunk)


def _kill_once(name: str) -> None:
    spec = os.environ.get(KILL_ONCE_ENV)
    if not spec:
        return
    marker, _, only = spec.partition(":")
    if only and only != name:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, f"{os.getpid()} {name}\n".encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


_TOKEN: list[str] = []


def _private_token() -> str:
    """One per process: Ray caches the token it loaded, so a second private Ray must present the same one."""
    if not _TOKEN:
        import secrets

        _TOKEN.append(secrets.token_hex(32))
    return _TOKEN[0]


def _reload_auth() -> None:
    """Make Ray re-read RAY_AUTH_MODE and the token (it caches both when it is imported and first connects)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):  # another Ray version: its own defaults apply
        pass


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return host.strip("[]"), int(port)


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


class RayPool:
    """`map(fn, chunks)` and `map_pairs` like mlops.data.parallel.OrderedPool, over Ray tasks."""

    def __init__(self, cfg: RayConfig, workers: int, initializer: Callable[..., None], initargs: tuple = ()) -> None:
        self.cfg = cfg
        self.workers = workers
        self.initializer = initializer
        self.initargs = initargs
        self.address = cfg.address or "a private Ray"
        self.limit = 2
        self._owned = False
        self._private_dir: str | None = None
        self._saved_env = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
        self._head: tuple[str, int] | None = None
        self._head_lost = False
        self._pending: deque = deque()
        self.tasks_by_node: Counter[str] = Counter()  # node id -> tasks it ran (logged; not in the manifest)

    # ----------------------------------------------------------------- connect and disconnect

    def __enter__(self) -> RayPool:
        try:
            import ray
        except ImportError:
            raise RayUnavailable("data.executor=ray needs the ray package. Fix: `pip install ray==2.60.0` in this "
                                 "virtualenv (it is a project dependency: `make install`).") from None
        if ray.is_initialized():  # the caller's own Ray session (a notebook, a Ray job): used, left open
            context = ray.get_runtime_context()
            gcs = getattr(context, "gcs_address", None)
        else:
            gcs = self._connect(ray)
            self._owned = True
        try:
            client = self.cfg.address and self.cfg.address.startswith("ray://")
            head = self.cfg.address if client else gcs  # Ray Client: the head's client server is what must answer
            self._head = _host_port(head) if head else None
            slots = max(1, int(ray.cluster_resources().get("CPU", 1) // self.cfg.num_cpus))
            self.limit = self.cfg.max_in_flight or 2 * slots
            self._task = ray.remote(num_cpus=self.cfg.num_cpus, max_retries=self.cfg.max_retries)(_run)
            env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
            env["TOKENIZERS_PARALLELISM"] = "false"
            self._init = [(uuid.uuid4().hex, ray.put((self.initializer, self.initargs, env)))]
        except BaseException:
            self._disconnect(ray)
            raise
        return self

    def _connect(self, ray) -> str | None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        options: dict[str, Any] = dict(log_to_driver=False, logging_level=logging.WARNING)
        if self.cfg.address is None:
            # Its own short temp dir: the socket paths fit, and nobody's `address=auto` can find this one. Its own
            # token too: Ray would otherwise write one to ~/.ray/auth_token, which every later `ray start` on this
            # account then picks up.
            self._private_dir = tempfile.mkdtemp(prefix="mlops-ray-")
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ["RAY_AUTH_TOKEN"] = _private_token()
            _reload_auth()
            options.update(num_cpus=self.workers, object_store_memory=self.cfg.object_store_mb * 2**20,
                           include_dashboard=False, _temp_dir=self._private_dir)
        elif self.cfg.address.startswith("ray://"):
            try:
                import grpc  # noqa: F401 - Ray Client's transport, only in ray[client]
            except ImportError:
                raise RayUnavailable(
                    f"data.ray.address={self.cfg.address} is a Ray Client address, which needs ray[client]. Fix: "
                    "`pip install 'ray[client]==2.60.0'` here and on the head, or run the build on a cluster node "
                    "with data.ray.address=HEAD_HOST:PORT (the --port of `ray start --head`)."
                ) from None
        address = self.cfg.address
        if address not in (None, "auto") and not _reachable(*_host_port(address)):
            # Ray would retry for a minute before it says so.
            raise RayUnavailable(
                f"nothing answers at data.ray.address={address}. Fix: start the head there (`ray start --head "
                f"--port={_host_port(address)[1]}` from this checkout's virtualenv), correct the address, or set "
                "data.executor=local."
            )
        try:
            context = ray.init(address, **options)
        except Exception as err:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError here
            self._forget_private()
            where = self.cfg.address or "a private Ray in this process"
            raise RayUnavailable(
                f"cannot start or join Ray at {where} ({type(err).__name__}: {str(err)[:300]}). Fix: start the "
                "cluster (`ray start --head --port=6379` on the head, `ray start --address=HEAD:6379` on the "
                "others, from this checkout's virtualenv), check data.ray.address, or set data.executor=local."
            ) from None
        return (getattr(context, "address_info", None) or {}).get("gcs_address")

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        import ray

        if exc_type is not None and not self._head_lost:
            for _, ref in self._pending:  # queued chunks would run on for nothing
                ray.cancel(ref)
        self._pending.clear()
        LOG.info("ray at %s: %d tasks on %d node(s) %s", self.address, sum(self.tasks_by_node.values()),
                 len(self.tasks_by_node), dict(self.tasks_by_node))
        self._disconnect(ray)

    def _disconnect(self, ray) -> None:
        if not self._owned:
            return
        self._owned = False
        if self._head_lost:
            # Ray's shutdown waits for the lost GCS, and its exit hook would too: this driver leaves without them.
            import atexit

            atexit.unregister(ray.shutdown)
        else:
            ray.shutdown()
        self._forget_private()

    def _forget_private(self) -> None:
        if not self._private_dir:
            return
        shutil.rmtree(self._private_dir, ignore_errors=True)
        self._private_dir = None
        for key, value in self._saved_env.items():  # a later cluster build sees the caller's own settings
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _reload_auth()

    # ----------------------------------------------------------------- the ordered, bounded map

    def map(self, fn: Callable[[Any], Any], chunks: Iterable[Any]) -> Iterator[Any]:
        return (result for _, result in self.map_pairs(fn, chunks))

    def map_pairs(self, fn: Callable[[Any], Any], chunks: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        """(chunk, fn(chunk)) in input order, with at most `limit` chunks in flight."""
        pending = self._pending
        for chunk in chunks:
            pending.append((chunk, self._task.remote(self._init, fn, chunk)))
            if len(pending) >= self.limit:
                done, ref = pending.popleft()
                yield done, self._get(ref, fn)
        while pending:
            done, ref = pending.popleft()
            yield done, self._get(ref, fn)

    def _get(self, ref: Any, fn: Callable[[Any], Any]) -> Any:
        import ray
        from ray.exceptions import RayError, RayTaskError

        name = getattr(fn, "__name__", fn)
        lost_since = None
        while True:
            try:
                ready = ray.wait([ref], timeout=POLL_S)[0]
            except (RayError, OSError) as err:  # the driver's own link broke: its node's raylet or the GCS is gone
                self._head_lost = True  # Ray's shutdown would wait for what is gone
                if self._head is not None and not _reachable(*self._head):
                    raise self._head_error(name, "was lost") from None
                raise RayUnavailable(
                    f"the build lost its Ray node while running {name} on {self.address} ({type(err).__name__}: "
                    f"{str(err)[:200]}); nothing was published. Fix: restart Ray on this machine (`ray start "
                    "--address=HEAD:PORT`) and run the build again, or set data.executor=local."
                ) from None
            if ready:
                break
            if self._head is None or _reachable(*self._head):
                lost_since = None
                continue
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since >= self.cfg.head_timeout_s:
                self._head_lost = True
                raise self._head_error(name, f"stopped answering for {self.cfg.head_timeout_s:.0f} s")
        try:
            node, result = ray.get(ref)
        except RayTaskError as err:  # the task's own exception, as the local pool would raise it
            raise (err.cause if isinstance(err.cause, BaseException) else err) from err
        except RayError as err:
            if self._head is not None and not _reachable(*self._head):  # the task failed because the head went
                self._head_lost = True
                raise self._head_error(name, "was lost") from None
            raise RayWorkerLost(
                f"a Ray task running {name} on {self.address} failed {self.cfg.max_retries + 1} time(s) "
                f"({type(err).__name__}: {str(err)[:300]}); nothing was published. Fix: give the nodes more memory "
                "or lower data.batch_size, raise data.ray.max_retries for a flaky cluster, and look at the worker "
                "logs under each node's Ray temp dir (session_latest/logs)."
            ) from None
        self.tasks_by_node[node] += 1
        return result

    def _head_error(self, name: str, what: str) -> RayHeadLost:
        return RayHeadLost(
            f"the Ray head at {self.address} {what} during the build (in {name}); nothing was published. Fix: "
            "restart the head (`ray start --head --port=PORT`) and its nodes, then run the build again; or set "
            "data.executor=local."
        )
