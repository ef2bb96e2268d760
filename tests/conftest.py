"""Shared fixtures: an isolated project home per test, the tiny model, a fresh PostgreSQL database."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import hypothesis  # noqa: F401 - see below
import pytest

# Hypothesis's pytest plugin imports hypothesis lazily, at the terminal summary, when no collected test did; by then
# in-process training has run, and CPython 3.11.7's parser fails on it ("AST constructor recursion depth
# mismatch") after every test passed. Imported here, it is parsed at collection like any other module.

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

PG_ADMIN = os.environ.get("MLOPS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


# The longest test files, longest first. `make test` runs two workers, each taking whole files in this order:
# started first, a 20-minute file ends while the other worker still has short files to run, instead of running
# alone at the end.
RUN_FIRST = ("test_release_loop.py", "test_train_multiprocess.py", "test_train_service_cluster.py", "test_data_ray.py",
             "test_registry_faults.py", "test_eval_runner.py", "test_train_resilience.py", "test_sweep_tiny.py", "test_train_inprocess.py")


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(RUN_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(RUN_FIRST)))  # stable: the rest keeps its order


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


STORE_ENV = ("MLFLOW_TRACKING_URI", "MLOPS_HOME", "MLOPS_REGISTRY_DB", "MLFLOW_REGISTRY_URI")


@pytest.fixture(autouse=True)
def _store_env_does_not_leak():
    """MLflow's `set_tracking_uri` also writes MLFLOW_TRACKING_URI into os.environ, which monkeypatch does not undo
    when the variable was absent: a later test (or a registry check of a GGUF) would read a deleted test's store."""
    before = {name: os.environ.get(name) for name in STORE_ENV}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def mlops_home(tmp_path, monkeypatch) -> Path:
    """A fresh project home with the embedded SQLite tracking store."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("MLOPS_HOME", str(home))
    monkeypatch.setenv("MLOPS_LEDGER_KEY_DIR", str(tmp_path / "ledger-keys"))  # this test's registry keys
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    flush_pending_display()
    forget_process_wide_store()
    return home


def flush_pending_display() -> None:
    """An earlier test's registry act may still be writing MLflow's display copies into its own store."""
    import sys

    transition = sys.modules.get("registry.transition")
    if transition is not None:
        transition.flush_display()
        # A lag an earlier test left unreported belongs to its store: every test of this process runs on the same
        # main thread, so a later CLI call would report it as its own act's.
        transition.unreported_lags().clear()


REGISTRY_STORES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=REGISTRY_STORES)
def store(request, mlops_home, monkeypatch) -> str | None:
    """Each registry store in turn: the embedded SQLite file (None), then a fresh PostgreSQL database (its URL)."""
    from registry.testing import use_store_param

    return use_store_param(request, monkeypatch)


def forget_process_wide_store() -> None:
    """MLflow keeps the last `set_tracking_uri` process-wide (and resolves `models:/m-...` sources through it):
    a store an earlier test used, such as a PostgreSQL database dropped since, must not leak into this one."""
    import sys

    import mlflow

    mlflow.set_tracking_uri(None)
    # Each test's registry is its own (the app tests' copies share one registry id): the head this process
    # verified in an earlier test's copy is no anchor for this one.
    trust = sys.modules.get("registry.trust")
    if trust is not None:
        trust._MEMORY.clear()


@pytest.fixture(scope="session")
def model_cache() -> Path:
    """Base models built once and reused by every test session (import is a no-op when present)."""
    return Path(os.environ.get("MLOPS_TEST_CACHE", REPO / ".mlops" / "test-cache")) / "models"


@pytest.fixture
def train_snapshot(mlops_home) -> str:
    """A small tokenized snapshot of the tiny model's tokenizer in this test's home."""
    from training.testing import make_snapshot

    return make_snapshot()


@pytest.fixture
def make_train_cfg(train_snapshot, tiny_model, tmp_path):
    """`build(ckpt="a", **overrides)`: a fast tiny-model training config whose checkpoints go to tmp_path/ckpt."""
    from mlops.config import load_config
    from training.testing import tiny_overrides

    def build(ckpt: str = "a", **extra):
        extra.setdefault("train.checkpoint.dir", str(tmp_path / ckpt))
        return load_config(None, tiny_overrides(train_snapshot, base_model=tiny_model["path"], **extra))

    return build


@pytest.fixture(scope="session")
def tiny_model(model_cache) -> dict:
    """The `tiny` base model catalog entry: {'name', 'id', 'path'}."""
    from mlops.base_models import import_base_model

    return import_base_model("tiny", root=model_cache)


@pytest.fixture(scope="session")
def tiny_gguf(tiny_model, model_cache) -> Path:
    """The tiny model as an f16 GGUF, converted by llama.cpp's own converter (once per cache)."""
    from serving.engines.llamacpp.artifact import gguf_for
    from serving.engines.llamacpp.install import LlamaCppMissing

    try:
        # Built once per session, whichever test asks first: no test's registry store is in play (a file store
        # holds no ledger, so no signed package is looked up for the tiny model's weights).
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MLFLOW_TRACKING_URI", f"file:{model_cache.parent / 'no-registry'}")
            mp.delenv("MLOPS_REGISTRY_DB", raising=False)
            return gguf_for(Path(tiny_model["path"]), "f16", out_dir=model_cache.parent / "gguf")
    except LlamaCppMissing as err:
        if in_ci():
            pytest.fail(f"{err} Under CI=true the llamacpp engine tests may not skip.")
        pytest.skip(str(err))


