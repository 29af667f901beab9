"""The repository's root folder, for tests that read its files or run its scripts from wherever they sit
in tests/."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
