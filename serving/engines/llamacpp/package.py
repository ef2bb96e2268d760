"""`mlops release package`: a version's deployment artifact, made by llama.cpp's own tools and logged on it.

The HF folder of a version is already merged (a LoRA is merged into its base when training ends), so
packaging is conversion and quantization: `convert_hf_to_gguf.py` to f16, then `llama-quantize`. The GGUF is
logged on a package run, and packaging a registered version is a signed act: its sha256, quantization and
llama.cpp version go into the ledger (`package` entry; MLflow's version tags are display copies). The local
artifact cache is content-addressed (model content id, llama.cpp version, quantization); every load checks the
file against the ledger's sha256, cached copies included, and on another machine `fetch_packaged` brings the
logged file into the cache first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mlops.lineage import Tag
from serving.engines.llamacpp.artifact import PackageMismatch  # noqa: F401 - raised by fetch_packaged

VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$")  # a llama.cpp version names a cache folder


@dataclass(frozen=True)
class Packaged:
    ref: str
    gguf: Path
    sha256: str
    quantization: str
    llamacpp_version: str
    run_id: str


def package(ref: str, quantization: str, *, actor=None, experiment: str = "package") -> Packaged:
    """Convert and quantize `ref`'s weights (cached), log the GGUF on a package run, and (for a registered
    version) record the package as `actor`'s signed act."""
    from mlops.files import file_sha256
    from mlops.identities import AuthError
    from mlops.lineage import collect_lineage
    from mlops.model_refs import describe, materialize, set_version_tags
    from mlops.stages import service
    from mlops.tracking import tracked_run
    from serving.engines.llamacpp.artifact import gguf_for
    from serving.engines.llamacpp.install import find_install

    desc = describe(ref)
    present = service("registry_present")
    record = service("record_package") if desc.kind == "version" and present and present() else None
    if record is not None and getattr(actor, "signer", None) is None:
        raise AuthError(f"packaging {ref} is a signed act: sign in with MLOPS_USER and MLOPS_PASSWORD (a trainer "
                        "or admin). Nothing was converted.")
    model = materialize(desc)
    install = find_install()
    gguf = gguf_for(model.hf_dir, quantization, install=install)
    sha = file_sha256(gguf)
    lineage = collect_lineage("package", 0, extra={Tag.STAGE: "package", Tag.MODEL_REF: ref, Tag.MODEL_KEY: model.key,
                                                   Tag.GGUF_SHA256: sha, Tag.GGUF_QUANTIZATION: quantization,
                                                   Tag.LLAMACPP_VERSION: install.version})
    with tracked_run(experiment, run_name=f"package {model.served_name} {quantization}",
                     tags=lineage.as_tags()) as run:
        run.log_params({"model_ref": ref, "quantization": quantization, "llamacpp_version": install.version,
                        "gguf_bytes": gguf.stat().st_size})
        run.log_artifact(gguf, "gguf")
        if record is not None:
            record(actor, model.name, model.version, sha256=sha, quantization=quantization,
                   llamacpp_version=install.version, run_id=run.run_id)
        set_version_tags(model, {Tag.GGUF_RUN: run.run_id, Tag.GGUF_SHA256: sha, Tag.GGUF_QUANTIZATION: quantization,
                                 Tag.LLAMACPP_VERSION: install.version})
        return Packaged(ref, gguf, sha, quantization, install.version, run.run_id)


def fetch_packaged(model, quantization: str) -> Path | None:
    """The version's packaged GGUF in the local cache (fetched from its package run when missing), checked
    against the sha256 of the ledger's signed package; None when it has no package of that quantization."""
    import shutil

    from mlops.model_refs import download
    from serving.engines.llamacpp.artifact import cached_path, check_packaged, packaged_record

    record = packaged_record(model.hf_dir, quantization)
    if record is None:
        return None
    version = str(record.get("llamacpp_version") or "")
    if not VERSION_RE.match(version) or not str(record.get("run") or "").isalnum():
        raise PackageMismatch(f"the ledger's package of {model.ref} names llama.cpp version {version[:40]!r} and "
                              f"run {str(record.get('run'))[:40]!r}, which cannot name a cache file. Fix: package it "
                              "again with `mlops release package`.")
    target = cached_path(model.hf_dir, quantization, version)
    if not target.is_file():
        fetched = download(f"runs:/{record['run']}/gguf/{target.name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fetched, target.with_suffix(".partial"))
        target.with_suffix(".partial").replace(target)
    return check_packaged(target, model.hf_dir, quantization, version)
