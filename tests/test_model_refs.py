"""Model refs against a real embedded store: describe without downloads, materialize, content ids, lookups."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mlops.errors import NotFoundError
from mlops.lineage import Tag


@pytest.fixture
def store(mlops_home):
    from mlops.tracking import init_experiment

    init_experiment("refs")
    from mlops.tracking import client

    return client()


@pytest.fixture
def downloads(monkeypatch):
    """Counts every artifact download (the thing `describe` must never do)."""
    import mlflow.artifacts

    calls = []
    real = mlflow.artifacts.download_artifacts

    def counting(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", counting)
    return calls


def log_model_run(store, hf_dir: Path, tags: dict | None = None) -> str:
    """A finished run that logged `hf_dir` as its `model` (the pyfunc form training logs), tagged like training."""
    from mlops.model_refs import model_content_id
    from mlops.profile import load_profile
    from mlops.tracking import MlflowTracker

    tracker = MlflowTracker.start("refs", attach_env_run=False)
    tracker.log_hf_model(hf_dir)
    profile = load_profile(hf_dir)
    tracker.set_tags({Tag.STAGE: "train", Tag.MODEL_ID: model_content_id(hf_dir),
                      Tag.PROFILE_HASH: profile.profile_hash(), Tag.SNAPSHOT_ID: "snap-1", **(tags or {})})
    tracker.close()
    return tracker.run_id


def test_describe_names_version_aliases_lineage_and_profile_without_downloading(store, tiny_model, downloads):
    from mlops.model_refs import describe
    from mlops.tracking import client
    from registry.versions import register_model_version

    run_id = log_model_run(store, Path(tiny_model["path"]))
    version = register_model_version(run_id, "bot")
    client().set_registered_model_alias("bot", "blue", version)  # an alias the registry does not govern
    downloads.clear()
    desc = describe("models:/bot@blue")
    assert downloads == []
    assert (desc.name, desc.version, desc.aliases, desc.run_id) == ("bot", version, ("blue",), run_id)
    assert desc.snapshot_id == "snap-1" and desc.lineage[Tag.STAGE] == "train"
    assert desc.content_id.startswith("mc-")
    assert desc.stored_profile().profile_hash() == desc.profile_hash


def test_listing_200_versions_downloads_no_weights(store, tiny_model, downloads):
    from registry.versions import describe_versions

    run_id = log_model_run(store, Path(tiny_model["path"]))
    store.create_registered_model("many")
    for i in range(200):
        store.create_model_version("many", f"runs:/{run_id}/model", run_id, tags={Tag.MODEL_ID: f"mc-{i:04d}"})
    store.set_registered_model_alias("many", "production", "7")
    downloads.clear()
    listed = describe_versions("many")
    assert downloads == []
    assert [d.version for d in listed[:3]] == ["200", "199", "198"] and len(listed) == 200
    assert next(d for d in listed if d.version == "7").aliases == ("production",)


def test_run_ref_and_version_ref_of_the_same_weights_share_one_key(store, tiny_model, tmp_path):
    from mlops.model_refs import describe, materialize, model_key, resolve_model_ref
    from registry.versions import register_model_version

    run_id = log_model_run(store, Path(tiny_model["path"]))
    version = register_model_version(run_id, "bot")
    by_run, by_version = resolve_model_ref(f"runs:/{run_id}/model"), describe(f"models:/bot/{version}")
    copy = shutil.copytree(tiny_model["path"], tmp_path / "copy")
    assert by_run.key == model_key(by_version) == materialize(str(copy)).key
    assert (by_run.hf_dir / "config.json").exists()


@pytest.fixture
def temp_folder(tmp_path, monkeypatch) -> Path:
    """The process's temporary folder, empty: whatever is left in it afterwards was leaked."""
    import tempfile

    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_materializing_models_on_a_local_store_copies_nothing(store, tiny_model, downloads, temp_folder):
    from mlops.model_refs import resolve_model_ref
    from registry.versions import register_model_version

    run_id = log_model_run(store, Path(tiny_model["path"]))
    version = register_model_version(run_id, "bot")
    for ref in (f"runs:/{run_id}/model", f"models:/bot/{version}"):
        assert (resolve_model_ref(ref).hf_dir / "config.json").is_file()
    assert downloads == [] and list(temp_folder.iterdir()) == []


