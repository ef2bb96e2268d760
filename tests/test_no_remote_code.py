"""House rule: no code from a model folder, anywhere. Every transformers load we write says
`trust_remote_code=False`, and nothing in the source turns it on."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("mlops", "training", "evaluation", "serving", "registry", "app", "scripts", "benchmarks")
LOADERS = {"from_pretrained"}  # AutoModel*/AutoTokenizer/AutoConfig/PeftModel/GenerationConfig/... all load here
PIPELINES = {"pipeline"}  # transformers.pipeline(...) loads a model folder too


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES if (REPO / pkg).is_dir() for p in (REPO / pkg).rglob("*.py"))


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _is_false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def remote_code_problems(source: str, where: str) -> list[str]:
    """Loads without an explicit `trust_remote_code=False`, and any `trust_remote_code` that is not False
    (a keyword, a dict entry, `**{...}` or a string of model args)."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            given = {k.arg: k.value for k in node.keywords if k.arg}
            if _called(node) in LOADERS | PIPELINES and not _is_false(given.get("trust_remote_code", ast.Constant(1))):
                problems.append(f"{where}:{node.lineno}: {_called(node)}(...) without trust_remote_code=False")
            elif "trust_remote_code" in given and not _is_false(given["trust_remote_code"]):
                problems.append(f"{where}:{node.lineno}: trust_remote_code={ast.unparse(given['trust_remote_code'])}")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "trust_remote_code" and not _is_false(value):
                    problems.append(f"{where}:{node.lineno}: 'trust_remote_code': {ast.unparse(value)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.replace(" ", "").lower()
            if "trust_remote_code=true" in text or "trust-remote-code" in text:
                problems.append(f"{where}:{node.lineno}: a string turns remote code on: {node.value[:80]!r}")
    return problems


def test_no_source_file_loads_a_model_folder_that_may_run_its_own_code():
    problems = [p for path in sources() for p in remote_code_problems(path.read_text(encoding="utf-8"),
                                                                       str(path.relative_to(REPO)))]
    assert not problems, "pass trust_remote_code=False explicitly, never True:\n" + "\n".join(problems)


def test_the_source_walk_catches_every_way_of_turning_remote_code_on():
    bad = """
AutoTokenizer.from_pretrained(path)
AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
AutoConfig.from_pretrained(path, trust_remote_code=flag)
pipeline("text-generation", model=path)
simple_evaluate(model="hf", model_args={"pretrained": path, "trust_remote_code": True})
simple_evaluate(model="hf", model_args="pretrained=x,trust_remote_code=True")
"""
    assert len(remote_code_problems(bad, "bad.py")) == 6
    good = "AutoTokenizer.from_pretrained(path, trust_remote_code=False)\nargs = {'trust_remote_code': False}\n"
    assert remote_code_problems(good, "good.py") == []
