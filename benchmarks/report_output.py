"""Where a benchmark's report goes: JSON then the markdown table on stdout, both files on request, and
a dated result file under benchmarks/results/ (``--save-result``) that docs/benchmarks.md's table of
latest figures is generated from (``python -m benchmarks.results_table --write``)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

from benchmarks.cli_types import folder

RESULTS = Path(__file__).resolve().parent / "results"


def save_report(directory: Path, name: str, text: str, table: str) -> None:
    """`name`.json (the JSON text) and `name`.md (the table) in `directory`."""
    (directory / f"{name}.json").write_text(text + "\n", encoding="utf-8")
    (directory / f"{name}.md").write_text(table + "\n", encoding="utf-8")


def print_report(text: str, table: str, as_json: bool) -> None:
    """The JSON text (with --json) and a blank line, then the table, on stdout."""
    if as_json:
        print(text)
        print()
    print(table)


def emit(args: argparse.Namespace, benchmark: str, name: str, report: dict[str, Any], table: str,
         argv: Sequence[str] | None) -> None:
    """The report as JSON text: `name`.json / .md in ``--out`` (when given), on stdout (with ``--json``) before
    the table, and as a result file (with ``--save-result``)."""
    text = json.dumps(report, indent=2)
    if args.out is not None:
        save_report(args.out, name, text, table)
    print_report(text, table, args.json)
    save_result(args, benchmark, report, argv)


def add_result_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--save-result [DIR]`` and ``--machine TEXT``: the flags every benchmark that prints JSON takes."""
    parser.add_argument("--save-result", nargs="?", const=RESULTS, type=folder, metavar="DIR",
                        help="also write the report as <benchmark>-<date>.json with the date, the machine and the "
                             "command (default DIR: benchmarks/results)")
    parser.add_argument("--machine", metavar="TEXT",
                        help="the machine as the result file names it (default: the CPU count and the GPU found)")


def add_report_options(group: argparse.ArgumentParser | argparse._ArgumentGroup, files: str) -> None:
    """``--json``, ``--out DIR`` (the logs kept, and the report as `files` .json / .md) and the result flags."""
    group.add_argument("--json", action="store_true", help="print the JSON report on stdout before the table")
    group.add_argument("--out", type=folder, metavar="DIR",
                       help=f"keep logs and metrics here and write {files}.json / {files}.md (default: a temporary folder)")
    add_result_options(group)


def machine() -> str:
    """This machine in a few words: its CPU count and its GPU, if torch sees one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"{cores}-core machine, {gpu}"


def result_record(benchmark: str, report: dict[str, Any], argv: Sequence[str], machine_text: str | None,
                  today: datetime.date | None = None) -> dict[str, Any]:
    """The result file's content: when, where and how it was measured, the report's targets, the report."""
    return {
        "benchmark": benchmark,
        "date": (today or datetime.datetime.now(datetime.timezone.utc).date()).isoformat(),
        "machine": machine_text or machine(),
        "command": shlex.join(["python", "-m", f"benchmarks.{benchmark}", *argv]),
        "targets": report.get("targets", []),
        "report": report,
    }


def save_result(args: argparse.Namespace, benchmark: str, report: dict[str, Any],
                argv: Sequence[str] | None = None) -> Path | None:
    """With ``--save-result``, `report` as a dated result file; returns its path (None without the flag).

    A second run of the same benchmark on the same day gets ``-2``, ``-3``, ... after the date."""
    if args.save_result is None:
        return None
    record = result_record(benchmark, report, sys.argv[1:] if argv is None else argv, args.machine)
    args.save_result.mkdir(parents=True, exist_ok=True)
    stem = f"{benchmark}-{record['date']}"
    path, n = args.save_result / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = args.save_result / f"{stem}-{n}.json"
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"{benchmark}: result written to {path}", file=sys.stderr)
    return path


def publish(args: argparse.Namespace, benchmark: str, report: dict[str, Any], table: str,
            argv: Sequence[str] | None = None) -> None:
    """A report with ``--json``, ``--out DIR`` and ``--save-result``: both files in DIR (if given), the
    JSON (with --json) and the table on stdout, and the dated result file (with --save-result)."""
    text = json.dumps(report, indent=1)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        save_report(args.out, benchmark, text, table)
    print_report(text, table, args.json)
    save_result(args, benchmark, report, argv)
