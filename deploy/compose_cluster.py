"""The docker-compose cluster run to the end of its job, as the compose test and the benchmark run it.

:class:`ComposeCluster` starts ``deploy/docker-compose.yml`` (with the host networking override,
``deploy/docker-compose.host.yml``, by default) under a project name of its own, for an env file
rendered from a profile (:func:`deploy.compose_env.render_env`) and a job given as the compose file's
variables (``MODEL``, ``EPOCHS``, ``SERVER_ARGS``, ...). It mounts a host folder into the server's
container for the metrics log, waits for the server's container to exit, and collects every
container's exit code, restart count and log before ``docker compose down`` removes them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from deploy.compose_env import COMPOSE_WORKERS, DEPLOY_DIR
from ps.ops.metrics import read_metrics

COMPOSE_FILE = DEPLOY_DIR / "docker-compose.yml"
HOST_OVERRIDE = DEPLOY_DIR / "docker-compose.host.yml"
HOST_ENV = DEPLOY_DIR / "host-network.env"
ENGINE_SCRIPT = DEPLOY_DIR / "engine.sh"
SERVICES = ("ps-server", *(f"worker{k}" for k in range(COMPOSE_WORKERS)))
MOUNT = "/run/hetero-ps"
"""Where the server's container sees the run folder (its metrics log goes there)."""
DOCKER_TIMEOUT_S = 120.0
"""How long one docker command other than the run itself may take."""
_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
"""What compose writes to clear lines even with --ansi never (docker compose 2.26)."""


class ComposeError(RuntimeError):
    """A docker or docker compose command failed, or the run did not end in time."""


def engine_problem() -> str | None:
    """Why no Docker engine with compose v2 can be used here (one line), or None when one can."""
    if shutil.which("docker") is None:
        return "docker is not on PATH (deploy/engine.sh installs and starts an engine)"
    for argv, what in ((["docker", "info"], "no Docker engine answers"),
                       (["docker", "compose", "version"], "docker compose (v2) is missing")):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            return f"`{shlex.join(argv)}` did not answer within 30 s"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [""])[-1]
            return f"{what} ({last}); deploy/engine.sh installs and starts one"
    return None


