"""Small helpers for tests and for other stages that need a real snapshot quickly.

    quick_build(records, base_model=tiny_model["path"], workdir=tmp_path, **data) -> BuildResult
        # writes `records` (chat / instruction / text dicts) to a JSONL file and runs the real pipeline on it
        # with a MemoryTracker: a few seconds for a few dozen records.
    chat(user, assistant, domain="general") -> dict   # one chat record

For a snapshot straight from token ids (no tokenizer, no pipeline) use `mlops.data.format.write_snapshot`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Two near duplicates (one word changed) and an unrelated text, for dedup tests.
BASE = ("My router lights blink orange since the storm on Monday and the internet drops every evening "
        "around eight, I already restarted it twice and checked the cables behind the TV.")
SIMILAR = ("My router lights blink orange since the storm on Monday and the internet drops every evening "
           "around eight, I already restarted it two times and checked the cables behind the TV.")
DIFFERENT = ("I was charged twice for my March invoice and the promised discount is missing, please refund "
             "the duplicate charge to the card ending in the same digits as last time.")


def chat(user: str, assistant: str, domain: str = "general", system: str | None = None) -> dict:
    messages = [{"role": "system", "content": system}] if system else []
    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"messages": messages, "domain": domain}


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def quick_config(sources: list[str | Path], base_model: str | Path, seed: int = 1234, **data: Any):
    from mlops.config import validate_config

    # Test corpora are mostly planted junk, so acceptance flags rather than fails (outside the config hash: the
    # snapshot ids are those of a plain config); tests of acceptance itself set data.accept.on_fail=fail.
    section = {
        "sources": [{"path": str(p)} for p in sources], "batch_size": 16, "seq_len": 256, "workers": 1,
        "validation_fraction": 0.1, "accept": {"on_fail": "flag"},
    }
    return validate_config({"base_model": str(base_model), "run": {"seed": seed, "experiment": "data-tests"},
                            "data": _merge(section, data)})


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write((record if isinstance(record, str) else json.dumps(record, ensure_ascii=False)) + "\n")
    return path


def quick_build(records: list[Any], *, base_model: str | Path, workdir: Path, name: str = "records.jsonl",
                tracker: Any = None, force: bool = False, seed: int = 1234, **data: Any):
    """Run the real pipeline on `records`; returns the BuildResult (tracker defaults to a MemoryTracker)."""
    from mlops.data.build import build_snapshot
    from mlops.tracking import MemoryTracker

    source = write_jsonl(Path(workdir) / name, records)
    cfg = quick_config([source], base_model, seed=seed, **data)
    return build_snapshot(cfg, tracker if tracker is not None else MemoryTracker(), force=force)
