"""Calibration report arithmetic and its place in CALIBRATION.md (the real run is `python -m evaluation.calibrate`)."""

from __future__ import annotations

import math

from evaluation.calibrate import BEGIN, END, Z, dimension_rows, write


def test_dimension_rows_weight_tasks_by_items_and_name_the_smallest_detectable_gain():
    primary = {"mc": "acc_norm", "gen": "f1"}
    base = {"mc": {"acc_norm": 0.25, "acc_norm_stderr": 0.09}, "gen": {"f1": 0.10, "f1_stderr": 0.08}}
    tuned = {"mc": {"acc_norm": 0.75, "acc_norm_stderr": 0.09}, "gen": {"f1": 0.40, "f1_stderr": 0.14}}
    [row] = dimension_rows(base, tuned, primary, {"refunds": ["mc", "gen"]}, {"mc": 24, "gen": 12})
    assert row["n"] == 36 and math.isclose(row["base"], (0.25 * 24 + 0.10 * 12) / 36)
    se_b = math.sqrt((24 / 36) ** 2 * 0.09**2 + (12 / 36) ** 2 * 0.08**2)
    se_t = math.sqrt((24 / 36) ** 2 * 0.09**2 + (12 / 36) ** 2 * 0.14**2)
    assert math.isclose(row["mdi"], Z * math.sqrt(se_b**2 + se_t**2))
    assert math.isclose(row["lo"], row["delta"] - row["mdi"]) and row["improved"]
    same = dimension_rows(base, base, primary, {"refunds": ["mc", "gen"]}, {"mc": 24, "gen": 12})[0]
    assert same["delta"] == 0 and not same["improved"]


def test_write_replaces_only_the_generated_block(tmp_path):
    path = tmp_path / "CALIBRATION.md"
    path.write_text(f"# Title\nkept intro\n\n{BEGIN}\nold table\n{END}\nkept notes\n")
    write(path, f"{BEGIN}\nnew table\n{END}\n")
    text = path.read_text()
    assert "old table" not in text and "new table" in text
    assert text.startswith("# Title\nkept intro") and text.rstrip().endswith("kept notes")


def test_the_verdict_says_plainly_which_dimensions_miss_the_interval_and_by_how_much():
    from evaluation.calibrate import suite_row, verdict

    primary = {"a": "acc_norm", "b": "acc_norm"}
    base = {"a": {"acc_norm": 0.25, "acc_norm_stderr": 0.05}, "b": {"acc_norm": 0.25, "acc_norm_stderr": 0.05}}
    tuned = {"a": {"acc_norm": 0.60, "acc_norm_stderr": 0.05}, "b": {"acc_norm": 0.27, "acc_norm_stderr": 0.05}}
    counts = {"a": 24, "b": 24}
    dims = dimension_rows(base, tuned, primary, {"billing": ["a"], "tone": ["b"]}, counts)
    suite = suite_row(base, tuned, primary, counts)
    assert suite["n"] == 48 and math.isclose(suite["delta"], (0.35 + 0.02) / 2) and suite["improved"]
    text = "\n".join(verdict(suite, dims))
    assert "beats the base model beyond the interval" in text
    assert "1 of 2 dimensions: tone +0.020" in text and "billing" not in text.split("Not beyond")[1]


def test_a_base_model_below_chance_is_named_with_the_noise_band_of_its_task():
    from evaluation.calibrate import base_vs_chance

    tasks = [{"task": "a_mc", "n": 24, "chance": 0.25, "base": 0.167}, {"task": "b_mc", "n": 24, "chance": 0.25,
             "base": 0.30}, {"task": "c_gen", "n": 12, "chance": None, "base": 0.1}]
    text = base_vs_chance(tasks)
    assert "at or above chance on 1 of 2 multiple-choice tasks" in text
    assert f"a_mc 0.167 (chance 0.25, a model at chance lands within ±{Z * math.sqrt(0.25 * 0.75 / 24):.3f}" in text
    assert base_vs_chance(tasks[1:]).endswith("on 1 of 1 multiple-choice tasks.")
