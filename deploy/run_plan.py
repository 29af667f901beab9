"""A ``ps-cluster run`` resolved from its options before anything starts: the profile's or schedule's
shares scaled to the CPU budget, the quota period, the server's command line and the output folder.

The defaults (the job, the policy, ``--quick``'s smaller job) live here; :func:`resolve` raises
ValueError naming what is wrong with the options.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from deploy.profiles import (
    Profile,
    Schedule,
    check_mode,
    default_cpu_budget,
    load_profile,
    load_schedule,
    quota_period_us,
    scale_phases,
    scale_server,
)
from deploy.server_args import check_server_command, server_parser, split_server_args

DEFAULT_JOB: dict[str, Any] = {
    "model": "cnn",
    "dataset": "patterns",
    "global_batch": 512,
    "epochs": 8,
    "lr": 0.02,  # the benchmarks' workload lr: 0.05 spiked after converging in ~1 run in 3
}
"""The main job: a small CNN on generated 32x32 images that take it many epochs (common.job.datasets.patterns);
about 1-3 minutes on a 2-core machine."""
DEFAULT_DATASET_ARGS: dict[str, list[str]] = {"patterns": ["size=4096"]}
"""Dataset options used when the dataset is the default one and no --dataset-arg is given."""
QUICK_JOB: dict[str, Any] = {"global_batch": 256, "epochs": 4}
"""--quick: fewer epochs and a smaller dataset, for smoke tests and first impressions."""
QUICK_DATASET_ARGS: dict[str, list[str]] = {"patterns": ["size=1536", "image_size=16", "shift=2", "separation=0.7"]}
"""--quick: smaller images, shifted less and further apart, so that four epochs learn them."""
DEFAULT_POLICY = "auto"
"""The batch policy without --policy, on a profile and on a schedule alike: ps-server's default, which
solves fixed speeds from its fitted laws and follows speeds that change (docs/policies.md)."""
QUICK_EVERY_EPOCHS = 2
"""--quick with an epoch-based schedule: phases this many epochs long (the batch policy needs one to react)."""
RESERVED_SERVER_FLAGS = {
    "--workers": "one worker per worker of the profile",
    "--port": "it picks a free port and tells the workers", "--port-file": "it picks a free port and tells the workers",
    "--host": "the server listens on loopback, beside its workers", "--metrics-log": "metrics.jsonl in --out",
}
"""ps-server flags the emulator sets itself, and why, as a refused --server-arg names it."""
OWN_FLAGS = (
    "--mode", "--epochs", "--model", "--dataset", "--global-batch", "--lr", "--policy", "--controller", "--adjust-every",
    "--model-arg", "--dataset-arg",
)
"""ps-server flags that ps-cluster run has as options of its own."""


@dataclass
class RunConfig:
    """Everything ``ps-cluster run`` needs; ``None`` means "the default" (see :func:`resolve`)."""

    profile: str = "hl8"
    schedule: str | None = None
    every_epochs: int | None = None
    every_seconds: float | None = None
    mode: str = "bsp"
    cpu_budget: float | None = None
    policy: str | None = None  # DEFAULT_POLICY
    epochs: int | None = None
    model: str | None = None
    model_args: list[str] | None = None
    dataset: str | None = None
    dataset_args: list[str] | None = None
    global_batch: int | None = None
    lr: float | None = None
    adjust_every: str | None = None
    limiter: str = "auto"
    out: Path | None = None
    quick: bool = False
    server_args: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """A resolved run: the phases' shares, the server's command line, where output goes."""

    config: RunConfig
    profiles: list[Profile]
    shares: list[list[float]]
    server_shares: list[float | None]
    schedule: Schedule | None
    period_us: int
    server_args: list[str]
    out: Path
    names: list[str]
    epochs: int

    @property
    def phase_label(self) -> str:
        return " -> ".join(p.name for p in self.profiles)


def _refused(flag: str) -> str | None:
    """Why ``ps-cluster run --server-arg`` refuses ``flag``, or None."""
    if flag in RESERVED_SERVER_FLAGS:
        return f" is set by the emulator ({RESERVED_SERVER_FLAGS[flag]})"
    if flag in OWN_FLAGS:
        return f": use ps-cluster run {flag} instead"
    return None


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")


def resolve(config: RunConfig) -> Plan:
    """Load the profile or schedule, scale it to the budget, and build the server's arguments.

    ValueError (bad input) names what is wrong; nothing has started yet.
    """
    mode = check_mode(config.mode)
    budget = default_cpu_budget() if config.cpu_budget is None else float(config.cpu_budget)
    if not budget > 0:
        raise ValueError(f"--cpu-budget must be > 0, got {budget}")
    schedule = None
    epochs = config.epochs
    if config.schedule is not None:
        schedule = load_schedule(config.schedule)
        if config.every_epochs is not None or config.every_seconds is not None:
            schedule = schedule.every(epochs=config.every_epochs, seconds=config.every_seconds)
        elif config.quick and schedule.every_epochs is not None:
            schedule = schedule.every(epochs=QUICK_EVERY_EPOCHS)
        profiles = list(schedule.phases)
        if epochs is None and schedule.every_epochs is not None:
            epochs = schedule.every_epochs * len(profiles)
    else:
        if config.every_epochs is not None or config.every_seconds is not None:
            raise ValueError("--every-epochs / --every-seconds need --schedule")
        profiles = [load_profile(config.profile)]
    shares = scale_phases(profiles, mode, budget)  # one scale for every phase: a halved worker stays halved
    counts = {len(s) for s in shares}
    if len(counts) != 1:
        raise ValueError(f"every phase must have the same number of workers, got {sorted(counts)}")
    # the server's quota in ASP: its cores at the workers' scale
    server_shares: list[float | None] = scale_server(profiles, mode, budget) if mode == "asp" else [None] * len(profiles)
    if len({share is None for share in server_shares}) > 1:
        without = ", ".join(p.name for p, share in zip(profiles, server_shares, strict=True) if share is None)
        raise ValueError(
            f"in {mode} every phase must give the server a share of cores, or none must: {without} give none "
            "(the server's quota could not be set, or lifted, at a phase change)"
        )
    everything = [s for phase in shares for s in phase] + [s for s in server_shares if s is not None]
    period = quota_period_us(everything)

    if config.policy is None:
        config = replace(config, policy=DEFAULT_POLICY)
    quick = config.quick
    job = {**DEFAULT_JOB, **(QUICK_JOB if quick else {})}
    model = config.model or job["model"]
    dataset = config.dataset or job["dataset"]
    if config.dataset_args is not None:
        dataset_args = list(config.dataset_args)
    elif config.dataset is None or config.dataset == DEFAULT_JOB["dataset"]:
        dataset_args = list((QUICK_DATASET_ARGS if quick else DEFAULT_DATASET_ARGS).get(dataset, []))
    else:
        dataset_args = []
    epochs = epochs if epochs is not None else job["epochs"]
    global_batch = config.global_batch if config.global_batch is not None else job["global_batch"]
    lr = config.lr if config.lr is not None else job["lr"]
    if epochs < 1 or global_batch < 1 or not lr > 0:
        raise ValueError("--epochs and --global-batch must be >= 1 and --lr > 0")
    names = [f"w{k}" for k in range(len(shares[0]))]
    if global_batch < len(names):
        raise ValueError(f"--global-batch {global_batch} is smaller than the {len(names)} workers")

    server_args = [
        "--mode", mode, "--workers", str(len(names)), "--model", model, "--dataset", dataset,
        "--epochs", str(epochs), "--global-batch", str(global_batch), "--lr", repr(lr),
        "--controller", str(config.policy), "--quiet",
    ]
    for arg in config.model_args or []:
        server_args += ["--model-arg", arg]
    for arg in dataset_args:
        server_args += ["--dataset-arg", arg]
    if config.adjust_every is not None:
        server_args += ["--adjust-every", str(config.adjust_every)]
    parser = server_parser()
    server_args += split_server_args(config.server_args, parser, _refused)
    check_server_command(parser, [*server_args, "--port", "0"], files_here=True)  # what only ps-server checks fails here, not after the run started
    out = config.out if config.out is not None else _fresh(Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S"))
    _check_out(Path(out))
    return Plan(config, profiles, shares, server_shares, schedule, period, server_args, Path(out), names, epochs)


def unreached(schedule: Schedule, epochs: int) -> str | None:
    """What a job of ``epochs`` epochs leaves out of ``schedule``, as a warning; None when every phase
    runs (always on the wall clock, where the schedule's end stops the job)."""
    every = schedule.every_epochs
    left = [f"{k} ({p.name})" for k, p in enumerate(schedule.phases) if every is not None and k * every >= epochs]
    if every is None or not left:
        return None
    return (f"--epochs {epochs} ends the job before phase{'s' if len(left) > 1 else ''} {', '.join(left)} of "
            f"schedule {schedule.name} ({every} epochs a phase) start; --epochs {every * len(schedule.phases)} "
            "runs every phase")


def _fresh(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... if it exists already."""
    candidate, k = path, 1
    while candidate.exists():
        k += 1
        candidate = path.with_name(f"{path.name}-{k}")
    return candidate
