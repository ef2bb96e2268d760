"""`mlops release package`: llama.cpp's converter and quantizer make the version's GGUF, logged on it with its
sha256; a server fetches exactly that file and refuses one that differs."""

from __future__ import annotations

import pytest

from mlops.lineage import Tag


def test_package_logs_the_gguf_on_the_version_and_serving_fetches_exactly_it(mlops_home, tiny_model, tmp_path,
                                                                              request):
    from mlops.files import file_sha256
    from mlops.model_refs import resolve_model_ref
    from mlops.run_store import get_run
    from serving.engines.llamacpp.package import PackageMismatch, fetch_packaged, package
    from tests.test_eval_runner import _register_with_profile

    request.getfixturevalue("tiny_gguf")  # llama.cpp is built (or this says why not)
    version = _register_with_profile(tmp_path, tiny_model, "pbot", engine="llamacpp", quantization="f16")
    ref = f"models:/pbot/{version}"
    done = package(ref, "f16")
    assert done.sha256 == file_sha256(done.gguf) and done.gguf.name == "model-f16.gguf"
    model = resolve_model_ref(ref)
    tags = model.version_tags
    assert (tags[Tag.GGUF_SHA256], tags[Tag.GGUF_QUANTIZATION], tags[Tag.GGUF_RUN]) == (done.sha256, "f16",
                                                                                        done.run_id)
    assert get_run(done.run_id).data.params["llamacpp_version"] == done.llamacpp_version
    assert fetch_packaged(model, "q8_0") is None  # no package of that type
    done.gguf.unlink()  # another machine: the cache is empty, the logged file is fetched
    fetched = fetch_packaged(model, "f16")
    assert fetched == done.gguf and file_sha256(fetched) == done.sha256
    fetched.write_bytes(fetched.read_bytes()[:-1] + b"\0")  # not the released artifact any more
    with pytest.raises(PackageMismatch, match="not the artifact that was released"):
        fetch_packaged(model, "f16")


def test_package_refuses_an_unknown_quantization_naming_the_choices(mlops_home):
    from typer.testing import CliRunner

    from mlops.cli import _register_stages, app

    _register_stages()
    out = CliRunner().invoke(app, ["release", "package", "models:/x/1", "--quant", "q3"])
    assert out.exit_code != 0 and "f16, q8_0, q4_k_m" in (out.output + str(out.exception))
