"""Dynamic heterogeneity for the docker-compose cluster: ``docker update`` of CPU quotas at phase boundaries.

OmniLearn's Fig. 10 changes each worker container's cores at fixed intervals from an external
process; this is that process. It applies phase 0 at once, then each later phase after
``every_seconds``, as ``docker update --cpu-period P --cpu-quota Q`` (the compose file's limits:
Docker refuses ``--cpus`` beside a period). One period serves every phase: the shortest the kernel
accepts for the smallest share of any phase. A dry run prints the same steps as a shell script (``docker update`` and
``sleep`` lines) without running anything.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from deploy.compose_env import cfs_period_us, container_cpus
from deploy.profiles import Schedule, check_mode

DEFAULT_PROJECT = "hetero-ps"
"""The compose project name (``name:`` in ``deploy/docker-compose.yml``)."""


@dataclass(frozen=True)
class Phase:
    """One phase: when it starts and the ``docker update`` commands that apply it."""

    index: int
    start_s: float
    profile: str
    commands: tuple[tuple[str, ...], ...]


def container_name(project: str, service: str) -> str:
    """The container docker compose (v2) creates for the first replica of ``service``."""
    return f"{project}-{service}-1"


def plan(
    schedule: Schedule,
    mode: str,
    every_seconds: float,
    *,
    scale: float = 1.0,
    project: str = DEFAULT_PROJECT,
) -> list[Phase]:
    """The phases of ``schedule`` as docker commands, one phase every ``every_seconds``.

    Workers get the profile's cores times ``scale`` (as ``compose-env --scale``) as a quota per
    period; in ASP the parameter server is updated too when the profile gives it cores.
    """
    mode = check_mode(mode)
    if not every_seconds > 0:
        raise ValueError(f"every_seconds must be > 0, got {every_seconds}")
    targets_per_phase = []
    for profile in schedule.phases:
        workers, server = container_cpus(profile, mode, scale)
        targets = [(f"worker{k}", cores) for k, cores in enumerate(workers)]
        if mode == "asp" and server is not None:
            targets.insert(0, ("ps-server", server))
        targets_per_phase.append(targets)
    period = cfs_period_us([cores for targets in targets_per_phase for _, cores in targets], scale)
    phases = []
    for index, (profile, targets) in enumerate(zip(schedule.phases, targets_per_phase, strict=True)):
        commands = tuple(
            ("docker", "update", "--cpu-period", str(period), "--cpu-quota", str(round(cores * period)),
             container_name(project, service))
            for service, cores in targets
        )
        phases.append(Phase(index, index * every_seconds, profile.name, commands))
    return phases


def render(phases: list[Phase], every_seconds: float) -> str:
    """The phases as a shell script: comments, ``docker update`` lines, ``sleep`` between phases."""
    lines = []
    for phase in phases:
        if phase.index:
            lines.append(f"sleep {every_seconds:.15g}")
        lines.append(f"# phase {phase.index + 1}/{len(phases)} at t={phase.start_s:g}s: {phase.profile}")
        lines.extend(shlex.join(command) for command in phase.commands)
    return "\n".join(lines) + "\n"


def run_docker(argv: list[str]) -> None:
    """Run one docker command; RuntimeError with docker's last error line if it fails."""
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError("docker is not on PATH; use --dry-run to print the commands instead") from None
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or "").strip().splitlines()
        raise RuntimeError(
            f"`{shlex.join(argv)}` failed (exit {exc.returncode}): "
            + (detail[-1] if detail else "is the cluster up (docker compose ... up)?")
        ) from exc


MAX_SLEEP_S = 86400.0
"""The longest single sleep between phases: a long --every-seconds (1e300) waits in such steps."""


def apply(
    phases: list[Phase],
    *,
    out: TextIO = sys.stdout,
    run: Callable[[list[str]], None] = run_docker,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run each phase's commands at its start time (relative to now), logging each to ``out``."""
    origin = clock()
    for phase in phases:
        while (wait := origin + phase.start_s - clock()) > 0:
            sleep(min(wait, MAX_SLEEP_S))  # time.sleep refuses a wait past the platform's time_t
        print(f"# phase {phase.index + 1}/{len(phases)}: {phase.profile}", file=out, flush=True)
        for command in phase.commands:
            print(shlex.join(command), file=out, flush=True)
            run(list(command))
