"""Search spaces: named defaults, merged with the sweep config's `params`, validated against the base config.

A parameter maps to a dotted config key (`train.lr`) and is applied to a copy of the base config, so a trial's
config is an ordinary config that validates, hashes and trains like any other. `of: train.max_steps` makes the
value a fraction of that key (a warmup *ratio* becomes `train.warmup_steps`). Keys under `data.` change the
data mix: the trial then builds (or reuses, the build is content-keyed) its own snapshot.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from mlops.config import set_dotted
from mlops.errors import ConfigError, NotFoundError
from mlops.plugins import Registry
from training.sweep.config import ParamSpec

SPACES: Registry[dict[str, ParamSpec]] = Registry("search space")
CATEGORICAL_TYPES = (type(None), bool, int, float, str)
RESERVED_KEYS = ("run.experiment", "run.run_name")  # trials live in the parent's experiment


def _p(**kwargs: Any) -> ParamSpec:
    return ParamSpec(**kwargs)


_WARMUP = _p(key="train.warmup_steps", type="float", low=0.0, high=0.2, of="train.max_steps")
_BATCH = {
    "micro_batch_size": _p(key="train.micro_batch_size", type="categorical", choices=[2, 4, 8]),
    "grad_accum": _p(key="train.grad_accum", type="categorical", choices=[1, 2, 4]),
}
SPACES.add("lr", {"lr": _p(key="train.lr", type="float", low=1e-5, high=1e-2, log=True)})
SPACES.add(
    "lora",
    {
        "lr": _p(key="train.lr", type="float", low=1e-5, high=1e-3, log=True),
        "lora_r": _p(key="train.lora.r", type="categorical", choices=[4, 8, 16, 32]),
        "lora_alpha": _p(key="train.lora.alpha", type="categorical", choices=[8, 16, 32, 64]),
        "warmup_ratio": _WARMUP,
        **_BATCH,
    },
)
SPACES.add(
    "lora-mix",
    {
        **SPACES.get("lora"),
        "history_ratio": _p(key="data.mix.history.ratio", type="float", low=0.1, high=0.5),
    },
)
SPACES.add(
    "full",
    {
        "lr": _p(key="train.lr", type="float", low=1e-6, high=1e-4, log=True),
        "weight_decay": _p(key="train.weight_decay", type="float", low=0.0, high=0.1),
        "warmup_ratio": _WARMUP,
        **_BATCH,
    },
)


def resolve_space(space: str, params: Mapping[str, ParamSpec]) -> dict[str, ParamSpec]:
    """The registered space with the config's params merged in, field by field; disabled params dropped."""
    try:
        merged = {name: spec.model_copy() for name, spec in SPACES.get(space).items()} if space else {}
    except NotFoundError as err:
        raise ConfigError(
            f"sweep.space='{space}': {err}. Fix: set sweep.space to one of those names "
            "(`mlops sweep spaces` lists them), or to '' and declare every parameter under sweep.params."
        ) from None
    for name, spec in params.items():
        base = merged.get(name)
        if base is None:
            merged[name] = spec
        else:
            merged[name] = base.model_copy(update={f: getattr(spec, f) for f in spec.model_fields_set})
    resolved = {}
    for name, spec in merged.items():
        if spec.enabled:
            resolved[name] = spec if spec.key else spec.model_copy(update={"key": f"train.{name}"})
    return resolved


# --------------------------------------------------------------------------- validation


def _shape_problems(name: str, s: ParamSpec) -> list[str]:
    where = f"sweep.params.{name}"
    if s.type == "categorical":
        if not s.choices:
            return [f"{where} is categorical but has no choices (got {s.choices!r}). Fix: set `choices: [a, b, ...]`."]
        odd = [c for c in s.choices if not isinstance(c, CATEGORICAL_TYPES)]
        if odd:
            return [f"{where}.choices holds {odd!r}; choices must be numbers, strings, booleans or null. "
                    "Fix: list scalar values only."]
        extra = [f for f in ("low", "high", "step") if getattr(s, f) is not None] + (["log"] if s.log else [])
        return [f"{where} is categorical, so {', '.join(extra)} do not apply. Fix: remove them or use "
                "type float/int."] if extra else []
    problems = []
    if s.choices is not None:
        problems.append(f"{where} has choices but type {s.type}. Fix: set `type: categorical` or drop `choices`.")
    if s.low is None or s.high is None:
        return problems + [f"{where} ({s.type}) needs both low and high, got low={s.low} high={s.high}. "
                           "Fix: set both bounds."]
    if not (math.isfinite(s.low) and math.isfinite(s.high)):
        problems.append(f"{where} has a non-finite bound (low={s.low}, high={s.high}). Fix: use finite numbers.")
    if s.low > s.high:
        problems.append(f"{where} has low={s.low} > high={s.high}. Fix: swap them so low <= high.")
    if s.log and s.low <= 0:
        problems.append(f"{where} uses a log scale with low={s.low}; a log scale needs bounds > 0. "
                        "Fix: raise low above 0 (e.g. 1e-6) or set `log: false`.")
    if s.log and s.step is not None:
        problems.append(f"{where} sets both log and step={s.step}; Optuna allows only one. Fix: drop one of them.")
    if s.step is not None and s.step <= 0:
        problems.append(f"{where} has step={s.step}; a step must be > 0. Fix: use a positive step or none.")
    if s.type == "int":
        bad = [f"{f}={v}" for f, v in (("low", s.low), ("high", s.high), ("step", s.step))
               if v is not None and float(v) != int(v)]
        if bad:
            problems.append(f"{where} is an int parameter with {', '.join(bad)}. Fix: use whole numbers "
                            "or `type: float`.")
    return problems


