"""deploy/strict_yaml.py through the profile and schedule loaders: a key given twice in a hand-written
file is refused naming it and its line. Pure: files in tmp_path only."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.profiles import load_profile, load_schedule
from deploy.strict_yaml import safe_load


def test_a_schedule_or_profile_with_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    """PyYAML kept the last of `every_epochs: 1` and `every_epochs: 2` and the run went on with 2."""
    schedule = tmp_path / "mine.yaml"
    schedule.write_text("kind: schedule\nevery_epochs: 1\nevery_epochs: 2\nphases: [hl8]\n", encoding="utf-8")
    with pytest.raises(ValueError) as error:
        load_schedule(schedule)
    assert str(error.value) == f"{schedule}: not valid YAML: the key 'every_epochs' is given twice (line 3); keep one"
    profile = tmp_path / "p.yaml"
    profile.write_text("bsp:\n  workers: [1, 2]\n  workers: [3, 4]\n", encoding="utf-8")
    with pytest.raises(ValueError, match="the key 'workers' is given twice"):
        load_profile(profile)


def test_keys_once_each_load_as_safe_load_does() -> None:
    text = "a: 1\nb: {a: 2, c: [1, {a: 3}]}\n1: x\n"
    assert safe_load(text) == {"a": 1, "b": {"a": 2, "c": [1, {"a": 3}]}, 1: "x"}
