"""Every command the README shows exists as written: each `mlops ...` line names a real command whose `--help`
renders and which takes every option the line uses; each `mlflow run` names a real entry point and parameters;
each `make` target and script path exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

DOCS = [REPO / "README.md", REPO / "evaluation" / "suites" / "README.md"]
# Programs that are not ours: the README shows them for context (shell, PostgreSQL, MLflow's server, pip).
OTHERS = {"export", "source", "cd", "createdb", "psql", "pip", "curl", "optuna-dashboard", "docker", "git", "cat",
          "deepspeed", "torchrun", "ssh", "echo", "apt-get", "sudo", "unset", "kill", "ls", "open", "ray"}


def shell_lines(text: str) -> list[str]:
    """Commands in ```bash blocks: continuation lines joined, comments and prompts removed."""
    lines = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def commands(line: str) -> list[list[str]]:
    """The simple commands of one line (split at pipes, && and ;), env assignments in front dropped."""
    out = []
    line = re.sub(r"<[^<>]*>", "PLACEHOLDER", line)  # <snapshot id|latest> is one argument, not a pipe
    for part in re.split(r"\s*(?:\|\||&&|\||;)\s*", line):
        try:
            words = shlex.split(part.replace("[", "'[").replace("]", "]'"))
        except ValueError:
            words = part.split()
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            words.pop(0)
        if words and words[0] == "exec":
            words.pop(0)
        if words and not words[0].startswith(">"):
            out.append(words)
    return out


DOCUMENTED = sorted({(doc.name, tuple(c)) for doc in DOCS for line in shell_lines(doc.read_text())
                     for c in commands(line)})


@pytest.fixture(scope="module")
def cli():
    import typer

    from mlops.cli import _register_stages, app

    _register_stages()
    return app, typer.main.get_command(app)


def _resolve(cli, words: list[str]):
    command, path = cli, []
    for word in words:
        subs = getattr(command, "commands", {})
        sub = subs.get(word)
        if sub is None and type(command).__name__ == "_CreateByDefault" and "create" in subs:
            sub, word = subs["create"], "create"  # `spot-check <model> <version>` means `spot-check create ...`
            command, path = sub, [*path, word]
            break
        if sub is None:
            break
        command, path = sub, [*path, word]
    return command, path


def test_the_readme_documents_the_release_loop_commands():
    used = {c[:3] for _, c in DOCUMENTED}
    for expected in [("make", "demo"), ("make", "test"), ("mlops", "registry", "report"),
                     ("mlops", "registry", "rollback"), ("mlops", "serve", "--model"), ("mlops", "data", "harvest")]:
        assert any(u[: len(expected)] == expected for u in used), expected


@pytest.mark.parametrize("doc,words", [d for d in DOCUMENTED if d[1][0] == "mlops"], ids=lambda v: " ".join(v)
                         if isinstance(v, tuple) else v)
def test_documented_mlops_command_exists_with_its_options(cli, doc, words):
    from typer.testing import CliRunner

    app, root = cli
    command, path = _resolve(root, list(words[1:]))
    assert path, f"{doc}: `{' '.join(words)}` names no mlops command"
    shown = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    options = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    used = [w.split("=")[0] for w in words[1 + len(path):] if w.startswith("--")]
    unknown = [o for o in used if o not in options]
    assert not unknown, f"{doc}: `{' '.join(words)}` uses {unknown}; `mlops {' '.join(path)}` takes {sorted(options)}"


def test_documented_mlflow_runs_name_real_entry_points_and_parameters():
    project = yaml.safe_load((REPO / "mlproject" / "MLproject").read_text())["entry_points"]
    for doc, words in DOCUMENTED:
        if words[:2] != ("mlflow", "run"):
            continue
        entry = words[words.index("-e") + 1]
        assert entry in project, f"{doc}: `mlflow run -e {entry}`: no such entry point"
        params = [words[i + 1].split("=")[0] for i, w in enumerate(words) if w == "-P"]
        unknown = [p for p in params if p not in project[entry].get("parameters", {})]
        assert not unknown, f"{doc}: entry point {entry} takes no {unknown}"


def test_documented_make_targets_scripts_and_programs_exist():
    makefile = (REPO / "Makefile").read_text()
    for doc, words in DOCUMENTED:
        head = words[0]
        if head == "make":
            targets = [w for w in words[1:] if "=" not in w] or ["all"]
            for target in targets:
                assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), f"{doc}: make {target}"
        elif head in ("python", "python3", ".venv/bin/python", "bash"):
            if words[1] == "-m":
                module = words[2]
                assert (REPO / (module.replace(".", "/") + ".py")).exists(), f"{doc}: python -m {module}"
            else:
                assert (REPO / words[1]).exists(), f"{doc}: {' '.join(words[:2])}"
        elif head in ("mlops", "mlflow", ".venv/bin/mlflow"):
            continue
        else:
            assert head in OTHERS or Path(head).name in OTHERS, f"{doc}: `{' '.join(words)}`: unknown program"
