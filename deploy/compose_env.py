"""docker-compose env files generated from a profile: the ``cpus:`` of every container.

``deploy/docker-compose.yml`` reads ``MODE``, ``PS_CPUS`` and ``W<k>_CPUS`` / ``W<k>_THREADS`` from
an env file. The committed files (``deploy/hl8.env``, ``deploy/hl8-asp.env``, ...) are this module's
output for scale 1, and a test regenerates them, so the profile YAML stays the single source.
"""

from __future__ import annotations

import math
from pathlib import Path

from deploy.profiles import Profile, check_mode

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
    named = [(f"worker{k}", cores) for k, cores in enumerate(workers)] + ([("the server", server)] if server is not None else [])
    for name, cores in named:
        if cores < 0.01:  # and PS_CPUS=0 would mean no limit at all
            raise ValueError(f"{name} would get {cores:.4g} CPUs at scale {scale:g}; docker needs at least 0.01")
    return workers, server


def env_filename(profile_name: str, mode: str) -> str:
    """The committed env file's name: ``hl8.env`` for BSP, ``hl8-asp.env`` for ASP."""
    return f"{profile_name}.env" if check_mode(mode) == "bsp" else f"{profile_name}-asp.env"


def render_env(profile: Profile, mode: str, scale: float = 1.0) -> str:
    """The env file for ``profile`` in ``mode``: every container's cpus = profile cores x ``scale``.

    ``W<k>_THREADS`` (compute threads) is the worker's CPUs rounded up, so a worker can use its
    whole allocation; ``PS_CPUS=0`` means no limit (docker's default).
    """
    mode = check_mode(mode)
    workers, server = container_cpus(profile, mode, scale)
    source = profile.source.name if profile.source is not None else profile.name
    flags = f"--profile {profile.name}" + (" --mode asp" if mode == "asp" else "")
    flags += "" if scale == 1.0 else f" --scale {scale:g}"
    lines = [
        f"# Generated from {source} by `ps-cluster compose-env {flags}`; do not edit.",
        f"# {profile.description or profile.name} ({mode.upper()}), HL = "
        f"{profile.allocation(mode).heterogeneity:g}, CPUs = profile cores x {scale:g}.",
        f"MODE={mode}",
        f"PS_CPUS={format_cpus(server) if server is not None else '0'}",
    ]
    for k, cores in enumerate(workers):
        lines.append(f"W{k}_CPUS={format_cpus(cores)}")
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
