"""Where a benchmark's report goes: JSON then the markdown table on stdout, and both files on request."""

from __future__ import annotations

from pathlib import Path


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
