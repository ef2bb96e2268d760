"""No code from a model folder: a candidate that ships Python (or names it in `auto_map`) is refused before the
llama.cpp converter, the hf engine or a model ref ever loads it, and llama.cpp's tools run without our secrets."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from mlops.model_safety import UnsafeModelFolder, require_no_code

SECRETS = {"MLOPS_REGISTRY_DB": "postgresql://registry:hunter2@db/registry",
           "MLFLOW_TRACKING_URI": "postgresql://mlflow:hunter2@db/mlflow",
           "AWS_SECRET_ACCESS_KEY": "aws-secret", "AWS_ACCESS_KEY_ID": "aws-id", "PGPASSWORD": "hunter2",
           "HF_TOKEN": "hf_secret", "DATABASE_URL": "postgresql://x:y@db/z", "MLOPS_SIGNING_PASSPHRASE": "p"}
# A converter as llama.cpp's is for some architectures: it loads the folder's tokenizer trusting remote code.
TRUSTING_CONVERTER = """import json, os, sys
out, model = sys.argv[sys.argv.index("--outfile") + 1], sys.argv[1]
from transformers import AutoTokenizer
AutoTokenizer.from_pretrained(model, trust_remote_code=True)
open(out, "w").write(json.dumps(dict(os.environ)))
"""


@pytest.fixture
def evil_model(tiny_model, tmp_path) -> tuple[Path, Path]:
    """A copy of the tiny model with a tokenizer module that leaves a marker when imported, named in
    tokenizer_config.json's auto_map; and where the marker would appear."""
    folder, marker = tmp_path / "candidate", tmp_path / "pwned"
    shutil.copytree(tiny_model["path"], folder)
    (folder / "tokenization_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n"
        "from transformers import PreTrainedTokenizerFast as EvilTokenizer  # noqa\n")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder, marker


def fake_install(tmp_path: Path, converter: str):
    from serving.engines.llamacpp.install import LlamaCppInstall

    src = tmp_path / "llama.cpp"
    (src / "gguf-py").mkdir(parents=True)
    (src / "convert_hf_to_gguf.py").write_text(converter)
    return LlamaCppInstall("fake", tmp_path / "bin", src)


def test_a_model_folder_with_python_is_refused_before_conversion(evil_model, tmp_path):
    from serving.engines.llamacpp.artifact import gguf_for

    folder, marker = evil_model
    install = fake_install(tmp_path, TRUSTING_CONVERTER)
    with pytest.raises(UnsafeModelFolder) as err:
        gguf_for(folder, "f16", out_dir=tmp_path / "gguf", install=install)
    message = str(err.value)
    assert "tokenization_evil.py" in message and "auto_map" in message and "Fix:" in message
    assert not marker.exists()
    assert not list((tmp_path / "gguf").rglob("*.gguf*"))


def test_a_model_folder_with_python_is_refused_by_the_hf_engine(evil_model):
    from serving.engine import EngineSpec, build_engine

    folder, marker = evil_model
    with pytest.raises(UnsafeModelFolder, match="tokenization_evil.py"):
        build_engine(folder, EngineSpec("hf"))
    assert not marker.exists()


def test_a_model_ref_to_a_folder_with_python_is_refused_when_materialized(evil_model, mlops_home):
    from mlops.model_refs import materialize

    folder, marker = evil_model
    with pytest.raises(UnsafeModelFolder, match="tokenization_evil.py"):
        materialize(str(folder))
    assert not marker.exists()