def build_test_engine(name: str, tiny_model: dict, tiny_gguf_path: Path | None = None, **options):
    """A small engine of `name` on the tiny model: `hf` on its folder, `llamacpp` on its f16 GGUF."""
    from serving.engine import EngineSpec, build_engine

    if name == "hf":
        return build_engine(tiny_model["path"], EngineSpec("hf"))
    opts = {"parallel": 4, "context_per_slot": 512, **options}
    return build_engine(tiny_gguf_path, EngineSpec("llamacpp", threads=1, options=opts))


@pytest.fixture(scope="module", params=["hf", "llamacpp"])
def engine_name(request) -> str:
    """Each engine in turn: a module using it runs its tests on `hf` and on `llamacpp`."""
    return request.param


@pytest.fixture(scope="module")
def any_engine(engine_name, tiny_model, request):
    """An engine of `engine_name` on the tiny model, shared by the module, closed at its end."""
    gguf = request.getfixturevalue("tiny_gguf") if engine_name == "llamacpp" else None
    engine = build_test_engine(engine_name, tiny_model, gguf)
    yield engine
    engine.close()


@pytest.fixture
def postgres_url() -> str:
    """A fresh PostgreSQL database for this test (SQLAlchemy URL); dropped afterwards."""
    try:
        import psycopg

        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)
    except Exception as err:  # noqa: BLE001 - any connection failure means "no PostgreSQL here"
        message = f"PostgreSQL is not reachable at {PG_ADMIN} ({err}); start it or set MLOPS_TEST_PG"
        if in_ci():
            pytest.fail(f"{message}. Under CI=true a PostgreSQL test may not skip.")
        pytest.skip(message)
    name = f"mlops_test_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        # SQLAlchemy (MLflow, Optuna) needs the driver named: psycopg 3 is the one installed.
        base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
        yield f"{base}/{name}"
    finally:
        flush_pending_display()  # before its database goes
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="session")
def traced_store_template(tmp_path_factory) -> Path:
    """An embedded MLflow store with its schema and the request log's experiment, made once per session: making
    MLflow's schema costs seconds, and every test that serves or reads traces needs one."""
    home = tmp_path_factory.mktemp("traced-store") / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLOPS_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        from mlops.requestlog import store

        store()
    return home / ".mlops" / "mlflow.db"


@pytest.fixture
def traced_home(traced_store_template, mlops_home) -> Path:
    """`mlops_home` whose tracking store starts as a copy of the template (the request log's traces go there)."""
    import shutil

    (mlops_home / ".mlops").mkdir(parents=True, exist_ok=True)
    shutil.copy2(traced_store_template, mlops_home / ".mlops" / "mlflow.db")
    return mlops_home


@pytest.fixture(scope="session")
def app_store_template(tmp_path_factory, tiny_model) -> Path:
    """A release history for the approval app's tests, built once per session (see app.testing.seed_release)."""
    home = tmp_path_factory.mktemp("app-store") / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLOPS_HOME", str(home))
        mp.setenv("MLOPS_LEDGER_KEY_DIR", str(home / "ledger-keys"))
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLOPS_REGISTRY_DB"):
            mp.setenv(name, "")  # recorded, so leaving the context restores the variable's absence too: MLflow's
            mp.delenv(name)      # set_tracking_uri writes MLFLOW_TRACKING_URI into os.environ while seeding
        from app.testing import seed_release

        seed_release(Path(tiny_model["path"]), home.parent)
    return home


@pytest.fixture
def app_store(app_store_template, mlops_home, monkeypatch) -> Path:
    """This test's own copy of the seeded store (its database and identities; artifacts are read in place)."""
    import shutil

    monkeypatch.delenv("MLOPS_REGISTRY_DB", raising=False)
    (mlops_home / ".mlops").mkdir(parents=True, exist_ok=True)
    shutil.copy2(app_store_template / ".mlops/mlflow.db", mlops_home / ".mlops/mlflow.db")
    # The registry's key and this machine's anchor travel with the database they belong to.
    shutil.copytree(app_store_template / "ledger-keys", os.environ["MLOPS_LEDGER_KEY_DIR"])
    return mlops_home