def candidates(s: ParamSpec) -> list[tuple[str, Any]]:
    """The values whose configs must validate: both bounds, or every choice."""
    if s.type == "categorical":
        return [(f"choice {c!r}", c) for c in s.choices or []]
    cast = int if s.type == "int" else float
    return [("its low bound", cast(s.low)), ("its high bound", cast(s.high))]


def validate_space(params: Mapping[str, ParamSpec], base_data: Mapping[str, Any]) -> None:
    """Every problem at once, each naming the parameter, the value and the fix; nothing runs before this."""
    from mlops.config import validate_config

    if not params:
        raise ConfigError(
            "the search space is empty: no enabled parameter in sweep.space plus sweep.params. "
            "Fix: name a registered space (`mlops sweep spaces`) or declare parameters under sweep.params."
        )
    problems: list[str] = []
    for name, spec in params.items():
        shape = _shape_problems(name, spec)
        if shape:
            problems += shape
            continue
        if spec.key.startswith("sweep.") or spec.key in RESERVED_KEYS:
            problems.append(f"sweep.params.{name} sets '{spec.key}', which the sweep itself decides. "
                            "Fix: search a train.* or data.* key.")
            continue
        if spec.key.startswith("data.") and not (base_data.get("data") or {}).get("sources"):
            problems.append(f"sweep.params.{name} sets '{spec.key}', but the base config has no `data:` section "
                            "with sources to rebuild the snapshot from. Fix: base the sweep on a config that "
                            "holds the data section the snapshot was built with, or drop the parameter.")
            continue
        for label, value in candidates(spec):
            try:
                validate_config(apply_values({name: spec}, {name: value}, base_data), source="the trial config")
            except ConfigError as err:
                problems.append(f"sweep.params.{name} ({spec.key}) at {label} = {value!r} makes an invalid "
                                f"trial config: {err} For the sweep that means: correct sweep.params.{name}.key, "
                                "or narrow its range so every value it can take is valid.")
                break
    if problems:
        raise ConfigError(" ".join(problems))


def validate_enqueued(params: Mapping[str, ParamSpec], entries: list[dict[str, Any]]) -> None:
    """Fixed-param trials (sweep.enqueue) must name searched parameters with values inside their ranges."""
    problems = []
    for i, entry in enumerate(entries):
        for name, value in entry.items():
            spec = params.get(name)
            where = f"sweep.enqueue[{i}].{name}"
            if spec is None:
                problems.append(f"{where}: '{name}' is not a searched parameter ({', '.join(sorted(params))}). "
                                "Fix: use one of those names.")
            elif spec.type == "categorical" and value not in (spec.choices or []):
                problems.append(f"{where}={value!r} is not one of the choices {spec.choices}. Fix: pick one.")
            elif spec.type != "categorical" and not (
                    isinstance(value, int | float) and not isinstance(value, bool) and spec.low <= value <= spec.high):
                problems.append(f"{where}={value!r} is outside [{spec.low}, {spec.high}]. Fix: use a value in range.")
    if problems:
        raise ConfigError(" ".join(problems))


# --------------------------------------------------------------------------- sampling and applying


def get_dotted(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node




def _fraction_of(name: str, spec: ParamSpec, value: float, data: Mapping[str, Any]) -> int | float:
    from mlops.config import validate_config

    ref = get_dotted(data, spec.of)
    if ref is None:  # the default of the schema, e.g. train.max_steps when the base leaves it out
        ref = get_dotted(validate_config(copy.deepcopy(dict(data))).model_dump(), spec.of)
    if not isinstance(ref, int | float) or isinstance(ref, bool):
        raise ConfigError(f"sweep.params.{name}.of='{spec.of}' is not a numeric config key (got {ref!r}). "
                          "Fix: name a number such as train.max_steps.")
    scaled = value * ref
    return int(round(scaled)) if isinstance(ref, int) else scaled


def apply_values(params: Mapping[str, ParamSpec], values: Mapping[str, Any], base_data: Mapping[str, Any]):
    """A deep copy of the base config data with each parameter's value set at its key."""
    data = copy.deepcopy(dict(base_data))
    for name, spec in params.items():
        value = values[name]
        if spec.of:
            value = _fraction_of(name, spec, value, data)
        set_dotted(data, spec.key, value)
    return data


def suggest(trial, params: Mapping[str, ParamSpec]) -> dict[str, Any]:
    """Ask an Optuna trial for one value per parameter."""
    values = {}
    for name, s in params.items():
        if s.type == "categorical":
            values[name] = trial.suggest_categorical(name, list(s.choices))
        elif s.type == "int":
            values[name] = trial.suggest_int(name, int(s.low), int(s.high), step=int(s.step or 1), log=s.log)
        else:
            values[name] = trial.suggest_float(name, float(s.low), float(s.high), step=s.step, log=s.log)
    return values
