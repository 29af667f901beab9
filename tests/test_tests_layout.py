"""The tests' own layout holds: each test file sits in the folder that mirrors what it covers and is
named after it, none is too long to read, and test files share code only through support modules.

Where a new test file goes:
- a test of one module, ``ps/rounds/ssp.py`` say, goes in the folder that mirrors the module's package
  and is named after the module: ``tests/ps/rounds/test_ssp.py``; a topic may follow the module's
  name when one file per module would be too long (``tests/ps/test_servicer_join.py`` for
  ``ps/servicer.py``). A package whose tests are few may keep them one folder up, still named after
  the module (``tests/ps/test_server_balance.py`` for ``ps/server.py``).
- a test that starts real server and worker processes and checks a whole job across both sides goes in
  ``tests/e2e/``, named after the feature (``tests/e2e/test_faults.py``).
- what the whole repository must hold (the import map, the docs, the tests' layout, no leftover files)
  stays at ``tests/`` itself: ``ROOT_TESTS``.
- a test of a whole job is in the slow tier, which the README's command leaves to ``-m slow``: every
  file of ``tests/e2e/`` but the few quick ones of ``tests/tiers.py``, and a test marked slow itself.
- what several test files share (fixtures, helpers, jobs, a support process) is a support module at
  ``tests/`` itself, without the ``test_`` prefix, imported as ``from tests.processes import ...``;
  ``tests/conftest.py`` holds the fixtures every folder sees.
"""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.repo import ROOT
from tests.tiers import FAST_E2E, OWN_RUN, SLOW, SLOW_FOLDER, misplaced_marks, tier

TESTS = ROOT / "tests"
MAX_TEST_LINES = 600
MIRRORED = ("common", "ps", "worker", "deploy", "benchmarks")
"""Top folders of tests/ that mirror a package of the code (and the package's own folders below them)."""
E2E = "e2e"

ROOT_TESTS = {
    "test_doc_flags.py": "the flags the README and docs/ give each command, against its parser",
    "test_docs.py": "the README and docs/ as a whole",
    "test_front_doors.py": "the command lines a person types first: --help and bad arguments before torch loads",
    "test_layout.py": "the code's import map and module lengths",
    "test_leaks.py": "the check that a session leaves no files behind (tests/leaks.py)",
    "test_tests_layout.py": "this file: where tests live",
    "test_types.py": "the type checker (mypy) over every package",
}

# Test files over MAX_TEST_LINES, each with the reason it reads better whole. Empty: split by topic.
LONGER_ALLOWED: dict[str, str] = {}

# Topics named after what the test does rather than after one module, by folder.
TOPICS: dict[str, dict[str, str]] = {
    "ps": {"hostile": "peers that break the protocol on purpose, against the whole in-process server"},
}


def all_test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def covered_names(folder: Path) -> set[str]:
    """Modules and subpackages of the code folder `folder` (a path below ROOT)."""
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def placement_error(path: Path) -> str | None:
    """Why the test file at `path` is in the wrong place or misnamed, or None."""
    rel = path.relative_to(TESTS)
    folders, stem = rel.parts[:-1], path.stem.removeprefix("test_")
    if not folders:
        return None if path.name in ROOT_TESTS else (
            f"tests/{rel}: a test of a module goes in the folder mirroring its package "
            f"(tests/ps/rounds/test_ssp.py), a whole job with real processes in tests/e2e/")
    if folders[0] == E2E:
        return None if len(folders) == 1 else f"tests/{rel}: tests/e2e/ is flat"
    if folders[0] not in MIRRORED:
        return f"tests/{rel}: tests/{folders[0]}/ mirrors no package; use one of {MIRRORED} or {E2E}"
    code = ROOT.joinpath(*folders)
    if not (code / "__init__.py").exists():
        return f"tests/{rel}: {'/'.join(folders)}/ is not a package of the code"
    words = stem.split("_")
    prefixes = {"_".join(words[:n]) for n in range(1, len(words) + 1)}
    if prefixes & covered_names(code) or prefixes & set(TOPICS.get("/".join(folders), {})):
        return None
    return (f"tests/{rel}: name it test_<module>[_<topic>].py after a module of {'/'.join(folders)}/ "
            f"({', '.join(sorted(covered_names(code)))}), or add the topic to TOPICS with its reason")


def test_every_test_file_is_in_a_folder_that_mirrors_the_code_and_is_named_after_what_it_covers() -> None:
    wrong = [error for path in all_test_files() if (error := placement_error(path))]
    assert wrong == [], "\n".join(wrong)


def test_every_folder_of_tests_is_a_package_and_support_modules_sit_at_the_top() -> None:
    """A package each, so that two folders may hold files of one name (tests/ps/control/test_policy.py
    and tests/ps/control/model/test_policy.py); support modules only at tests/, so that a test file's
    folder says what it covers and nothing else."""
    folders = {p.parent for p in python_files()} | {TESTS}
    assert sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists()) == []
    misplaced = [str(p.relative_to(ROOT)) for p in python_files()
                 if p.parent != TESTS and not p.name.startswith("test_") and p.name != "__init__.py"]
    assert misplaced == [], "support modules live at tests/ (from tests.<module> import ...)"


