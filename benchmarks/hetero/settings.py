"""A run's settings as resolved from the command line, and how heterogeneity is emulated: each
worker's CPU share, the server's, the CFS period and the limiter (cgroups, or a slowdown fallback)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.workload import Workload
from deploy.cgroups import CgroupBackend, detect_backend, slowdown_factors
from deploy.profiles import Profile, Schedule, quota_period_us, scale_phases, scale_server


def log(message: str) -> None:
    """One progress line on stderr."""
    print(f"[hetero] {message}", file=sys.stderr, flush=True)


@dataclass
class Settings:
    """Everything a benchmark run needs, resolved from the command line."""

    mode: str
    profile: Profile
    schedule: Schedule | None
    tta: float | None
    workload: Workload
    epochs: int
    controllers: list[str]
    adjust_every: str
    cpu_budget: float
    server_share: float | None
    period_us: int | None
    limiter: str
    baselines: bool
    solo_seconds: float
    solo_warmup: int
    solo_min_steps: int
    ddp_seconds: float
    ddp_warmup: int
    ddp_min_steps: int
    steady_fraction: float
    server_args: list[str]
    run_timeout: float
    workdir: Path
    tiny: bool


@dataclass
class Emulation:
    """How heterogeneity is applied: per-worker shares, the server's share, the CFS period, the backend."""

    names: list[str]
    shares: list[float]
    server_share: float | None
    period_us: int
    backend: CgroupBackend | None
    limiter: str  # what LocalCluster is told: "cgroup" or "slowdown"
    worker_args: list[tuple[str, ...]] = field(default_factory=list)  # per worker: its fixed cost's flag

    @property
    def limiting(self) -> str:
        return f"cgroup-v{self.backend.version}" if self.backend is not None else "slowdown"

    @property
    def slowdowns(self) -> list[float]:
        return slowdown_factors(self.shares)


def resolve_emulation(s: Settings) -> Emulation:
    """Shares from the profile (or the schedule's first phase), the period, and the limiter backend."""
    phases = list(s.schedule.phases) if s.schedule is not None else [s.profile]
    all_shares = scale_phases(phases, s.mode, s.cpu_budget)
    shares = all_shares[0]
    allocation = phases[0].allocation(s.mode)
    server_share = s.server_share
    if server_share is None and s.mode == "asp":
        server_share = scale_server(phases, s.mode, s.cpu_budget)[0]
    every_share = [x for phase in all_shares for x in phase] + ([server_share] if server_share else [])
    period = s.period_us if s.period_us is not None else quota_period_us(every_share)
    try:
        backend = limiter_backend(s)
    except ValueError as exc:
        raise SystemExit(f"hetero: error: {exc}") from None
    names = [f"w{k}" for k in range(len(shares))]
    worker_args = [allocation.worker_args(i) for i in range(len(shares))]
    return Emulation(names, shares, server_share, period, backend, "cgroup" if backend is not None else "slowdown",
                     worker_args)


def limiter_backend(s: Settings) -> CgroupBackend | None:
    """The cgroup backend that limits the run's workers (None: the slowdown fallback); ValueError
    where the flags need one and this machine has none (`benchmarks.hetero` checks it before it starts)."""
    return limiter_backend_of(s.limiter, scheduled=s.schedule is not None)


def limiter_backend_of(limiter: str, scheduled: bool = False) -> CgroupBackend | None:
    """`limiter_backend` of a --limiter value and whether a schedule rewrites quotas: the benchmarks that
    run on hetero's emulation check their --limiter with it before they start (parser.error)."""
    backend = None if limiter == "slowdown" else detect_backend()
    if backend is None and limiter == "cgroup":
        raise ValueError("--limiter cgroup: no writable cgroup CPU controller (run as root on Linux)")
    if backend is None and scheduled:
        raise ValueError("--schedule rewrites quotas while workers run: it needs a writable cgroup CPU controller "
                         "(the slowdown fallback is fixed at start)")
    return backend


def static_split(shares: Sequence[float], total: int) -> list[int]:
    """Integer batches proportional to ``shares`` summing to ``total`` (the static plan, Eq. 4a)."""
    from ps.control.split import largest_remainder

    plan = largest_remainder({str(k): s for k, s in enumerate(shares)}, total)
    return [max(1, plan[str(k)]) for k in range(len(shares))]
