"""deploy/docker_schedule.py: `ps-cluster docker-schedule`'s dry run (the docker commands of each phase and
the sleeps between them), and its apply, the waits between phases (a fake clock, sleep and docker)."""

from __future__ import annotations

import io
import shlex
import time
from pathlib import Path

import pytest

from deploy import docker_schedule
from deploy.profiles import load_schedule
from tests.cluster_cli import run_cli


def test_a_huge_every_seconds_waits_in_steps_time_sleep_accepts() -> None:
    """`ps-cluster docker-schedule --schedule swap --every-seconds 1e300` applied the first phase and then
    died in time.sleep(1e300) with an OverflowError traceback."""
    phases = docker_schedule.plan(load_schedule("swap"), "bsp", 1e300)
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        time.sleep(0.0 if seconds <= docker_schedule.MAX_SLEEP_S else seconds)  # raises as the real one would
        slept.append(seconds)
        now[0] = 1e300 if len(slept) == 3 else now[0] + seconds  # after a few steps, the next phase's start

    ran: list[list[str]] = []
    docker_schedule.apply(phases[:2], out=io.StringIO(), run=ran.append, sleep=sleep, clock=lambda: now[0])
    assert len(ran) == 8 and slept[:3] == [docker_schedule.MAX_SLEEP_S] * 3
    assert max(slept) <= docker_schedule.MAX_SLEEP_S


def parse_script(script: str) -> list[tuple[str, list[list[str]]]]:
    """A dry run's phases: (profile, docker commands), checking the sleeps between them."""
    phases: list[tuple[str, list[list[str]]]] = []
    for line in script.splitlines():
        if line.startswith("# phase"):
            phases.append((line.rsplit(": ", 1)[1], []))
        elif line.startswith("sleep "):
            assert phases and phases[-1][1], "sleep before any command"
        else:
            phases[-1][1].append(shlex.split(line))
    return phases


@pytest.mark.parametrize("mode", ["bsp", "asp"])
def test_docker_schedule_dry_run(capsys: pytest.CaptureFixture[str], mode: str) -> None:
    code, out, _ = run_cli(
        capsys, "docker-schedule", "--schedule", "dynamic", "--every-seconds", "90", "--mode", mode, "--dry-run"
    )
    assert code == 0
    assert out.count("sleep 90\n") == 7
    phases = parse_script(out)
    schedule = load_schedule("dynamic")
    assert [profile for profile, _ in phases] == [p.name for p in schedule.phases]
    for (_, commands), profile in zip(phases, schedule.phases, strict=True):
        allocation = profile.allocation(mode)
        # Table I's cores are a core or more each: the shortest period, 1 ms, for every phase
        expected = [
            ["docker", "update", "--cpu-period", "1000", "--cpu-quota", str(round(c * 1000)), f"hetero-ps-worker{k}-1"]
            for k, c in enumerate(allocation.workers)
        ]
        if mode == "asp":
            expected.insert(0, ["docker", "update", "--cpu-period", "1000", "--cpu-quota", "8000", "hetero-ps-ps-server-1"])
        assert commands == expected


def test_docker_schedule_scale_and_project(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "docker-schedule", "--schedule", "dynamic", "--every-seconds", "1", "--scale", "0.25",
        "--project", "exp1", "--dry-run",
    )
    assert code == 0
    phases = parse_script(out)
    hl8 = phases[3]
    assert hl8[0] == "hl8"
    assert [c[5] for c in hl8[1]] == ["1500", "1500", "1000", "8000"]  # 1.5, 1.5, 1 and 8 cores
    assert [c[6] for c in hl8[1]] == [f"exp1-worker{k}-1" for k in range(4)]
    # one period for every phase: the smallest share of any phase (HL8's 1 core) sets it
    assert {c[3] for _, commands in phases for c in commands} == {"1000"}


def test_docker_schedule_period_covers_every_phase(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "docker-schedule", "--schedule", "dynamic", "--every-seconds", "1", "--scale",
                           str(1.5 / 48), "--dry-run")
    assert code == 0
    phases = parse_script(out)
    assert {c[3] for _, commands in phases for c in commands} == {"8000"}  # HL8's 1/8 core, in the HL1 phase too
    assert [c[5] for c in phases[0][1]] == ["3000"] * 4  # HL1: 3/8 core each


def test_docker_schedule_uses_the_schedule_seconds(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text("kind: schedule\nevery_seconds: 12\nphases: [hl1, hl8]\n", encoding="utf-8")
    code, out, _ = run_cli(capsys, "docker-schedule", "--schedule", str(path), "--dry-run")
    assert code == 0
    assert "sleep 12\n" in out and len(parse_script(out)) == 2


def test_docker_schedule_applies_phases_on_time() -> None:
    phases = docker_schedule.plan(load_schedule("dynamic"), "bsp", 10.0)
    now = [100.0]
    ran: list[tuple[float, list[str]]] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds

    class Sink:
        def write(self, text: str) -> None:
            pass

        def flush(self) -> None:
            pass

    docker_schedule.apply(
        phases, out=Sink(), run=lambda argv: ran.append((now[0], argv)), sleep=sleep, clock=lambda: now[0]  # type: ignore[arg-type]
    )
    assert len(ran) == 8 * 4
    assert [t for t, _ in ran[::4]] == [100.0 + 10 * i for i in range(8)]
