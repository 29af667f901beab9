"""docker-compose env files generated from a profile: the CPU quota of every container.

``deploy/docker-compose.yml`` reads ``MODE``, ``CPU_PERIOD``, ``PS_CPU_QUOTA`` and ``W<k>_CPUS`` /
``W<k>_CPU_QUOTA`` / ``W<k>_THREADS`` from an env file. The committed files (``deploy/hl8.env``, ``deploy/hl8-asp.env``, ...) are this module's
output for scale 1, and a test regenerates them, so the profile YAML stays the single source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deploy.profiles import Profile, check_mode, quota_period_us

DEPLOY_DIR = Path(__file__).resolve().parent
"""Where the compose file and the committed env files live."""
COMPOSE_WORKERS = 4
"""Worker services in ``deploy/docker-compose.yml`` (worker0 .. worker3)."""


def format_cpus(cores: float) -> str:
    """Cores as docker writes them: up to 4 decimals, no trailing zeros (``6``, ``0.1875``)."""
    text = f"{cores:.4f}".rstrip("0").rstrip(".")
    return text or "0"


def container_cpus(profile: Profile, mode: str, scale: float = 1.0) -> tuple[list[float], float | None]:
    """Per-worker cores and the server's cores (None: no limit), the profile's cores times ``scale``."""
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a number > 0, got {scale}")
    allocation = profile.allocation(mode)
    if len(allocation.workers) != COMPOSE_WORKERS:
        raise ValueError(
            f"profile {profile.name!r} has {len(allocation.workers)} {check_mode(mode)} workers, but "
            f"docker-compose.yml defines {COMPOSE_WORKERS} (worker0..worker{COMPOSE_WORKERS - 1})"
        )
    workers = [w * scale for w in allocation.workers]
    server = None if allocation.server is None else allocation.server * scale
    return workers, server


@dataclass(frozen=True)
class ContainerLimits:
    """The containers' CPU limits: cores each, as CFS quotas at one short period."""

    workers: tuple[float, ...]
    server: float | None
    period_us: int

    def quota_us(self, cores: float) -> int:
        """The CFS quota (us per period) that gives ``cores`` cores at :attr:`period_us`."""
        return round(cores * self.period_us)


def cfs_period_us(shares: Sequence[float], scale: float) -> int:
    """:func:`deploy.profiles.quota_period_us` of ``shares``, its error naming the scale."""
    try:
        return quota_period_us(shares)
    except ValueError as exc:
        raise ValueError(f"at scale {scale:g}: {exc}".replace("(raise the CPU budget)", "(raise --scale)")) from None


def container_limits(profile: Profile, mode: str, scale: float = 1.0) -> ContainerLimits:
    """Cores and the CFS period for ``profile`` in ``mode`` at ``scale``.

    The period is the shortest the kernel accepts for every limited container (1 ms over the
    smallest share, design brief section 6): 8 ms when the smallest gets 1/8 core, 1 ms when every
    container gets a core or more. Docker's default of 100 ms makes a small worker's steps bursty.
    """
    workers, server = container_cpus(profile, mode, scale)
    limited = [*workers, *([server] if server is not None else [])]
    return ContainerLimits(tuple(workers), server, cfs_period_us(limited, scale))


def env_filename(profile_name: str, mode: str) -> str:
    """The committed env file's name: ``hl8.env`` for BSP, ``hl8-asp.env`` for ASP."""
    return f"{profile_name}.env" if check_mode(mode) == "bsp" else f"{profile_name}-asp.env"


def render_env(profile: Profile, mode: str, scale: float = 1.0) -> str:
    """The env file for ``profile`` in ``mode``: every container's CPU quota = profile cores x ``scale``.

    ``CPU_PERIOD`` is the CFS period of every container, ``W<k>_CPU_QUOTA`` / ``PS_CPU_QUOTA`` the
    quotas (``PS_CPU_QUOTA=0``: no limit, Docker's default), ``W<k>_CPUS`` the cores a worker declares
    (``--cores``, the static controller's shares) and ``W<k>_THREADS`` its compute threads, the
    cores rounded up, so a worker can use its whole allocation.
    """
    mode = check_mode(mode)
    limits = container_limits(profile, mode, scale)
    source = profile.source.name if profile.source is not None else profile.name
    flags = f"--profile {profile.name}" + (" --mode asp" if mode == "asp" else "")
    flags += "" if scale == 1.0 else f" --scale {scale:g}"
    lines = [
        f"# Generated from {source} by `ps-cluster compose-env {flags}`; do not edit.",
        f"# {profile.description or profile.name} ({mode.upper()}), HL = "
        f"{profile.allocation(mode).heterogeneity:g}, CPUs = profile cores x {scale:g}, "
        f"as CFS quotas per {limits.period_us} us period.",
        f"MODE={mode}",
        f"CPU_PERIOD={limits.period_us}",
        f"PS_CPU_QUOTA={limits.quota_us(limits.server) if limits.server is not None else 0}",
    ]
    for k, cores in enumerate(limits.workers):
        lines.append(f"W{k}_CPUS={format_cpus(cores)}")
        lines.append(f"W{k}_CPU_QUOTA={limits.quota_us(cores)}")
        lines.append(f"W{k}_THREADS={max(1, math.ceil(round(cores, 4)))}")
    return "\n".join(lines) + "\n"


def parse_env(text: str) -> dict[str, str]:
    """``KEY=value`` lines of an env file (comments and blank lines skipped)."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"env line {number} is not KEY=value: {line!r}")
        values[key.strip()] = value.strip()
    return values
