"""`mlops release package`: a version's deployment artifact, made by llama.cpp's own tools and logged on it.

The HF folder of a version is already merged (a LoRA is merged into its base when training ends), so
packaging is conversion and quantization: `convert_hf_to_gguf.py` to f16, then `llama-quantize`. The GGUF is
logged on a package run and named on the version with its sha256, quantization and llama.cpp version. The
local artifact cache is content-addressed (model content id, llama.cpp version, quantization), so a server on
this machine loads exactly that file; on another machine `fetch_packaged` brings the logged file into the cache
and a server refuses a GGUF whose sha256 is not the packaged one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlops.errors import MLOpsError
from mlops.lineage import Tag


class PackageMismatch(MLOpsError):
    """The GGUF at hand is not the one packaged on the version."""


@dataclass(frozen=True)
class Packaged:
    ref: str
    gguf: Path
    sha256: str
    quantization: str
    llamacpp_version: str
    run_id: str


def package(ref: str, quantization: str, *, experiment: str = "package") -> Packaged:
    """Convert and quantize `ref`'s weights (cached), log the GGUF on a package run, tag the version."""
    from mlops.files import file_sha256
    from mlops.lineage import collect_lineage
    from mlops.model_refs import materialize, set_version_tags
    from mlops.tracking import tracked_run
    from serving.engines.llamacpp.artifact import gguf_for
    from serving.engines.llamacpp.install import find_install

    model = materialize(ref)
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
        set_version_tags(model, {Tag.GGUF_RUN: run.run_id, Tag.GGUF_SHA256: sha, Tag.GGUF_QUANTIZATION: quantization,
                                 Tag.LLAMACPP_VERSION: install.version})
        return Packaged(ref, gguf, sha, quantization, install.version, run.run_id)


def fetch_packaged(model, quantization: str) -> Path | None:
    """The version's packaged GGUF in the local cache (fetched from its package run when missing), checked
    against its sha256; None when the version has no package of that quantization."""
    from mlops.files import file_sha256
    from mlops.model_refs import download
    from serving.engines.llamacpp.artifact import cached_path

    tags = model.version_tags
    if tags.get(Tag.GGUF_QUANTIZATION) != quantization or not tags.get(Tag.GGUF_RUN):
        return None
    target = cached_path(model.hf_dir, quantization, tags.get(Tag.LLAMACPP_VERSION, ""))
    if not target.is_file():
        fetched = download(f"runs:/{tags[Tag.GGUF_RUN]}/gguf/{target.name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        import shutil

        shutil.copyfile(fetched, target.with_suffix(".partial"))
        target.with_suffix(".partial").replace(target)
    actual = file_sha256(target)
    if actual != tags[Tag.GGUF_SHA256]:
        raise PackageMismatch(
            f"{target} has sha256 {actual[:12]}, but version {model.name}/{model.version} was packaged as "
            f"{tags[Tag.GGUF_SHA256][:12]}: it is not the artifact that was released. Fix: delete it and serve "
            f"again (the packaged file is fetched), or re-run `mlops release package {model.ref} --quant "
            f"{quantization}`.")
    return target
