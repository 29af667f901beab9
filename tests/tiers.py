"""The suite's two tiers: which tests are slow (tests/conftest.py marks them so at collection).

- the fast tier, the README's ``python -m pytest -q``: every test that is not slow;
- the slow tier, ``python -m pytest -q -m slow``, which .ci/run runs right after the fast one: the
  whole jobs of real server and worker processes, that is every test under ``tests/e2e/`` but those of
  ``FAST_E2E``, and any test that carries ``@pytest.mark.slow`` itself.

A test marked compose, prometheus or slurm is in neither: those run on their own (``-m compose``, ...),
so the slow mark is never added to one, and ``-m slow``, which replaces the addopts' ``-m``, cannot
pull one in. A new file of ``tests/e2e/`` is slow until it is named in ``FAST_E2E``; a test anywhere
else is fast unless it carries the mark itself: a whole job of real processes in a module's tests (a
benchmark's run, a worker configured by its environment that trains).
tests/test_tests_layout.py checks that the two tiers together hold every test once.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
SLOW = "slow"
OWN_RUN = ("compose", "prometheus", "slurm")
"""Markers whose tests run only on their own command line, outside both tiers."""
SLOW_FOLDER = "e2e"
"""The folder of tests/ whose files are slow but for FAST_E2E's: whole jobs of real ps-server and
ps-worker processes, from seconds to minutes a test."""
FAST_E2E = {
    "test_cli.py": "the command lines' refusals and help, each a process that exits at once",
    "test_training.py": "the quick start's jobs, BSP and ASP, learning on real processes",
}
"""Files of tests/e2e/ quick enough for the fast tier, each with what it keeps checked there."""


def slow_by_place(path: Path) -> bool:
    """Whether the tests of the file at `path` are slow by where the file is."""
    path = path.resolve()
    if not path.is_relative_to(TESTS / SLOW_FOLDER):
        return False
    return path.name not in FAST_E2E


def tier(path: Path, markers: set[str]) -> str:
    """The tier of a test in the file at `path` that carries the marks `markers`: "fast", "slow", or
    the mark of OWN_RUN it runs under."""
    own = sorted(markers & set(OWN_RUN))
    if own:
        return own[0]
    return SLOW if SLOW in markers or slow_by_place(path) else "fast"


def misplaced_marks(marked: dict[str, set[str]]) -> list[str]:
    """The tests (node id: marks) marked slow and one of OWN_RUN, which -m slow would pull in."""
    return sorted(name for name, marks in marked.items() if SLOW in marks and marks & set(OWN_RUN))
