"""`mlops release package`: llama.cpp's converter and quantizer make the version's GGUF, logged on it with its
sha256; a server fetches exactly that file and refuses one that differs."""

from __future__ import annotations

import pytest

from mlops.lineage import Tag


def _registered_llamacpp_version(tmp_path, tiny_model) -> tuple[dict, str]:
    """A registry, and a version of the tiny model whose profile names llama.cpp f16, registered by tina."""
    import shutil

    from mlops.profile import load_profile
    from mlops.tracking import init_experiment
    from registry.release import register
    from registry.testing import make_identities, training_run

    folder = tmp_path / "tiny-pbot"
    shutil.copytree(tiny_model["path"], folder)
    load_profile(folder).model_copy(update={"engine": "llamacpp", "quantization": "f16"}).save(folder)
    init_experiment("registry-test")
    who = make_identities()
    run_id = training_run(folder, tmp=tmp_path / "runs", variant=1)
    return who, register(who["tina"], run_id, "pbot")


@pytest.mark.slow  # a heavy run on 2 cores: CI runs it (CI=true), `make test` leaves it
def test_package_is_a_signed_act_and_serving_loads_exactly_the_packaged_gguf(mlops_home, tiny_model, tmp_path,
                                                                            request):
    from mlops.files import file_sha256
    from mlops.identities import AuthError
    from mlops.model_refs import resolve_model_ref
    from mlops.run_store import get_run
    from registry import ledger
    from serving.engines.llamacpp.artifact import gguf_for
    from serving.engines.llamacpp.package import PackageMismatch, fetch_packaged, package

    request.getfixturevalue("tiny_gguf")  # llama.cpp is built (or this says why not)
    who, version = _registered_llamacpp_version(tmp_path, tiny_model)
    ref = f"models:/pbot/{version}"
    with pytest.raises(AuthError, match="signed act"):
        package(ref, "f16")  # no identity, no package
    done = package(ref, "f16", actor=who["tina"])
    assert done.sha256 == file_sha256(done.gguf) and done.gguf.name == "model-f16.gguf"
    signed = [e for e in ledger.entries("pbot") if e.action == "package"][-1]
    assert (signed.actor, signed.evidence["sha256"], signed.evidence["run"]) == ("tina", done.sha256, done.run_id)
    model = resolve_model_ref(ref)
    assert model.version_tags[Tag.GGUF_SHA256] == done.sha256  # the display copy
    assert get_run(done.run_id).data.params["llamacpp_version"] == done.llamacpp_version
    assert fetch_packaged(model, "q8_0") is None  # no package of that type
    done.gguf.unlink()  # another machine: the cache is empty, the logged file is fetched
    fetched = fetch_packaged(model, "f16")
    assert fetched == done.gguf and file_sha256(fetched) == done.sha256
    fetched.write_bytes(fetched.read_bytes()[:-1] + b"\0")  # not the released artifact any more
    with pytest.raises(PackageMismatch, match="not the artifact that was released"):
        fetch_packaged(model, "f16")
    with pytest.raises(PackageMismatch, match="not the artifact that was released"):
        gguf_for(model.hf_dir, "f16")  # the engine's own load refuses the cached copy too


def test_package_refuses_an_unknown_quantization_naming_the_choices(mlops_home):
    from typer.testing import CliRunner

    from mlops.cli import _register_stages, app

    _register_stages()
    out = CliRunner().invoke(app, ["release", "package", "models:/x/1", "--quant", "q3"])
    assert out.exit_code != 0 and "f16, q8_0, q4_k_m" in (out.output + str(out.exception))
