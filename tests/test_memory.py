"""ps.memory.tune_malloc: glibc malloc settings applied with mallopt, a no-op elsewhere, never an error."""

from __future__ import annotations

import ctypes
import sys

import pytest

from ps import memory


def _glibc() -> bool:
    try:
        return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
    except OSError:
        return False


def test_returns_a_bool_and_can_run_twice() -> None:
    first = memory.tune_malloc()
    assert isinstance(first, bool) and memory.tune_malloc() is first


@pytest.mark.skipif(not _glibc(), reason="mallopt tuning is glibc-only")
def test_applies_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    for _, _, env in memory.SETTINGS:
        monkeypatch.delenv(env, raising=False)
    assert memory.tune_malloc() is True


@pytest.mark.skipif(not _glibc(), reason="mallopt tuning is glibc-only")
def test_leaves_settings_the_environment_made(monkeypatch: pytest.MonkeyPatch) -> None:
    for _, _, env in memory.SETTINGS:
        monkeypatch.setenv(env, "1048576")
    assert memory.tune_malloc() is False


def test_no_op_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    assert memory.tune_malloc() is False


def test_never_raises_when_libc_cannot_be_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("no libc here")

    monkeypatch.setattr(memory.sys, "platform", "linux")
    monkeypatch.setattr(memory.ctypes, "CDLL", broken)
    assert memory.tune_malloc() is False