def test_no_test_file_is_too_long() -> None:
    lengths = {str(p.relative_to(TESTS)): len(p.read_text().splitlines()) for p in python_files()}
    too_long = {p: n for p, n in lengths.items() if n > MAX_TEST_LINES and p not in LONGER_ALLOWED}
    assert too_long == {}, f"split these by topic (shared helpers in a support module), or justify them: {too_long}"
    stale = [p for p in LONGER_ALLOWED if lengths.get(p, 0) <= MAX_TEST_LINES]
    assert stale == [], "no longer over the limit (or gone): drop them from LONGER_ALLOWED"


def imported_test_modules(path: Path) -> list[str]:
    """The test modules (tests.….test_*) that the file at `path` imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found += [n for n in names if n.startswith("tests.") and n.split(".")[-1].startswith("test_")]
    return found


def test_tests_import_support_modules_never_other_tests() -> None:
    """A helper two test files need moves to a support module: a test file imported by another would
    run its tests' module-level code twice over and tie one file's layout to another's."""
    wrong = {str(p.relative_to(ROOT)): found for p in python_files() if (found := imported_test_modules(p))}
    assert wrong == {}


def test_the_checks_catch_a_misplaced_file_and_an_import_of_a_test(tmp_path: Path) -> None:
    assert placement_error(TESTS / "test_ssp.py") is not None
    assert placement_error(TESTS / "ps" / "rounds" / "test_ssp.py") is None
    assert placement_error(TESTS / "ps" / "rounds" / "test_ssp_gate.py") is None
    assert placement_error(TESTS / "ps" / "rounds" / "test_nothing.py") is not None
    assert placement_error(TESTS / "ps" / "nowhere" / "test_x.py") is not None
    assert placement_error(TESTS / "e2e" / "test_anything.py") is None
    assert placement_error(TESTS / "e2e" / "faults" / "test_x.py") is not None
    source = tmp_path / "probe.py"
    source.write_text("from tests.e2e.test_faults import wait_for\nfrom tests import processes\n")
    assert imported_test_modules(source) == ["tests.e2e.test_faults"]
    source.write_text("from tests.e2e import test_faults\n")
    assert imported_test_modules(source) == ["tests.e2e.test_faults"]


def test_the_readmes_command_leaves_the_slow_tier_to_the_ci_line_right_after_it() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    addopts = shlex.split(options["addopts"])
    assert addopts[addopts.index("-m") + 1] == " and ".join(f"not {mark}" for mark in (SLOW, *OWN_RUN))
    assert [line for line in options["markers"] if line.startswith(f"{SLOW}:")] != []
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[ci.index("python -m pytest -q") + 1] == f"python -m pytest -q -m {SLOW}"


def test_a_test_is_in_one_tier_by_its_folder_and_marks() -> None:
    assert sorted(name for name in FAST_E2E if not (TESTS / SLOW_FOLDER / name).is_file()) == [], (
        "gone from tests/e2e/: drop them from tests/tiers.py's FAST_E2E")
    assert tier(TESTS / "e2e" / "test_faults.py", set()) == "slow"
    assert tier(TESTS / "e2e" / "test_cli.py", {"parametrize"}) == "fast"
    assert tier(TESTS / "ps" / "rounds" / "test_ssp.py", set()) == "fast"
    assert tier(TESTS / "benchmarks" / "test_hetero.py", {"slow"}) == "slow"
    assert tier(TESTS / "e2e" / "test_prometheus_server.py", {"prometheus", "skipif"}) == "prometheus"
    assert misplaced_marks({"a": {"slow", "compose"}, "b": {"slow"}, "c": {"slurm"}}) == ["a"]


@pytest.mark.slow  # three collections of the whole suite, half a minute of CPU each
def test_the_fast_and_the_slow_tier_together_run_every_test_once() -> None:
    """What `python -m pytest -q` and `python -m pytest -q -m slow` collect, against every test that no
    mark of its own (compose, prometheus, slurm) keeps to a command line of its own."""
    selections = {"fast": [], "slow": ["-m", SLOW], "every": ["-m", " and ".join(f"not {mark}" for mark in OWN_RUN)]}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    runs = {name: subprocess.Popen([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                                    *selection], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True) for name, selection in selections.items()}
    outputs = {name: (*run.communicate(timeout=900), run.returncode) for name, run in runs.items()}
    failed = {name: out[-2000:] + err[-2000:] for name, (out, err, code) in outputs.items() if code != 0}
    assert failed == {}
    collected = {name: [line for line in out.splitlines() if "::" in line] for name, (out, _, _) in outputs.items()}
    fast, slow, every = collected["fast"], collected["slow"], collected["every"]
    assert fast != [] and slow != [] and len(set(every)) == len(every)
    assert sorted(fast + slow) == sorted(every)
