"""The benchmarks that run on hetero's emulation refuse bad flags as argparse does (usage, the
program's name, exit 2) before anything runs: a --limiter this machine lacks, bad seeds or sizes,
an unknown task."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType

import pytest

from benchmarks import adaptive, micro_batches
from benchmarks.hetero import settings
from benchmarks.tta import cli as tta


def _refused(main: Callable[[Sequence[str]], int], argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What `main(argv)` says on stderr, after checking it exits 2 with a usage line."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("usage: python -m benchmarks."), err
    return err


@pytest.mark.parametrize("module, name", [(micro_batches, "micro_batches"), (tta, "tta")])
def test_a_cgroup_limiter_where_none_is_writable_is_refused_before_anything_runs(
        module: ModuleType, name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(settings, "detect_backend", lambda: None)
    started: list[str] = []

    def emulation(s: object) -> None:
        started.append("run")
        raise SystemExit(1)

    monkeypatch.setattr(module, "resolve_emulation", emulation)
    err = _refused(module.main, ["--limiter", "cgroup"], capsys)
    assert f"python -m benchmarks.{name}: error: --limiter cgroup: no writable cgroup CPU controller" in err
    assert not started


@pytest.mark.parametrize("argv, says", [
    (["--seeds", "a"], "--seeds"), (["--seeds", "1,1"], "distinct seeds"),
    (["--micro-batch", "0"], "--micro-batch"), (["--epochs", "-1"], "--epochs"),
    (["--cpu-budget", "nan"], "--cpu-budget"), (["--throughput-batch", "-5"], "--throughput-batch")])
def test_micro_batches_refuses_bad_numbers_as_argparse_does(argv: list[str], says: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert says in _refused(micro_batches.main, argv, capsys)


def test_micro_batches_takes_no_seeds_for_its_throughput_part_alone() -> None:
    args = micro_batches.build_parser().parse_args(["--seeds", "", "--micro-batch", "2,4"])
    assert args.seeds == [] and args.micro_batch == [2, 4]
    assert micro_batches.build_parser().parse_args([]).seeds == [0, 1, 2]


def test_adaptive_refuses_an_unknown_task_as_argparse_does(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(adaptive.main, ["--tasks", "imagenet"], capsys)
    assert "python -m benchmarks.adaptive: error: --tasks: unknown ['imagenet']" in err
