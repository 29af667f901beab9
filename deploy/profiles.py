"""Heterogeneity profiles and schedules: the CPU allocations every emulator in ``deploy/`` applies.

A profile (``deploy/profiles/hl*.yaml``) gives CPU cores per worker for BSP and for ASP (plus the
parameter server's cores), as in OmniLearn's Table I. A schedule (``deploy/profiles/dynamic.yaml``)
steps through profiles at a fixed interval of epochs or seconds, as in OmniLearn's Fig. 10. The YAML
files are the single source: docker-compose env files and cgroup quotas are derived from them, and
users write their own by copying one.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from deploy import strict_yaml
from deploy.cgroups import MAX_PERIOD_US, MIN_PERIOD_US, MIN_QUOTA_US
from common.job.spec import MAX_EPOCHS
from common.number_checks import real_number
from worker.probes.resources import MAX_STEP_OVERHEAD_MS

MODES = ("bsp", "asp")
"""Training modes a profile can define an allocation for."""
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
"""Where the built-in profiles and schedules live."""
SERVER_RESERVE = 0.5
"""Cores :func:`default_cpu_budget` leaves to the parameter server and the system."""

_PROFILE_KEYS = {"kind", "name", "description", *MODES}
_ALLOCATION_KEYS = {"workers", "server", "gpus", "step_overhead_ms"}
_SCHEDULE_KEYS = {"kind", "name", "description", "every_epochs", "every_seconds", "phases"}
_EXPONENT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


@dataclass(frozen=True)
class Allocation:
    """CPU cores of each worker (in worker order) and, optionally, of the parameter server, the
    GPUs of each worker (None: none anywhere) and each worker's fixed per-step cost in ms of CPU
    work (``ps-worker --step-overhead-ms``; None: none). GPUs are requested by ``ps-cluster k8s``; the
    cgroup emulator and docker-compose run every worker on its CPU cores. The fixed cost is applied
    by the cgroup emulator (``ps-cluster run``, from the first phase of a schedule) and
    ``benchmarks.hetero``; its CPU quota stretches it like the rest of the step."""

    workers: tuple[float, ...]
    server: float | None = None
    gpus: tuple[int, ...] | None = None
    step_overhead_ms: tuple[float, ...] | None = None

    def worker_args(self, index: int) -> tuple[str, ...]:
        """The ps-worker flags worker ``index`` needs for this allocation (its fixed cost)."""
        ms = self.step_overhead_ms[index] if self.step_overhead_ms is not None else 0.0
        return ("--step-overhead-ms", repr(float(ms))) if ms > 0 else ()

    @property
    def heterogeneity(self) -> float:
        """OmniLearn's heterogeneity level (Eq. 3): max cores / min cores."""
        return max(self.workers) / min(self.workers)


@dataclass(frozen=True)
class Profile:
    """A named set of per-mode allocations."""

    name: str
    description: str
    modes: Mapping[str, Allocation]
    source: Path | None = None

    def allocation(self, mode: str) -> Allocation:
        """The allocation for ``mode``; ValueError if the mode is unknown or not defined here."""
        mode = check_mode(mode)
        if mode not in self.modes:
            where = f" ({self.source})" if self.source is not None else ""
            raise ValueError(f"profile {self.name!r}{where} defines no {mode} allocation (it has: "
                             f"{', '.join(self.modes)}; pass --mode {next(iter(self.modes))} or add the {mode} section)")
        return self.modes[mode]


