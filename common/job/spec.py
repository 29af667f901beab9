"""The job spec: defined once on the server, handed to every worker at Join."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SAMPLINGS = ("exact", "independent")  # see JobSpec.sampling
MODES = ("bsp", "asp")
OPTIMIZERS = ("sgd", "adam")
WIRE_DTYPES = ("float32", "bfloat16", "float16")
BALANCE_TIMES = ("compute", "busy", "cycle")
"""What the controller balances: each worker's compute time (fetch + forward + backward); its busy
time, which adds the worker's own part of the previous step's push (sending its chunks, and from the
reply's first chunk to the new parameters in its model) but not the wait for the round in between; or
(BSP) its cycle, timed by the server: from the round's replies going out to the worker's next push
fully arrived. The cycle also holds the transport work that the worker cannot time itself (gRPC's
sends and receives in its own threads, under its own CPU quota) and its place in the server's reply
order: the round closes when the last push arrives, so equal cycles are what a round waits for."""
FAST_PATH_CHOICES = ("off", "on", "auto")
"""`ps-server --allreduce`: never the collective fast path, always, or when the workers that start the
job all compute on GPUs of their own (ps.rounds.rendezvous.fast_path_fits). A JobSpec holds the outcome."""
STALENESS_LR = ("off", "inverse", "excess")
"""`ps-server --staleness-lr` (ASP): how an update's learning rate falls with its staleness τ, in versions:
not at all; η_k/τ (Zhang et al. 2016, staleness-aware async SGD; τ = 0 counts as 1); or η_k·min(1, (W−1)/τ)
with W running workers, which only damps an update older than one update of every other worker
(ps.rounds.asp.staleness_factor)."""
ALLREDUCE_ALGORITHMS = ("auto", "ring", "hub")
"""How --allreduce workers reduce: "ring" is torch.distributed.all_reduce (gloo's or NCCL's own
algorithm), "hub" sums at one rank and sends the sum back, "auto" is hub over gloo and ring over NCCL."""


RESUMABLE_FIELDS = {"epochs": "--epochs", "balance": "--balance", "allreduce": "--allreduce", "overlap": "--no-overlap",
                    "sampling": "--sampling", "gradient_norms": "--adaptive-batch"}
"""The fields that may change within one job, with the ps-server flags that set them: how long it
runs (a resume may extend it), and neither the transport (the fast path or not: also --allreduce
auto's trial), what the batch policy balances, who draws the samples, nor whether the fast path
reports gradient norms (for --adaptive-batch), which are no part of the job's math. A resume may
change them (ps/rounds/checkpoint_state.py) and a worker follows (worker/session/replica.py); any
other field differs only in another job (`other_job`)."""


INT32_MAX = 2**31 - 1
"""The wire's batch fields are int32: no batch, global batch or worker count beyond it."""
MAX_NAME_CHARS = 256  # a model or dataset name: a built-in or a package.module:function path
MAX_EPOCHS = 10**6
SEED_LIMIT = 2**62  # seeds stay well inside int64 after the per-worker mixing (seed * 1009 + index)
_JSON_VALUES = (str, int, float, bool, type(None), list, dict)


def _type_problem(name: str, value: Any, annotation: str) -> str | None:
    """What is wrong with the type of field `name` (its annotation as written), None if nothing: a
    spec from the wire may hold any JSON value, and a string where a number belongs must not reach a
    factory (which may do anything with it)."""
    if annotation == "str":
        ok = isinstance(value, str)
    elif annotation == "bool":
        ok = isinstance(value, bool)
    elif annotation == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif annotation == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif annotation.startswith("tuple[int"):
        ok = isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    elif annotation.startswith("dict[str"):
        ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, _JSON_VALUES) for k, v in value.items())
    else:  # a field added without a check here
        return f"{name}: no type check for {annotation}"
    return None if ok else f"{name} must be {annotation.replace('[str, Any]', ' of options')}, got {type(value).__name__} {value!r:.60}"


def busy_time_measured(shards: int) -> bool:
    """Whether workers can time their own part of a push: with one server (a sharded push records no
    timing). On the PS path by the wall clock, on the fast path by CPU time (worker/timing/own_time.py)."""
    return shards <= 1


def cycle_measured(mode: str, allreduce: bool, shards: int) -> bool:
    """Whether the server can time each worker's cycle: BSP rounds (ASP has none) on the PS path with
    one server (a report arrives after the all-reduce, which waits for the slowest peer; with --shards
    the coordinator sees one range of each push)."""
    return mode == "bsp" and not allreduce and busy_time_measured(shards)


def default_balance(mode: str, shards: int) -> str:
    """Busy time where it is measured and pays: BSP, on either path (a round waits for every worker's
    whole push or all-reduce; HL8 1.05-1.21x over compute time, ASP 0.87-0.94x); compute time elsewhere."""
    return "busy" if mode == "bsp" and busy_time_measured(shards) else "compute"


