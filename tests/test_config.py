"""The typed config tree: strict loading, helpful errors, and a canonical hash."""

from __future__ import annotations

import random

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlops.config import config_hash, load_config, validate_config
from mlops.errors import ConfigError


def write(tmp_path, text: str):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_unknown_key_suggests_nearest_field(tmp_path):
    path = write(tmp_path, "train:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "train.lrr" in message and "did you mean 'lr'" in message and str(path) in message


def test_unknown_section_suggests_nearest_section(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'train'"):
        load_config(write(tmp_path, "trian:\n  lr: 0.1\n"))


def test_wrong_type_names_field_value_and_fix():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.max_steps=many"])
    message = str(err.value)
    assert "train.max_steps" in message and "'many'" in message and "Fix:" in message


def test_an_unknown_serve_engine_is_refused_naming_the_engines():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.serve_engine=llama.cpp"])
    message = str(err.value)
    assert "train.serve_engine" in message and "'llama.cpp'" in message and "llamacpp" in message
    assert load_config(None, ["train.serve_engine=vllm"]).train.serve_engine == "vllm"


def test_broken_yaml_reports_line(tmp_path):
    path = write(tmp_path, "run:\n  seed: 1\n train: [\n")
    with pytest.raises(ConfigError, match="line 3"):
        load_config(path)


def test_top_level_list_is_rejected_with_fix(tmp_path):
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_override_sets_nested_values_parsed_as_yaml():
    cfg = load_config(None, ["train.lr=1e-4", "train.lora.r=4", "run.release=true"])
    assert cfg.train.lr == pytest.approx(1e-4) and cfg.train.lora.r == 4 and cfg.run.release is True


def test_malformed_override_says_expected_form():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["train.lr"])


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_volatile_fields_do_not_change_hash():
    base = load_config(None, ["train.lr=0.001"])
    moved = load_config(None, ["train.lr=0.001", "run.output_dir=/elsewhere", "run.log_every=99",
                               "train.checkpoint_every=7", "run.run_name=x"])
    assert config_hash(base) == config_hash(moved)


def test_absent_and_default_sections_hash_differently():
    # Adding a section is a semantic change: the run now does that stage.
    assert config_hash(load_config(None, [])) != config_hash(load_config(None, ["train.lr=0.0002"]))


# --------------------------------------------------------------------------- property tests

SEMANTIC_FIELDS = {
    ("run", "seed"): st.integers(0, 10_000),
    ("run", "experiment"): st.text("abcdefgh-", min_size=1, max_size=8),
    ("train", "lr"): st.floats(1e-6, 1.0, allow_nan=False),
    ("train", "max_steps"): st.integers(1, 10_000),
    ("train", "weight_decay"): st.floats(0.0, 1.0, allow_nan=False),
    ("train", "micro_batch_size"): st.integers(1, 64),
    ("train", "mode"): st.sampled_from(["lora", "full"]),
    ("train", "zero_stage"): st.sampled_from([0, 1, 2]),
    ("base_model",): st.sampled_from(["tiny", "smollm2", "/models/x"]),
}


@st.composite
def configs(draw):
    data: dict = {}
    for path, strategy in SEMANTIC_FIELDS.items():
        if draw(st.booleans()):
            node = data
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = draw(strategy)
    return data


def respell(value):
    """An equivalent spelling of a value as YAML would accept it."""
    if isinstance(value, float):
        if value == int(value):
            return int(value)  # 2.0 -> 2 in a float field
        return float(f"{value:.17e}")  # exponent form, same double
    return value


def shuffled(data: dict, rng: random.Random) -> dict:
    items = list(data.items())
    rng.shuffle(items)
    return {k: shuffled(v, rng) if isinstance(v, dict) else respell(v) for k, v in items}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), st.integers(0, 2**32 - 1))
def test_hash_ignores_key_order_and_equivalent_spellings(data, seed):
    text = yaml.safe_dump(shuffled(data, random.Random(seed)), sort_keys=False)
    assert config_hash(validate_config(data)) == config_hash(validate_config(yaml.safe_load(text)))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), st.sampled_from(sorted(SEMANTIC_FIELDS)), st.data())
def test_any_semantic_change_changes_hash(data, path, draw):
    before = config_hash(validate_config(data))
    changed = yaml.safe_load(yaml.safe_dump(data))
    node = changed
    for part in path[:-1]:
        node = node.setdefault(part, {})
    current = getattr(validate_config(data), path[0]) if len(path) == 1 else None
    if current is None:
        section = getattr(validate_config(data), path[0])
        current = getattr(section, path[1]) if section is not None else None
    new = draw.draw(SEMANTIC_FIELDS[path].filter(lambda v: v != current))
    node[path[-1]] = new
    assert config_hash(validate_config(changed)) != before


def test_int_and_float_spellings_of_one_number_hash_alike():
    a = load_config(None, ["train.lr=1", "train.weight_decay=0"])
    b = load_config(None, ["train.lr=1.0", "train.weight_decay=0.0e0"])
    assert config_hash(a) == config_hash(b)


def test_dot_slash_paths_hash_like_plain_paths():
    assert config_hash(load_config(None, ["base_model=./models/x"])) == config_hash(
        load_config(None, ["base_model=models/x"])
    )


def test_relative_config_path_resolves_against_project_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "configs").mkdir(parents=True)
    (home / "configs" / "x.yaml").write_text("train:\n  lr: 0.5\n")
    (home / "mlproject").mkdir()
    monkeypatch.setenv("MLOPS_HOME", str(home))
    monkeypatch.chdir(home / "mlproject")  # where `mlflow run mlproject` starts entry points
    assert load_config("configs/x.yaml").train.lr == 0.5