@dataclass(frozen=True)
class Schedule:
    """Profiles applied one after another, each for ``every_epochs`` epochs or ``every_seconds``."""

    name: str
    description: str
    phases: tuple[Profile, ...]
    every_epochs: int | None = None
    every_seconds: float | None = None
    source: Path | None = None

    def __post_init__(self) -> None:
        """The phases together last at most the epochs a job may train (JobSpec's MAX_EPOCHS)."""
        if self.every_epochs is not None and self.every_epochs * len(self.phases) > MAX_EPOCHS:
            raise ValueError(f"schedule {self.name}: {len(self.phases)} phases of {self.every_epochs} epochs are more "
                             f"than the {MAX_EPOCHS} epochs a job may train")

    @property
    def unit(self) -> str:
        """``"epochs"`` or ``"seconds"``: what the interval counts."""
        return "epochs" if self.every_epochs is not None else "seconds"

    @property
    def interval(self) -> float:
        """Length of one phase, in :attr:`unit`."""
        return float(self.every_epochs if self.every_epochs is not None else self.every_seconds)  # type: ignore[arg-type]

    def phase_index(self, progress: float) -> int:
        """The phase in force after ``progress`` epochs or seconds; the last phase stays on at the end."""
        if progress < 0:
            raise ValueError(f"progress must be >= 0, got {progress}")
        ratio = progress / self.interval
        nearest = round(ratio)
        # an exact boundary in seconds (0.3 s at 0.1 s a phase) divides to just under the whole number
        index = nearest if math.isclose(ratio, nearest, rel_tol=1e-9, abs_tol=1e-12) else math.floor(ratio)
        return min(index, len(self.phases) - 1)

    def phase_at(self, progress: float) -> Profile:
        """The profile in force after ``progress`` epochs or seconds."""
        return self.phases[self.phase_index(progress)]

    def every(self, *, epochs: int | None = None, seconds: float | None = None) -> Schedule:
        """The same phases with a different interval (exactly one of ``epochs`` or ``seconds``)."""
        every_epochs, every_seconds = _interval({"every_epochs": epochs, "every_seconds": seconds},
                                                "the interval override")
        return replace(self, every_epochs=every_epochs, every_seconds=every_seconds)


def check_mode(mode: str) -> str:
    """Return ``mode`` lower-cased; ValueError unless it is bsp or asp."""
    if not isinstance(mode, str) or mode.lower() not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode.lower()


def _positive_number(value: Any) -> float | None:
    """`value` as a finite float > 0, or None if it is not one (a bool, a string, an integer too
    large for a float, NaN, infinity, zero or less)."""
    number = real_number(value)
    return number if number is not None and number > 0 else None


def _check_share(value: Any, where: str) -> float:
    """A positive, finite number of cores."""
    share = _positive_number(value)
    if share is None:
        raise ValueError(f"{where} must be a number of CPU cores > 0, got {_shown(value)}")
    return share


def _shown(value: Any, limit: int = 40) -> str:
    """`value` for an error message, cut short (a 400-digit number in a YAML file stays readable); text
    such as 1e-3, which YAML 1.1 reads as a string, says how to write it as a number."""
    text = repr(value) if len(repr(value)) <= limit else repr(value)[: limit - 3] + "..."
    if isinstance(value, str) and _EXPONENT_TEXT.fullmatch(value.strip()):
        text += " (text: YAML reads an exponent as a number only with a dot and a sign, 1.0e-3, or write 0.001)"
    return text


def _builtin_files() -> dict[str, tuple[str, Path]]:
    """Built-in YAML files by name: ``name -> (kind, path)``."""
    return {path.stem: (str(_read_yaml(path).get("kind", "profile")), path) for path in sorted(PROFILE_DIR.glob("*.yaml"))}


def builtin_profiles() -> list[str]:
    """Names of the built-in profiles."""
    return [name for name, (kind, _) in _builtin_files().items() if kind == "profile"]


def builtin_schedules() -> list[str]:
    """Names of the built-in schedules."""
    return [name for name, (kind, _) in _builtin_files().items() if kind == "schedule"]


