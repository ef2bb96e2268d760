"""The deployment artifact: an HF model folder converted to GGUF and quantized by llama.cpp's own tools.

Conversion is keyed on the folder's content id, the quantization and the llama.cpp build, so a rerun (or a
second server of the same version) reuses the file; a half-written file never takes the final name.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from mlops.errors import ConfigError, MLOpsError
from mlops.files import exclusive_lock
from mlops.profile import QUANTIZATIONS
from serving.engines.llamacpp.install import LlamaCppInstall, find_install

log = logging.getLogger("mlops.serve")
GGUF_TYPES = {"f16": "F16", "q8_0": "Q8_0", "q4_k_m": "Q4_K_M"}  # our names -> llama-quantize's


class ConversionError(MLOpsError):
    """llama.cpp's converter or quantizer failed."""


def artifact_dir() -> Path:
    from mlops.paths import mlops_dir

    return Path(os.environ.get("MLOPS_GGUF_DIR", "").strip() or mlops_dir() / "gguf")


def gguf_for(model_path: Path, quantization: str, *, out_dir: Path | None = None,
             install: LlamaCppInstall | None = None) -> Path:
    """The GGUF to serve for `model_path`: itself when it is one, else its cached conversion."""
    model_path = Path(model_path)
    if model_path.is_file() and model_path.suffix == ".gguf":
        return model_path
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"quantization '{quantization}' is not one of {', '.join(QUANTIZATIONS)}. Fix: set "
                          "serve.llamacpp.quantization to one of them.")
    if not (model_path / "config.json").is_file():
        raise ConfigError(f"{model_path} is neither a .gguf file nor an HF model folder (no config.json). Fix: "
                          "serve a registered model version or a GGUF file.")
    install = install or find_install()
    target = cached_path(model_path, quantization, install.version, out_dir)
    if not target.is_file():
        # One converter per model folder: two servers or jobs starting at once share the f16 step and its output.
        with exclusive_lock(target.parent.with_name(target.parent.name + ".lock")):
            if not target.is_file():
                convert(model_path, target, quantization, install)
    return check_packaged(target, model_path, quantization, install.version)


class PackageMismatch(MLOpsError):
    """The GGUF at hand is not the one the ledger's signed `package` entry names."""


def packaged_record(model_path: Path, quantization: str) -> dict | None:
    """The ledger's signed package of these weights in this quantization (the registry answers; None without)."""
    from mlops.model_refs import model_content_id
    from mlops.stages import service

    lookup = service("packaged_gguf")
    return lookup(model_content_id(model_path), quantization) if lookup else None


def check_packaged(target: Path, model_path: Path, quantization: str, llamacpp_version: str) -> Path:
    """Every load, cached copies included: a GGUF of packaged weights must hash to the signed package's sha256."""
    from mlops.files import file_sha256

    record = packaged_record(model_path, quantization)
    if record is None:
        return target
    if record.get("llamacpp_version") != llamacpp_version:
        # Never a skipped check: a file made by another llama.cpp cannot be the packaged bytes.
        raise PackageMismatch(
            f"version {record['model']}/{record['version']} was released as a GGUF made by llama.cpp "
            f"{str(record.get('llamacpp_version'))[:40]} (ledger entry #{record['seq']}), but {target} comes from "
            f"llama.cpp {llamacpp_version}: it is not the released artifact, and it is not loaded. Fix: serve with "
            "the packaged file (a server fetches it from its package run when its llama.cpp matches), or install "
            f"llama.cpp {str(record.get('llamacpp_version'))[:40]} on this host.")
    actual = file_sha256(target)
    if actual != record["sha256"]:
        raise PackageMismatch(
            f"{target} has sha256 {actual[:12]}, but version {record['model']}/{record['version']} was packaged as "
            f"{record['sha256'][:12]} (ledger entry #{record['seq']}): it is not the artifact that was released, "
            "and it is not loaded. Fix: delete it and serve again (the packaged file is fetched), or re-run "
            "`mlops release package`.")
    return target


def cached_path(model_path: Path, quantization: str, llamacpp_version: str, out_dir: Path | None = None) -> Path:
    """Where the GGUF of a folder's weights lives in the content-addressed artifact cache."""
    from mlops.model_refs import model_content_id

    return (out_dir or artifact_dir()) / f"{model_content_id(model_path)}-{llamacpp_version}" / \
        f"model-{quantization}.gguf"


def convert(model_path: Path, target: Path, quantization: str, install: LlamaCppInstall) -> Path:
    """HF folder -> f16 GGUF (convert_hf_to_gguf.py) -> `quantization` (llama-quantize), atomically.

    The converter imports the folder's own Python for some architectures (it trusts remote code whatever we
    pass), so a folder with any code is refused first, and both tools run without our secrets (child_env)."""
    from mlops.model_safety import require_no_code

    require_no_code(model_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    f16 = target.with_name("model-f16.gguf")
    if not f16.is_file():
        tmp = f16.with_suffix(".partial")
        _run([sys.executable, str(install.converter), str(model_path), "--outtype", "f16", "--outfile", str(tmp)],
             {"PYTHONPATH": str(install.src / "gguf-py")}, f"converting {model_path} to GGUF")
        tmp.replace(f16)
    if quantization != "f16":
        tmp = target.with_suffix(".partial")
        _run([str(install.quantize), str(f16), str(tmp), GGUF_TYPES[quantization]], {},
             f"quantizing {f16} to {quantization}")
        tmp.replace(target)
    log.info("GGUF artifact %s (%s) from %s", target, quantization, model_path)
    return target


def _run(cmd: list[str], extra_env: dict[str, str], what: str) -> None:
    from mlops.child_env import child_env, child_home

    with child_home("mlops-llamacpp-") as home:
        done = subprocess.run(cmd, env=child_env(home, extra_env), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise ConversionError(f"llama.cpp failed {what} (exit {done.returncode}):\n{tail}")