def build_image(timeout: float = 1800.0) -> None:
    """Build the image from this working tree with ``deploy/engine.sh`` (seconds when its layers are
    cached; it starts an engine first where none runs); ComposeError with its last lines if it fails."""
    try:
        done = subprocess.run([str(ENGINE_SCRIPT)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ComposeError(f"deploy/engine.sh did not finish within {timeout:g} s") from None
    if done.returncode != 0:
        raise ComposeError(f"deploy/engine.sh failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the server's, with host networking)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ContainerEnd:
    """How one service's container ended."""

    exit_code: int | None
    restarts: int
    running: bool
    cpu_period_us: int = 0
    cpu_quota_us: int = 0
    network_mode: str = ""


@dataclass
class ComposeResult:
    """What a run left: the server's metrics, every container's end, the logs."""

    events: list[dict[str, Any]]
    containers: dict[str, ContainerEnd]
    logs: str
    wall_s: float
    summary_line: str | None = None

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == kind]


@dataclass
class ComposeCluster:
    """One run of the compose cluster; use as a context manager (``down`` on every exit path)."""

    env_file: Path
    workdir: Path
    job: Mapping[str, str] = field(default_factory=dict)
    server_args: Sequence[str] = ()
    host_network: bool = True
    project: str = field(default_factory=lambda: f"hetero-ps-{uuid.uuid4().hex[:8]}")
    port: int = 0
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    """The compose secret ps-token of this run (the shell's PS_TOKEN wins), so every call carries one."""
    _started: float = 0.0

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.mount_dir = self.workdir / "server"
        self.mount_dir.mkdir(exist_ok=True)
        self.mount_dir.chmod(0o777)  # the image runs as an unprivileged user
        if self.host_network and not self.port:
            self.port = free_port()
        self.metrics_path = self.mount_dir / "metrics.jsonl"
        self.mount_file = self.workdir / "compose.mount.yml"
        self.mount_file.write_text(
            "services:\n  ps-server:\n    volumes:\n"
            f"      - {json.dumps(f'{self.mount_dir.resolve()}:{MOUNT}')}\n",
            encoding="utf-8",
        )

    def command(self, *args: str) -> list[str]:
        """``docker compose`` with this run's files, env files and project name, then ``args``."""
        files = [COMPOSE_FILE, *([HOST_OVERRIDE] if self.host_network else []), self.mount_file]
        env_files = [self.env_file, *([HOST_ENV] if self.host_network else [])]
        argv = ["docker", "compose", "--ansi", "never", "-p", self.project]
        for path in files:
            argv += ["-f", str(path)]
        for path in env_files:
            argv += ["--env-file", str(path)]
        return [*argv, *args]

    def environment(self) -> dict[str, str]:
        """The compose variables of the job (the shell's win over the env files)."""
        server_args = [*self.server_args, "--metrics-log", f"{MOUNT}/metrics.jsonl"]
        env = {**os.environ, **self.job, "SERVER_ARGS": shlex.join(server_args)}
        env["PS_TOKEN"] = os.environ.get("PS_TOKEN") or self.token
        if self.host_network:
            env["PS_PORT"] = str(self.port)
        return env

    def _docker(self, *args: str, timeout: float = DOCKER_TIMEOUT_S) -> str:
        argv = self.command(*args)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.environment())
        except subprocess.TimeoutExpired:
            raise ComposeError(f"`{shlex.join(argv[:2] + list(args))}` did not finish within {timeout:g} s") from None
        if done.returncode != 0:
            detail = done.stderr.strip().splitlines()
            raise ComposeError(f"`docker compose {shlex.join(args)}` failed (exit {done.returncode}): "
                               + (detail[-1] if detail else "no message"))
        return done.stdout

    def up(self) -> None:
        """Create and start every container (the image must exist: deploy/engine.sh builds it)."""
        self._started = time.monotonic()
        self._docker("up", "--detach", "--no-build", "--quiet-pull")

    def container(self, service: str) -> str:
        """The container compose made for ``service``."""
        return f"{self.project}-{service}-1"

    def wait(self, timeout: float) -> ComposeResult:
        """Wait for the server's container to exit (its job ended), then for the workers'."""
        deadline = time.monotonic() + timeout
        server = self.container("ps-server")
        try:
            subprocess.run(["docker", "wait", server], capture_output=True, text=True, timeout=timeout, check=True)
        except subprocess.TimeoutExpired:
            raise ComposeError(f"the server's container did not exit within {timeout:g} s; logs:\n"
                               + self.logs()[-3000:]) from None
        except subprocess.CalledProcessError as exc:
            raise ComposeError(f"docker wait {server} failed: {exc.stderr.strip()}") from exc
        wall = time.monotonic() - self._started
        for service in SERVICES[1:]:  # workers leave once the server said done
            while self._end(service).running and time.monotonic() < deadline:
                time.sleep(0.5)
        logs = self.logs()
        (self.workdir / "compose.log").write_text(logs, encoding="utf-8")
        summary = [line for line in logs.splitlines() if "summary:" in line and line.startswith("ps-server")]
        return ComposeResult(
            events=read_metrics(self.metrics_path) if self.metrics_path.exists() else [],
            containers={service: self._end(service) for service in SERVICES},
            logs=logs,
            wall_s=round(wall, 2),
            summary_line=summary[-1] if summary else None,
        )

    def _end(self, service: str) -> ContainerEnd:
        state = subprocess.run(
            ["docker", "inspect", "-f", "{{json .State}}\t{{json .HostConfig}}\t{{.RestartCount}}", self.container(service)],
            capture_output=True, text=True, timeout=DOCKER_TIMEOUT_S,
        )
        if state.returncode != 0:
            return ContainerEnd(None, 0, False)
        raw_state, raw_host, restarts = state.stdout.strip().split("\t")
        data, host = json.loads(raw_state), json.loads(raw_host)
        return ContainerEnd(
            data.get("ExitCode"), int(restarts), bool(data.get("Running") or data.get("Restarting")),
            int(host.get("CpuPeriod") or 0), int(host.get("CpuQuota") or 0), str(host.get("NetworkMode", "")),
        )

    def logs(self) -> str:
        """Every container's output, prefixed with its service."""
        try:
            return _TERMINAL_CODES.sub("", self._docker("logs", "--no-color"))
        except ComposeError as exc:
            return str(exc)

    def down(self) -> None:
        """Stop and remove the containers (and any network compose made)."""
        self._docker("down", "--remove-orphans", "--timeout", "5")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        try:
            self.down()
        except ComposeError:
            if exc_type is None:
                raise  # else the error that ended the block is the one to see