def _read_yaml(path: Path) -> dict[str, Any]:
    """A YAML file's top-level mapping, with file-naming errors."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from exc
    try:
        data = strict_yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}".replace("\n", " ")) from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _is_path(name_or_path: str | os.PathLike[str]) -> bool:
    """Whether the argument names a file rather than a built-in."""
    text = os.fspath(name_or_path)
    return isinstance(name_or_path, os.PathLike) or os.sep in text or "/" in text or text.endswith((".yaml", ".yml"))


def _resolve(name_or_path: str | os.PathLike[str], kind: str, base: Path | None = None) -> Path:
    """The YAML file a profile or schedule argument refers to."""
    if _is_path(name_or_path):
        path = Path(name_or_path).expanduser()
        if base is not None and not path.is_absolute():
            path = base / path
        if not path.is_file():
            why = "is a folder, not a YAML file" if path.is_dir() else "is not a file" if path.exists() else "does not exist"
            raise ValueError(f"{kind} file {path} {why}")
        return path
    name = os.fspath(name_or_path).strip().lower()
    builtins = _builtin_files()
    known = [n for n, (k, _) in builtins.items() if k == kind]
    if name not in builtins or builtins[name][0] != kind:
        other = f" ({name!r} is a {builtins[name][0]})" if name in builtins else ""
        raise ValueError(f"unknown {kind} {os.fspath(name_or_path)!r}{other}; known {kind}s: {', '.join(known)} "
                         "(or pass the path of a YAML file)")
    return builtins[name][1]


def _check_keys(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    """Reject unknown keys, which are usually typos."""
    unknown = sorted(map(str, set(data) - allowed))  # YAML keys may be numbers, booleans, None
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _check_kind(data: Mapping[str, Any], kind: str, path: Path) -> None:
    """A file's ``kind`` (given, or a profile's: modes and no phases) must match what the caller loads."""
    found = data.get("kind", "profile" if "phases" not in data and set(MODES) & set(data) else kind)
    if found != kind:
        hint = f" (pass a {found} with --{found})" if found in ("profile", "schedule") else ""
        raise ValueError(f"{path}: kind is {found!r}, expected {kind!r}{hint}")


def _parse_allocation(data: Any, where: str) -> Allocation:
    """One mode's allocation."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping with 'workers' (and optionally 'server')")
    _check_keys(data, _ALLOCATION_KEYS, where)
    workers = data.get("workers")
    if not isinstance(workers, list) or not workers:
        raise ValueError(f"{where}.workers must be a non-empty list of CPU cores, one per worker")
    shares = tuple(_check_share(w, f"{where}.workers[{i}]") for i, w in enumerate(workers))
    if not math.isfinite(sum(shares)):  # scaling divides by the sum: every share would be 0
        raise ValueError(f"{where}.workers add up to more cores than a float holds; keep their ratios, smaller")
    server = data.get("server")
    gpus = data.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, list) or len(gpus) != len(shares):
            raise ValueError(f"{where}.gpus must be a list of GPU counts, one per worker ({len(shares)})")
        for i, count in enumerate(gpus):
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"{where}.gpus[{i}] must be a whole number of GPUs >= 0, got {_shown(count)}")
    return Allocation(
        shares, None if server is None else _check_share(server, f"{where}.server"),
        None if gpus is None else tuple(gpus), _step_overheads(data.get("step_overhead_ms"), len(shares), where),
    )


def _step_overheads(value: Any, count: int, where: str) -> tuple[float, ...] | None:
    """``step_overhead_ms``: one number for every worker, or a list with one per worker; each in [0, max]."""
    if value is None:
        return None
    values = value if isinstance(value, list) else [value] * count
    if len(values) != count:
        raise ValueError(f"{where}.step_overhead_ms must be one number or a list of one per worker ({count})")
    out = []
    for i, item in enumerate(values):
        number = real_number(item)
        if number is None or not 0 <= number <= MAX_STEP_OVERHEAD_MS:
            raise ValueError(f"{where}.step_overhead_ms[{i}] must be a number of ms in [0, "
                             f"{MAX_STEP_OVERHEAD_MS:g}], got {_shown(item)}")
        out.append(number)
    return tuple(out)


def parse_profile(data: Mapping[str, Any], source: Path) -> Profile:
    """Build a profile from a YAML mapping read from ``source``; ValueError naming the bad field."""
    _check_kind(data, "profile", source)
    _check_keys(data, _PROFILE_KEYS, str(source))
    modes = {mode: _parse_allocation(data[mode], f"{source}: {mode}") for mode in MODES if mode in data}
    if not modes:
        raise ValueError(f"{source}: define at least one of {', '.join(MODES)} with a 'workers' list")
    return Profile(
        name=_one_line(data, "name", source.stem), description=_one_line(data, "description"),
        modes=MappingProxyType(modes), source=source,
    )


def _one_line(data: Mapping[str, Any], key: str, default: str = "") -> str:
    """``data[key]`` (`default` if absent or blank) on one line, a YAML block (|) too: it heads generated files."""
    return " ".join(str(data.get(key, default)).split()) or default


def load_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    """Load a built-in profile by name (``hl8``) or a profile YAML file by path."""
    path = _resolve(name_or_path, "profile")
    return parse_profile(_read_yaml(path), path)


def _interval(data: Mapping[str, Any], where: str) -> tuple[int | None, float | None]:
    """Exactly one of ``every_epochs`` (a positive integer) or ``every_seconds`` (positive)."""
    epochs, seconds = data.get("every_epochs"), data.get("every_seconds")
    if (epochs is None) == (seconds is None):
        raise ValueError(f"{where}: give exactly one of every_epochs or every_seconds")
    if epochs is not None:
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs <= 0:
            raise ValueError(f"{where}: every_epochs must be a whole number > 0, got {_shown(epochs)}")
        return epochs, None
    every = _positive_number(seconds)
    if every is None:
        raise ValueError(f"{where}: every_seconds must be a number > 0, got {_shown(seconds)}")
    return None, every


