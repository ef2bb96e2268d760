"""`make bench`'s report: goal lines are quoted as printed and misses are marked, with the machine described."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import report  # noqa: E402


def test_goal_lines_are_kept_and_misses_are_marked_in_the_summary(tmp_path):
    bench = tmp_path / "bench_fake.py"
    bench.write_text("print('warm-up 3 s')\nprint('== sqlite')\nprint('promote p95 80 ms  met')\nprint('rollback p95 300 ms  MISSED')\n")
    result = report.run_one(bench, [], timeout=60)
    assert result["exit_code"] == 0
    assert result["goals"] == ["== sqlite", "promote p95 80 ms  met", "rollback p95 300 ms  MISSED"]
    assert result["missed"] == ["rollback p95 300 ms  MISSED"]
    text = report.render({"date": "2026-12-01", "machine": report.machine(), "results": [result], "not_run": ["x"]})
    assert "| bench_fake | 0 |" in text and "1 of 2 goal lines" in text and "**sqlite**" in text
    assert "- **MISSED** `rollback p95 300 ms  MISSED`" in text and "- `promote p95 80 ms  met`" in text
    assert "Not run this time: x" in text and "cores" in text


def test_an_unknown_benchmark_name_is_refused_with_the_available_ones(capsys):
    import pytest

    with pytest.raises(SystemExit):
        report.main(["--only", "registy"])
    err = capsys.readouterr().err
    assert "registy" in err and "available: " in err and "registry" in err
