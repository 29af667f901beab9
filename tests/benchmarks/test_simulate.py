"""benchmarks.simulate, the CLI: a small grid's JSON report, table and result file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import simulate


def test_a_small_grid_writes_its_report_and_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workers", "4,8", "--policies", "dynamic,model", "--rounds", "30", "--join", "20:2",
            "--json", "--out", str(tmp_path / "out"), "--save-result", str(tmp_path / "results"), "--machine", "test"]
    assert simulate.main(argv) == 0
    report = json.loads((tmp_path / "out" / "simulate.json").read_text())
    assert [(r["policy"], r["workers"]) for r in report["rows"]] == [("dynamic", 4), ("model", 4), ("dynamic", 8), ("model", 8)]
    assert len(report["runs"]) == 8 and all(r["scenario"]["events"] for r in report["runs"])
    (result,) = (tmp_path / "results").glob("simulate-*.json")
    record = json.loads(result.read_text())
    assert record["benchmark"] == "simulate" and record["machine"] == "test" and record["targets"] == report["targets"]
    assert "| model | 8 |" in capsys.readouterr().out


def test_unknown_policies_and_sizes_are_refused() -> None:
    with pytest.raises(SystemExit):
        simulate.main(["--policies", "nonesuch"])
    with pytest.raises(SystemExit):
        simulate.main(["--workers", "0"])