def test_a_remote_artifact_is_downloaded_once_into_the_cache_and_nothing_is_left_in_temp(
        store, tiny_model, downloads, temp_folder, monkeypatch):
    import mlops.model_refs as refs
    import mlops.run_store as run_store
    from mlops.paths import artifact_cache_dir

    run_id = log_model_run(store, Path(tiny_model["path"]))
    # What a tracking server's `mlflow-artifacts:` or S3 looks like from here: nothing to read in place.
    monkeypatch.setattr(refs, "_logged_model_in_place", lambda uri: None)
    monkeypatch.setattr(run_store, "local_artifact", lambda run_id, path: None)
    first = refs.resolve_model_ref(f"runs:/{run_id}/model")
    again = refs.resolve_model_ref(f"runs:/{run_id}/model")
    assert first.hf_dir == again.hf_dir and first.hf_dir.is_relative_to(artifact_cache_dir())
    assert len(downloads) == 1 and first.key == refs.model_content_id(tiny_model["path"])
    assert list(temp_folder.iterdir()) == []
    assert [p.name for p in artifact_cache_dir().iterdir() if ".partial-" in p.name] == []


def test_content_id_ignores_the_deployment_profile_but_not_the_weights(tiny_model, tmp_path):
    from mlops.model_refs import model_content_id

    folder = shutil.copytree(tiny_model["path"], tmp_path / "m")
    before = model_content_id(folder)
    (folder / "deployment_profile.yaml").write_text("system_prompt: other\n")
    assert model_content_id(folder) == before
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    assert model_content_id(folder) != before


def test_unknown_version_says_which_versions_exist(store, tiny_model):
    from mlops.model_refs import describe
    from registry.versions import register_model_version

    register_model_version(log_model_run(store, Path(tiny_model["path"])), "bot")
    with pytest.raises(NotFoundError, match=r"has versions 1 and aliases none"):
        describe("models:/bot/9")
    with pytest.raises(NotFoundError, match="no registered model 'nobody'"):
        describe("models:/nobody@blue")
    with pytest.raises(NotFoundError, match="holds no release registry"):  # a governed alias needs the ledger
        describe("models:/nobody@production")


def test_unreachable_store_is_an_outage_not_a_missing_model(mlops_home, monkeypatch):
    from mlops.files import free_port
    from mlops.model_refs import describe
    from mlops.tracking import RegistryUnavailableError

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(RegistryUnavailableError, match="outage or access problem") as caught:
        describe("models:/bot/1")
    assert not isinstance(caught.value, NotFoundError)


def test_previous_versions_lists_older_tagged_versions_newest_first(store, tiny_model):
    from mlops.model_refs import describe, previous_versions

    run_id = log_model_run(store, Path(tiny_model["path"]))
    store.create_registered_model("bot")
    for passed in (True, False, True, True):
        store.create_model_version("bot", f"runs:/{run_id}/model", run_id,
                                  tags={Tag.GATE_EVAL: "passed" if passed else "failed"})
    assert previous_versions(describe("models:/bot/4"), Tag.GATE_EVAL, "passed", 5) == ["models:/bot/3",
                                                                                        "models:/bot/1"]
    assert previous_versions(describe("models:/bot/4"), Tag.GATE_EVAL, "passed", 1) == ["models:/bot/3"]


def test_latest_run_finds_the_newest_finished_run_with_the_tags(store):
    import time

    from mlops.run_store import latest_run

    exp = store.get_experiment_by_name("refs").experiment_id
    ids = []
    for _ in range(3):
        run_id = store.create_run(exp, tags={Tag.STAGE: "data", Tag.SNAPSHOT_ID: "s1"}).info.run_id
        ids.append(run_id)
        time.sleep(0.01)
    store.set_terminated(ids[0])
    store.set_terminated(ids[1])  # ids[2] is still RUNNING
    assert latest_run({Tag.STAGE: "data", Tag.SNAPSHOT_ID: "s1"}) == ids[1]
    assert latest_run({Tag.STAGE: "data", Tag.SNAPSHOT_ID: "s2"}) is None


def test_a_registered_model_can_be_the_base_of_the_next_round(store, tiny_model):
    """`base_model=runs:/<id>/model` (or models:/name/version) continues from released weights: the entry names
    the ref, its content id and the local HF folder."""
    from mlops.base_models import ensure_base_model
    from mlops.model_refs import model_content_id

    run_id = log_model_run(store, Path(tiny_model["path"]))
    entry = ensure_base_model(f"runs:/{run_id}/model")
    assert entry["name"] == f"runs:/{run_id}/model"
    assert entry["id"] == model_content_id(Path(tiny_model["path"]))
    assert (Path(entry["path"]) / "config.json").is_file()
