"""No code from a model folder: a folder whose loading or conversion would import code it ships is refused.

A candidate folder is written by whoever trained it. transformers runs a folder's own Python when a config
names a class in it (`auto_map`) and the loader trusts remote code; llama.cpp's converter does so for some
architectures whatever we pass. So before any process of ours loads or converts a folder, it must hold data
only: weights, configs, tokenizer files, a chat template. `require_no_code(folder)` is that one check; it is
called where every model folder enters the serving and eval paths (`mlops.model_refs.materialize`,
`serving.engine.build_engine`, the llama.cpp conversion).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mlops.errors import MLOpsError

# Files an interpreter or the dynamic loader runs or imports: Python sources and bytecode, native libraries,
# pickles (unpickling calls any importable function), scripts.
CODE_SUFFIXES = frozenset({".py", ".pyc", ".pyo", ".pyd", ".pyw", ".pyx", ".pxd", ".so", ".dylib", ".dll", ".exe",
                           ".pkl", ".pickle", ".joblib", ".sh", ".bash", ".ipynb"})
MAGIC = {b"\x7fELF": "an ELF executable or library", b"#!": "a script (#! line)"}
# Weights begin with binary headers that may spell "#!" by chance (a safetensors header of 8483 bytes does).
WEIGHT_SUFFIXES = frozenset({".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".npz"})
# Config keys that tell transformers to import classes from the folder's own Python (or to trust it).
CODE_KEYS = ("auto_map", "custom_pipelines", "trust_remote_code")
JSON_LIMIT = 16 * 1024 * 1024  # configs are small; a larger one is refused unread rather than parsed
FIX = ("Fix: delete those files and config entries and register the folder again as a new version: a model is "
       "data only (safetensors weights, config and tokenizer JSON, chat template), as `save_pretrained` of a "
       "built-in transformers architecture writes it; this project never runs code shipped in a model folder.")


class UnsafeModelFolder(MLOpsError):
    """A model folder carries code that loading or converting it could run."""


def require_no_code(folder: Path | str) -> Path:
    """`folder` unchanged when it holds no code; else an `UnsafeModelFolder` naming each offending file."""
    folder = Path(folder)
    if not folder.is_dir():
        return folder  # a single file (a GGUF): llama.cpp reads it as data
    found = code_in(folder)
    if found:
        listed = "; ".join(f"{path} ({why})" for path, why in found[:8])
        more = f" and {len(found) - 8} more" if len(found) > 8 else ""
        raise UnsafeModelFolder(f"model folder {folder} is refused: loading or converting it could run code it "
                                f"ships: {listed}{more}. {FIX}")
    return folder


def code_in(folder: Path) -> list[tuple[str, str]]:
    """(relative path, reason) of every file or config entry in `folder` that would bring code in."""
    found: list[tuple[str, str]] = []
    for root, dirs, files in os.walk(folder):  # links to folders are not followed: they are refused below
        here = Path(root)
        for name in sorted(dirs):
            if (here / name).is_symlink():
                found.append((_rel(here / name, folder), "a link to a folder, which the check does not follow"))
        for name in sorted(files):
            path = here / name
            why = _file_reason(path)
            if why:
                found.append((_rel(path, folder), why))
    return found


def _file_reason(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix in CODE_SUFFIXES:
        return f"a {suffix} file: code, which a loader or converter may import or run"
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError as err:
        return f"unreadable ({err.strerror}), so it cannot be checked"
    for magic, what in MAGIC.items():
        if head.startswith(magic) and (len(magic) == 4 or suffix not in WEIGHT_SUFFIXES):
            return what
    if path.name.lower().endswith("config.json"):  # config, tokenizer_config, (pre)processor_config, ...
        return _json_reason(path)
    if path.name.lower() == "readme.md":
        return _card_reason(path)
    return None


def _json_reason(path: Path) -> str | None:
    if path.stat().st_size > JSON_LIMIT:
        return f"a JSON file over {JSON_LIMIT >> 20} MiB, too large to check"
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return None  # not JSON transformers could read either: it cannot name code
    hit = _code_key(data)
    if hit:
        key, value = hit
        return (f"sets {key} = {json.dumps(value)[:120]}: classes imported from the folder's own Python. "
                f"Remove `{key}` and save with a built-in transformers class")
    return None


def _card_reason(path: Path) -> str | None:
    """A model card whose front matter tags the model `custom_code` (the Hub's mark for remote code)."""
    text = path.read_text(encoding="utf-8", errors="replace")[:65536]
    if not text.startswith("---"):
        return None
    front = text[3:].partition("\n---")[0]
    if "custom_code" in front:
        return "its model card is tagged custom_code: the model needs code of its own to load"
    return None


def _code_key(data, depth: int = 0) -> tuple[str, object] | None:
    """The first code key set anywhere in a JSON document (nested configs carry their own `auto_map`)."""
    if depth > 32:
        return None
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        if key in CODE_KEYS and (value is True or (key != "trust_remote_code" and value not in (None, {}, [], ""))):
            return str(key), value
        if isinstance(value, dict | list):
            hit = _code_key(value, depth + 1)
            if hit:
                return hit
    return None


def _rel(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix()
