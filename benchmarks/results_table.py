"""The table of latest figures in docs/benchmarks.md, generated from the result files in benchmarks/results/.

``python -m benchmarks.results_table`` prints the table; ``--write`` puts it between the markers in
docs/benchmarks.md (a test fails when the page is stale). A benchmark run with ``--save-result``
adds a file (benchmarks/report_output.py); each file holds the date, the machine, the command, the
run's targets (name, value, op and threshold or a ``needs`` text, pass) and its figures.

For each target and machine the table shows the latest date's value; several runs on that date
(files ``<benchmark>-<date>-2.json``, ...) are shown side by side, in the order they ran."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.report_output import RESULTS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- results-table:begin (python -m benchmarks.results_table --write) -->"
END = "<!-- results-table:end -->"
NAME = re.compile(r"^(?P<benchmark>[a-z_]+)-(?P<date>\d{4}-\d{2}-\d{2})(?:-(?P<n>\d+))?\.json$")
REQUIRED = ("benchmark", "date", "machine", "command", "targets")
SYMBOL = {">=": "≥", "<=": "≤"}


def load(directory: Path = RESULTS) -> list[dict[str, Any]]:
    """Every result file, oldest first (by date, then by the run number after the date)."""
    found = []
    for path in directory.glob("*.json"):
        match = NAME.match(path.name)
        if not match:
            raise ValueError(f"{path.name}: a result file is named <benchmark>-<YYYY-MM-DD>[-N].json")
        record = json.loads(path.read_text(encoding="utf-8"))
        missing = [k for k in REQUIRED if k not in record]
        if missing:
            raise ValueError(f"{path.name}: missing {', '.join(missing)}")
        if (record["benchmark"], record["date"]) != (match["benchmark"], match["date"]):
            raise ValueError(f"{path.name}: its benchmark and date disagree with its name")
        found.append((record["date"], int(match["n"] or 1), path.name, record))
    return [{**record, "file": name} for _, _, name, record in sorted(found)]


def cell(value: Any) -> str:
    """A value as the table shows it: lists joined by ' / ', None as a dash."""
    if value is None:
        return "-"
    if isinstance(value, list):
        return " / ".join(cell(v) for v in value)
    return str(value).replace("|", "\\|")


def needs(target: dict[str, Any]) -> str:
    if "needs" in target:
        return cell(target["needs"])
    return f"{SYMBOL.get(target['op'], target['op'])} {cell(target['threshold'])}"


def met(passes: list[bool | None]) -> str:
    known = [p for p in passes if p is not None]
    if not known:
        return "-"
    if len(known) == len(passes) and all(known):
        return "yes"
    if not any(known):
        return "no"
    return f"{sum(known)} of {len(passes)}"


def latest_targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per target and machine: its records on the latest date that measured it, with their files."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for result in results:
        for target in result["targets"]:
            key = (target["name"], result["machine"])
            row = rows.get(key)
            if row is None or row["date"] != result["date"]:
                row = rows[key] = {"date": result["date"], "machine": result["machine"],
                                   "benchmark": result["benchmark"], "target": target, "runs": []}
            row["runs"].append((target, result["file"]))
    return sorted(rows.values(), key=lambda r: (r["benchmark"], r["target"]["name"], r["machine"]))


def render(results: list[dict[str, Any]]) -> str:
    """The markdown between the markers: the targets' latest figures (each linked to its result file), then
    the latest run of each benchmark."""
    lines = [BEGIN, "", "| benchmark | figure | latest | needs | met | date | machine |", "|---|---|---|---|---|---|---|"]
    for row in latest_targets(results):
        runs = row["runs"]
        values = ", ".join(f"[{cell(t['value'])}](../benchmarks/results/{file})" for t, file in runs)
        lines.append(f"| {row['benchmark']} | {cell(row['target']['name'])} | {values} "
                     f"| {needs(row['target'])} | {met([t.get('pass') for t, _ in runs])} | {row['date']} | {row['machine']} |")
    lines += ["", "| benchmark | latest run | machine | command | result file |", "|---|---|---|---|---|"]
    latest: dict[str, dict[str, Any]] = {}
    for result in results:
        latest[result["benchmark"]] = result
    for name in sorted(latest):
        r = latest[name]
        lines.append(f"| {name} | {r['date']} | {r['machine']} | `{r['command']}` "
                     f"| [{r['file']}](../benchmarks/results/{r['file']}) |")
    return "\n".join([*lines, "", END])


def updated(page: str, table: str) -> str:
    """`page` with the text between the markers replaced by `table`."""
    if page.count(BEGIN) != 1 or page.count(END) != 1:
        raise ValueError(f"{PAGE.name} needs one {BEGIN!r} and one {END!r}")
    head, rest = page.split(BEGIN)
    return head + table + rest.split(END, 1)[1]


def build_parser() -> argparse.ArgumentParser:
    """`python -m benchmarks.results_table`'s command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.results_table", description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"rewrite the table in {PAGE.relative_to(ROOT)}")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        table = render(load())
        if args.write:
            PAGE.write_text(updated(PAGE.read_text(encoding="utf-8"), table), encoding="utf-8")
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"results_table: error: {exc}", file=sys.stderr)
        return 1
    if not args.write:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