def test_auto_map_alone_is_refused_even_without_python_in_the_folder(tiny_model, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_model["path"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"] = {"auto_map": {"AutoModelForCausalLM": "other/repo--modeling_x.Model"}}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsafeModelFolder, match=r"config.json \(sets auto_map"):
        require_no_code(folder)


@pytest.mark.parametrize("name, content", [
    ("sub/modeling_x.py", b"print(1)"),
    ("__pycache__/x.cpython-311.pyc", b"\x00"),
    ("libevil.so", b"\x7fELF..."),
    ("weights-loader", b"\x7fELF..."),  # a native library under a harmless name
    ("run", b"#!/bin/sh\necho hi\n"),
    ("optimizer.pkl", b"\x80\x04."),
    ("README.md", b"---\ntags:\n- custom_code\n---\n# a model\n"),
    ("processor_config.json", b'{"auto_map": {"AutoProcessor": "processing_x.P"}}'),
    ("generation_config.json", b'{"trust_remote_code": true}'),
])
def test_each_kind_of_code_in_a_model_folder_is_refused_naming_the_file(tiny_model, tmp_path, name, content):
    folder = tmp_path / "m"
    shutil.copytree(tiny_model["path"], folder)
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(content)
    with pytest.raises(UnsafeModelFolder) as err:
        require_no_code(folder)
    assert name in str(err.value) and "Fix:" in str(err.value)


def test_a_link_to_a_folder_inside_a_model_folder_is_refused(tiny_model, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_model["path"], folder)
    (tmp_path / "elsewhere").mkdir()
    (folder / "extra").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(UnsafeModelFolder, match="extra"):
        require_no_code(folder)


def test_a_folder_of_weights_tokenizer_and_template_passes(tiny_model, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_model["path"], folder)
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\nrun it with `python -m x`\n")
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    (folder / "deployment.yaml").write_text("engine: hf\n")
    assert require_no_code(folder) == folder
    assert require_no_code(folder / "model.safetensors") == folder / "model.safetensors"  # a file: not a folder


# --------------------------------------------------------------------------- llama.cpp's environment


def test_the_child_environment_of_llamacpp_tools_drops_every_secret(monkeypatch, tmp_path):
    from mlops.child_env import child_env

    for key, value in {**SECRETS, "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(key, value)
    env = child_env(tmp_path / "home", {"PYTHONPATH": "/llama.cpp/gguf-py"})
    assert not set(SECRETS) & set(env)
    assert not [k for k in env if k.startswith("MLOPS_") or k.startswith("MLFLOW_")]
    assert "hunter2" not in json.dumps(env)
    assert env["HOME"] == str(tmp_path / "home") and env["PATH"] == os.environ["PATH"]
    assert env["HF_HUB_OFFLINE"] == env["HF_DATASETS_OFFLINE"] == "1"
    assert (env["LC_ALL"], env["OMP_NUM_THREADS"], env["PYTHONPATH"]) == ("C.UTF-8", "1", "/llama.cpp/gguf-py")


def test_the_converter_runs_with_a_fresh_home_and_none_of_our_secrets(tiny_model, tmp_path, monkeypatch):
    from serving.engines.llamacpp.artifact import convert

    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    dump = "import json, os, sys\nout = sys.argv[sys.argv.index('--outfile') + 1]\n" \
           "json.dump({'env': dict(os.environ), 'home': os.listdir(os.environ['HOME'])}, open(out, 'w'))\n"
    install = fake_install(tmp_path, dump)
    target = convert(Path(tiny_model["path"]), tmp_path / "out" / "model-f16.gguf", "f16", install)
    seen = json.loads(target.read_text())
    assert not set(SECRETS) & set(seen["env"]) and "hunter2" not in json.dumps(seen["env"])
    assert seen["home"] == [] and seen["env"]["HOME"] != os.environ.get("HOME")
    assert not Path(seen["env"]["HOME"]).exists()  # removed once the converter ended
    assert seen["env"]["PYTHONPATH"] == str(install.src / "gguf-py")


def test_llama_server_starts_with_none_of_our_secrets(tmp_path, monkeypatch):
    from serving.engines.llamacpp.server_process import LlamaServer, LlamaServerError

    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    seen = tmp_path / "env.json"
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\nimport json, os\njson.dump(dict(os.environ), open({str(seen)!r}, 'w'))\n"
                      "raise SystemExit(3)\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(LlamaServerError, match="exited with 3"):
        LlamaServer(binary, tmp_path / "m.gguf", threads=1, batch_threads=1, parallel=1, ctx_per_slot=64,
                    start_timeout=30)
    env = json.loads(seen.read_text())
    assert not set(SECRETS) & set(env) and "hunter2" not in json.dumps(env)
    assert env["HOME"] != os.environ.get("HOME")


def test_a_real_conversion_still_works_without_our_environment(tiny_model, tmp_path, monkeypatch):
    from serving.engines.llamacpp.artifact import gguf_for
    from serving.engines.llamacpp.install import LlamaCppMissing, find_install

    try:
        install = find_install()
    except LlamaCppMissing as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{err} Under CI=true the llamacpp tests may not skip.")
        pytest.skip(str(err))
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    # The parent's own ledger lookup of a signed package would try the fake database: this test is about the child.
    monkeypatch.setattr("serving.engines.llamacpp.artifact.packaged_record", lambda *_a: None)
    gguf = gguf_for(Path(tiny_model["path"]), "f16", out_dir=tmp_path / "gguf", install=install)
    assert gguf.read_bytes()[:4] == b"GGUF"