def load_schedule(name_or_path: str | os.PathLike[str]) -> Schedule:
    """Load a built-in schedule by name (``dynamic``) or a schedule YAML file by path.

    Phases name built-in profiles or profile files (relative paths are taken from the schedule's
    folder); every phase must have the same number of workers in each mode they all define.
    """
    path = _resolve(name_or_path, "schedule")
    data = _read_yaml(path)
    _check_kind(data, "schedule", path)
    _check_keys(data, _SCHEDULE_KEYS, str(path))
    every_epochs, every_seconds = _interval(data, str(path))
    names = data.get("phases")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: phases must be a non-empty list of profile names or paths")
    loaded: dict[str, Profile] = {}
    for name in names:
        if name not in loaded:
            try:
                loaded[name] = parse_profile(_read_yaml(p := _resolve(name, "profile", path.parent)), p)
            except ValueError as exc:
                raise ValueError(f"{path}: phase {name!r}: {exc}") from exc
    phases = tuple(loaded[n] for n in names)
    for mode in MODES:
        if all(mode in p.modes for p in phases):
            counts = {p.name: len(p.modes[mode].workers) for p in phases}
            if len(set(counts.values())) > 1:
                raise ValueError(f"{path}: every phase must have the same number of {mode} workers, got {counts}")
    return Schedule(
        name=_one_line(data, "name", path.stem), description=_one_line(data, "description"),
        phases=phases, every_epochs=every_epochs, every_seconds=every_seconds, source=path,
    )


def scale(profile: Profile, mode: str, cpu_budget: float) -> list[float]:
    """Per-worker CPU shares, in cores, with the profile's ratios and summing to ``cpu_budget``."""
    budget = _check_share(cpu_budget, "cpu_budget")
    workers = profile.allocation(mode).workers
    total = sum(workers)
    return [w * budget / total for w in workers]


def scale_phases(profiles: Sequence[Profile], mode: str, cpu_budget: float) -> list[list[float]]:
    """Per-worker CPU shares of each phase of a schedule, every phase at one scale: the phase with the
    most cores in all sums to ``cpu_budget`` and the others keep their cores' ratio to it, so a phase
    where a worker's cores are halved (another tenant on its node) leaves that worker half its share
    instead of scaling every worker up. One profile: :func:`scale`'s shares."""
    budget = _check_share(cpu_budget, "cpu_budget")
    if not profiles:
        raise ValueError("a schedule needs at least one phase")
    top = max(sum(p.allocation(mode).workers) for p in profiles)
    return [[w * budget / top for w in p.allocation(mode).workers] for p in profiles]


def scale_server(profiles: Sequence[Profile], mode: str, cpu_budget: float) -> list[float | None]:
    """The server's share of each phase at :func:`scale_phases`' scale (None where a phase gives it no cores)."""
    budget = _check_share(cpu_budget, "cpu_budget")
    top = max(sum(p.allocation(mode).workers) for p in profiles)
    return [None if (server := p.allocation(mode).server) is None else server * budget / top for p in profiles]


def quota_period_us(shares: Sequence[float]) -> int:
    """The CFS period (us) for a set of CPU shares (cores): the shortest the kernel accepts for all.

    Every quota ``share * period`` must be at least 1 ms and the period at least 1 ms, so the period
    is ``1 ms / smallest share``, never under 1 ms: 8 ms for a 1/8-core worker, 1 ms when every
    share is a core or more. Short periods keep throttling smooth; the period goes past 10 ms only
    when a share is under 0.1 core, and past the kernel's 1 s limit never (ValueError).
    """
    if not shares:
        raise ValueError("shares must not be empty")
    smallest = min(_check_share(s, f"shares[{i}]") for i, s in enumerate(shares))
    needed = MIN_QUOTA_US / smallest - 1e-6  # infinite for a share of a few 1e-308 cores
    if needed > MAX_PERIOD_US:
        raise ValueError(f"a share of {smallest:g} core needs a CFS period of {needed:.10g} us, over the kernel's 1 s "
                         "limit; give the smallest worker at least 0.001 core (raise the CPU budget)")
    return max(MIN_PERIOD_US, math.ceil(needed))


def default_cpu_budget() -> float:
    """Cores for the workers on this machine: the CPUs this process may use minus 0.5, at least 0.5."""
    return max(SERVER_RESERVE, len(os.sched_getaffinity(0)) - SERVER_RESERVE)
