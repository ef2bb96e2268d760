"""Eval suites: versioned sets of local lm-eval tasks, one folder each (`suite.yaml` + JSONL items).

A suite folder holds `suite.yaml` (name, version, items_sha256, tasks) and the JSONL item files it names.
`items_sha256` fingerprints every item file: changing an item without bumping `version` and the fingerprint
is refused, so a suite version always means the same items. Suites register by name on first use; an unknown
name answers with the available ones. Task configs are built as Python dicts (absolute data paths, scorer
functions) and handed to `lm_eval.simple_evaluate` through `TaskManager(include_defaults=False)`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import yaml

from mlops.errors import ConfigError, MLOpsError
from mlops.plugins import Registry

SUITES_DIR = Path(__file__).resolve().parent
SPEC_FILE = "suite.yaml"
KINDS = ("multiple_choice", "generate")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    file: Path
    kind: str  # multiple_choice | generate
    primary: str  # the metric the gate compares
    area: str  # general area or business dimension
    template: str = "{{prompt}}"
    scorer: str | None = None  # generation scorer (evaluation.metrics.SCORERS)
    max_gen_toks: int = 64
    target_delimiter: str | None = None  # between prompt and answer; None: lm-eval's (a space)
    rendered: bool = False  # prompts already rendered with the chat template (as trained): never rendered again

    def items(self) -> list[dict]:
        import json

        return [json.loads(line) for line in self.file.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass(frozen=True)
class Suite:
    name: str
    version: int
    description: str
    folder: Path
    fingerprint: str
    tasks: list[TaskSpec] = field(default_factory=list)
    baseline_margin: float = 0.10  # trivial-baseline rules must stay within chance +/- this (evaluation.baselines)

    @property
    def label(self) -> str:
        return f"{self.name}@v{self.version}"

    def task(self, name: str) -> TaskSpec:
        return next(t for t in self.tasks if t.name == name)


SUITES: Registry[Suite] = Registry("eval suite")
_LOADED: set[Path] = set()


def items_fingerprint(folder: Path) -> str:
    """sha256 over every item file of a suite folder (names and bytes, sorted)."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.jsonl")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def load_suite(folder: Path, *, check_fingerprint: bool = True) -> Suite:
    folder = Path(folder).resolve()
    spec_path = folder / SPEC_FILE
    try:
        spec = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"suite spec {spec_path} cannot be read ({err}). Fix: restore that file.") from None
    fingerprint = items_fingerprint(folder)
    if check_fingerprint and spec.get("items_sha256") != fingerprint:
        raise MLOpsError(
            f"suite '{spec.get('name')}' v{spec.get('version')} at {folder}: its items changed "
            f"(sha256 {fingerprint[:12]}, recorded {str(spec.get('items_sha256'))[:12]}). A suite version must "
            "always mean the same items. Fix: bump `version` in suite.yaml and set `items_sha256` to "
            f"{fingerprint}."
        )
    tasks = []
    for raw in spec["tasks"]:
        if raw["kind"] not in KINDS:
            raise ConfigError(f"task '{raw['name']}' in {spec_path} has kind '{raw['kind']}'; use one of {KINDS}.")
        tasks.append(TaskSpec(
            name=raw["name"], file=folder / raw["file"], kind=raw["kind"], primary=raw["primary"],
            area=raw["area"], template=raw.get("template", "{{prompt}}"), scorer=raw.get("scorer"),
            max_gen_toks=int(raw.get("max_gen_toks", 64)), target_delimiter=raw.get("target_delimiter"),
            rendered=bool(raw.get("rendered", False)),
        ))
    return Suite(spec["name"], int(spec["version"]), spec.get("description", ""), folder, fingerprint, tasks,
                 float(spec.get("baseline_margin", 0.10)))


def discover(extra_paths: list[str] | tuple[str, ...] = ()) -> Registry[Suite]:
    """Register the built-in suites (and any under `extra_paths`) once."""
    for root in [SUITES_DIR, *(Path(p) for p in extra_paths)]:
        for spec in sorted(Path(root).glob(f"*/{SPEC_FILE}")):
            folder = spec.parent.resolve()
            if folder in _LOADED:
                continue
            suite = load_suite(folder, check_fingerprint=False)
            SUITES.add(suite.name, suite)
            _LOADED.add(folder)
    return SUITES


def get_suites(names: list[str] | str, extra_paths: list[str] | tuple[str, ...] = ()) -> list[Suite]:
    """Suites by name ('general,business' or a list); unknown names fail with the available ones."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"no eval suites named. Fix: pass --suites with some of: {', '.join(discover(extra_paths).names())}.")
    registry = discover(extra_paths)
    # Re-read with the fingerprint check: an edited item file must not pass under an old version.
    return [load_suite(registry.get(name).folder) for name in names]


def task_config(suite: Suite, task: TaskSpec) -> dict:
    """The lm-eval task config (a dict, so data paths are absolute and scorers are plain functions)."""
    config = {
        "task": task.name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(task.file)}},
        "test_split": "test",
        "doc_to_text": task.template,
        "metadata": {"version": suite.version, "suite": suite.name, "area": task.area,
                     **({"rendered": True} if task.rendered else {})},
    }
    if task.target_delimiter is not None:
        config["target_delimiter"] = task.target_delimiter
    if task.kind == "multiple_choice":
        config |= {
            "output_type": "multiple_choice",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{answer}}",
            "metric_list": [
                {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
            ],
        }
    else:
        from evaluation.metrics import METRICS

        config |= {
            "output_type": "generate_until",
            "doc_to_target": "{{target}}" if task.scorer != "checks" else "{{checks | tojson}}",
            "generation_kwargs": {"until": ["\n\n"], "max_gen_toks": task.max_gen_toks, "do_sample": False},
            "process_results": partial(_process, task.scorer),
            "metric_list": [
                {"metric": m, "aggregation": "mean", "higher_is_better": True} for m in METRICS[task.scorer]
            ],
        }
    return config


def _process(scorer: str, doc: dict, results: list[str]) -> dict[str, float]:
    from evaluation.metrics import SCORERS

    return SCORERS[scorer](doc, results[0])