@dataclass(frozen=True)
class JobSpec:
    """What to train and how; validated on construction so a bad spec never starts a job."""

    mode: str = "bsp"
    workers: int = 4
    model: str = "mlp"
    model_options: dict[str, Any] = field(default_factory=dict)
    dataset: str = "digits"
    dataset_options: dict[str, Any] = field(default_factory=dict)
    global_batch: int = 128
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    nesterov: bool = False
    lr_milestones: tuple[int, ...] = ()
    lr_gamma: float = 0.1
    epochs: int = 10
    seed: int = 0
    wire_dtype: str = "float32"
    lr_scaling: bool = True
    allreduce: bool = False  # BSP collective fast path: workers all-reduce, the server coordinates
    allreduce_algorithm: str = "auto"
    balance: str = "compute"
    micro_batch: int = 1  # BSP: batches are whole micro-batches of this many samples, accumulated by the worker
    # BSP on the PS path: workers stream gradient buckets while backward runs (worker/paths/overlap.py);
    # False (ps-server --no-overlap): the whole gradient after backward, the serial path
    overlap: bool = True
    # exact: the server hands each worker its slice of one permutation per epoch, every sample once per
    # epoch (ps/rounds/sampling.py); independent: each worker draws from its own permutation
    sampling: str = "exact"
    # the fast path's round report carries |g_k|² and |g|² (the noise scale of ps-server --adaptive-batch);
    # False (the server has no use for them) spares each worker two reads of the gradient a step. A spec
    # that does not name it asks for them.
    gradient_norms: bool = True

    def __post_init__(self) -> None:
        problems = [p for f in fields(self) if (p := _type_problem(f.name, getattr(self, f.name), str(f.type)))]
        if problems:  # the range checks below assume the types
            raise ValueError("; ".join(problems))
        for kind, name in (("model", self.model), ("dataset", self.dataset)):
            if not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
                problems.append(f"{kind} name must be 1 to {MAX_NAME_CHARS} printable characters, got {name!r:.80}")
        if not 0 <= self.seed < SEED_LIMIT:
            problems.append(f"seed must be in [0, 2^62), got {self.seed}")
        if self.workers > INT32_MAX or self.global_batch > INT32_MAX:
            problems.append(f"workers and global batch must be at most {INT32_MAX}")
        if self.epochs > MAX_EPOCHS:
            problems.append(f"epochs must be at most {MAX_EPOCHS}, got {self.epochs}")
        if self.mode not in MODES:
            problems.append(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.workers < 1:
            problems.append(f"workers must be >= 1, got {self.workers}")
        if self.global_batch < self.workers:
            problems.append(f"global batch {self.global_batch} must be >= the number of workers {self.workers}")
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            problems.append(f"momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            problems.append(f"weight decay must be >= 0, got {self.weight_decay}")
        if self.nesterov and self.momentum == 0:
            problems.append("nesterov needs momentum > 0")
        if self.epochs < 1:
            problems.append(f"epochs must be >= 1, got {self.epochs}")
        if any(m < 1 for m in self.lr_milestones) or list(self.lr_milestones) != sorted(set(self.lr_milestones)):
            problems.append(f"lr milestones must be increasing epochs >= 1, got {list(self.lr_milestones)}")
        if not 0 < self.lr_gamma <= 1:
            problems.append(f"lr gamma must be in (0, 1], got {self.lr_gamma}")
        if self.wire_dtype not in WIRE_DTYPES:
            problems.append(f"wire dtype must be one of {WIRE_DTYPES}, got {self.wire_dtype!r}")
        if self.allreduce and self.mode != "bsp":
            problems.append(f"allreduce is the BSP collective fast path; it cannot run with mode {self.mode!r}")
        if self.allreduce_algorithm not in ALLREDUCE_ALGORITHMS:
            problems.append(f"allreduce algorithm must be one of {ALLREDUCE_ALGORITHMS}, got {self.allreduce_algorithm!r}")
        if self.balance not in BALANCE_TIMES:
            problems.append(f"balance must be one of {BALANCE_TIMES}, got {self.balance!r}")
        if self.micro_batch < 1 or (self.micro_batch > 1 and (self.mode != "bsp" or self.global_batch % self.micro_batch)):
            problems.append(f"micro batch {self.micro_batch} must be >= 1, and above 1 only in bsp with a global batch "
                            f"({self.global_batch}) that it divides")
        if self.sampling not in SAMPLINGS:
            problems.append(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        # the spec does not know --shards: ps-server checks those combinations itself
        if self.balance == "cycle" and not cycle_measured(self.mode, self.allreduce, shards=1):
            problems.append("balance cycle is timed in BSP rounds on the PS path; it cannot run with mode asp or allreduce")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def exact_epochs(self) -> bool:
        """Whether the server hands out the samples (--sampling exact), which it does on the PS path only:
        the --allreduce fast path's workers read a step's reply a step late, after drawing the next batch."""
        return self.sampling == "exact" and not self.allreduce

    def hub_reduce(self, backend: str) -> bool:
        """Whether an --allreduce group over `backend` sums at a hub rank (else torch's all_reduce)."""
        return self.allreduce_algorithm == "hub" or (self.allreduce_algorithm == "auto" and backend != "nccl")

    def lr_at(self, epoch: int) -> float:
        """The epoch-based step schedule: lr * gamma^(milestones passed)."""
        return self.lr * self.lr_gamma ** sum(1 for m in self.lr_milestones if epoch >= m)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """The spec in `text`; ValueError (one line) for anything that is not a valid spec."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"the job spec is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"the job spec must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown job spec fields: {sorted(unknown)}")
        # a spec that names no sampling comes from a server that hands out no slices: each worker samples
        data.setdefault("sampling", "independent")
        milestones = data.get("lr_milestones", [])
        if not isinstance(milestones, list):
            raise ValueError(f"lr_milestones must be a list of epochs, got {milestones!r:.60}")
        data["lr_milestones"] = tuple(milestones)
        return cls(**data)


def other_job(before: JobSpec, after: JobSpec) -> dict[str, tuple[Any, Any]]:
    """The fields outside RESUMABLE_FIELDS in which `after` differs from `before`, {field: (before's,
    after's)}: empty where the two are one job."""
    return {f.name: (getattr(before, f.name), getattr(after, f.name)) for f in fields(JobSpec)
            if f.name not in RESUMABLE_FIELDS and getattr(before, f.name) != getattr(after, f.name)}
