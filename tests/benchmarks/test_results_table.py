"""Benchmark result files: what ``--save-result`` writes, and how docs/benchmarks.md's table of latest
figures is drawn from them (benchmarks/report_output.py, benchmarks/results_table.py)."""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
from pathlib import Path

import pytest

from benchmarks import results_table
from benchmarks.report_output import add_result_options, result_record, save_result

# Every benchmark module that prints a JSON report.
BENCHMARKS = ("adaptive", "asp", "batch_sweep", "devices", "gns_check", "gns_server", "hetero", "library",
              "memory_bound", "micro_batches", "scale", "server_work", "transport", "tta")


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_result_options(p)
    return p.parse_args(argv)


def target(name: str, value: float, passed: bool) -> dict:
    return {"name": name, "value": value, "op": ">=", "threshold": 1.0, "pass": passed}


def test_save_result_writes_the_date_the_machine_the_command_and_the_report(tmp_path: Path) -> None:
    report = {"targets": [target("speed", 1.2, True)], "rows": [1, 2]}
    args = parse("--save-result", str(tmp_path), "--machine", "test box")
    first = save_result(args, "transport", report, ["--sizes", "1e6", "--json"])
    second = save_result(args, "transport", report, ["--json"])
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert first == tmp_path / f"transport-{today}.json" and second == tmp_path / f"transport-{today}-2.json"
    saved = json.loads(first.read_text(encoding="utf-8"))
    assert saved == {"benchmark": "transport", "date": today, "machine": "test box",
                     "command": "python -m benchmarks.transport --sizes 1e6 --json",
                     "targets": report["targets"], "report": report}
    assert [r["file"] for r in results_table.load(tmp_path)] == [first.name, second.name]


def test_without_the_flag_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert save_result(parse(), "asp", {"bsp": {}}, []) is None
    assert list(tmp_path.iterdir()) == []


def test_the_machine_defaults_to_what_this_machine_has() -> None:
    record = result_record("asp", {}, [], None, today=datetime.date(2026, 1, 2))
    assert record["date"] == "2026-01-02" and "-core machine, " in record["machine"] and record["targets"] == []


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_takes_save_result(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    main = getattr(module, "main", None) or importlib.import_module(f"benchmarks.{name}.cli").main
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert "--save-result" in capsys.readouterr().out


def write(directory: Path, name: str, date: str, machine: str, targets: list[dict]) -> None:
    record = {"benchmark": name.split("-")[0], "date": date, "machine": machine, "command": "python -m x",
              "targets": targets}
    (directory / name).write_text(json.dumps(record), encoding="utf-8")


def test_the_table_shows_each_targets_latest_date_per_machine(tmp_path: Path) -> None:
    write(tmp_path, "hetero-2026-01-01.json", "2026-01-01", "vm", [target("ratio", 0.5, False)])
    write(tmp_path, "hetero-2026-01-02.json", "2026-01-02", "vm", [target("ratio", 1.5, True)])
    write(tmp_path, "hetero-2026-01-02-10.json", "2026-01-02", "vm", [target("ratio", 0.7, False)])
    write(tmp_path, "hetero-2026-01-02-2.json", "2026-01-02", "vm", [target("ratio", 1.1, True)])
    write(tmp_path, "hetero-2025-12-01.json", "2025-12-01", "gpu box", [target("ratio", 2.0, True)])
    results = results_table.load(tmp_path)
    rows = results_table.latest_targets(results)
    assert [(r["machine"], r["date"], [t["value"] for t, _ in r["runs"]]) for r in rows] == [
        ("gpu box", "2025-12-01", [2.0]), ("vm", "2026-01-02", [1.5, 1.1, 0.7])]
    table = results_table.render(results)
    assert "| hetero | ratio | [1.5](../benchmarks/results/hetero-2026-01-02.json), [1.1]" in table
    assert "| ≥ 1.0 | 2 of 3 | 2026-01-02 | vm |" in table
    assert "[hetero-2026-01-02-10.json](../benchmarks/results/hetero-2026-01-02-10.json)" in table


@pytest.mark.parametrize("name, record, error", [
    ("hetero.json", {}, "is named"),
    ("hetero-2026-01-01.json", {"benchmark": "hetero", "date": "2026-01-01"}, "missing machine, command, targets"),
    ("hetero-2026-01-01.json", {"benchmark": "asp", "date": "2026-01-01", "machine": "m", "command": "c",
                                "targets": []}, "disagree"),
])
def test_a_bad_result_file_is_named_in_one_error(tmp_path: Path, name: str, record: dict, error: str) -> None:
    (tmp_path / name).write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(ValueError, match=error):
        results_table.load(tmp_path)


def test_the_page_needs_its_markers() -> None:
    with pytest.raises(ValueError, match="needs one"):
        results_table.updated("no markers here", "table")
    page = f"head\n{results_table.BEGIN}\nold\n{results_table.END}\ntail\n"
    assert results_table.updated(page, "new") == "head\nnew\ntail\n"
