"""The README and docs/ hold: the README stays a short guide whose set-up commands are the ones CI
runs, every link between the pages lands on a file and a heading that exist, the command-line
reference matches the parsers, and no page reads as a development diary."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from benchmarks import results_table
from deploy import cli_reference

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted([README, *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
# Lines that narrate the project's history rather than describe it: numbered sessions or rounds of
# work, what something did "until" a change, tables of earlier runs.
HISTORY = re.compile(
    r"sessions? [0-9]+|until session|since session|rounds? [0-9]+ of (work|development)|before (this|the) change"
    r"|until [^.]* (it )?hung|tried and not kept|every earlier run|earlier (runs|sessions)",
    re.IGNORECASE,
)


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
        found.update(re.findall(r'<a id="([^"]+)"', line))
    return found


def test_the_readme_is_a_short_guide() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move reference material to docs/"


def test_the_readmes_set_up_commands_are_what_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    block = text[text.index("## Set up"):].split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    install, test = block
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert 'python -m pip install -q -e ".[test]"' in ci and 'pip install -e ".[test]"' in install
    assert test.endswith("python -m pytest -q") and "python -m pytest -q" in ci


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_lands_on_a_page_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        goal = (page.parent / path).resolve() if path else page
        if not goal.exists():
            broken.append(target)
        elif anchor and goal.suffix == ".md" and anchor not in anchors(goal):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_narrates_the_projects_history(page: Path) -> None:
    hits = [line for line in page.read_text(encoding="utf-8").splitlines() if HISTORY.search(line)]
    assert hits == [], "history belongs in commit messages"


def test_the_history_check_catches_diary_lines() -> None:
    for line in ("Session 15 (2026-11-24): the full run", "until session 14 it hung", "until the fix it hung",
                 "Tried and not kept:", "since session 8"):
        assert HISTORY.search(line), line
    assert not HISTORY.search("a round closes when the last push arrives")


def test_the_cli_reference_matches_the_parsers() -> None:
    assert cli_reference.OUTPUT.read_text(encoding="utf-8") == cli_reference.render(), (
        "docs/cli.md is stale: run python -m deploy.cli_reference"
    )


def test_the_benchmark_results_table_is_current() -> None:
    page = results_table.PAGE.read_text(encoding="utf-8")
    assert page == results_table.updated(page, results_table.render(results_table.load())), (
        "docs/benchmarks.md's table is stale: run python -m benchmarks.results_table --write"
    )


# Files that live outside the repository: a reader of the repository cannot open them, so sources and
# docs cite papers by title and section instead.
OUTSIDE = re.compile(r"design\.md|seeds/|omnilearn\.md|cannikin\.md|jabas\.md|\.\./shared", re.IGNORECASE)


def test_no_file_names_files_outside_the_repository() -> None:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert listed, "git lists no files"
    hits = []
    for name in listed:
        path = ROOT / name
        if path.resolve() == Path(__file__).resolve() or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]
    assert hits == []


def test_the_outside_check_catches_such_names() -> None:
    for line in ("(design.md §9)", "../shared/seeds/cannikin.md §3", "see omnilearn.md", "JABAS.md"):
        assert OUTSIDE.search(line), line
    assert not OUTSIDE.search("Cannikin §3.2.1 and §4.5; OmniLearn, Eq. 6")


def test_the_slug_is_githubs() -> None:
    assert slug(" Heterogeneous cluster (HL8 BSP)") == "heterogeneous-cluster-hl8-bsp"
    assert slug(" `ps-cluster run`") == "ps-cluster-run"
