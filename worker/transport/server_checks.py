"""What a worker checks of what its server tells it, before acting on it.

A worker trusts its server for numbers (parameters, plans, batch sizes), never for code, and even
the numbers only within bounds it can live with: a batch it can hold, a reply that fills its model
exactly, finite parameters, a heartbeat interval that neither spins nor lets it be evicted, other
servers only on its server's own host unless it allowed them. Each check raises UntrustedReply
with one line; the worker then leaves the job. Pure functions: worker/transport/client.py and
worker/runtime.py call them where they decode a reply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from common.job.spec import INT32_MAX, JobSpec, other_job
from common.ops import address
from common.transport.layout import Layout
from common.transport.messages import GroupInfo, JoinInfo, StepHeader
from worker.flags import ALLOW_SHARD_HOST_FLAG

MIN_HEARTBEAT_S = 0.01
"""The shortest heartbeat interval a worker takes (the server sends a quarter of --evict-after, at
most 1 s): anything shorter is a busy loop of RPCs."""
MAX_HEARTBEAT_S = 3600.0
MAX_ID_CHARS = 256
"""The longest worker id or secret a worker takes (the project's server: a name of at most 128
characters and 9 more; a secret of 64 hex digits): each travels with every later call."""
BACKENDS = ("gloo", "nccl")
MAX_REFUSED_STEPS = 8
"""ASP: the most local steps in a row a worker drops because they could overflow fp32 before it
leaves: at the learning rate its server tells it, no step it could push would be taken."""
LR_TOLERANCE = 1e-9
"""An ASP learning rate may exceed the spec's schedule by this fraction (the rounding of eta*b_k/B)."""


class UntrustedReply(ValueError):
    """The server told this worker something it does not take (a spec it cannot parse, a batch
    beyond its bounds, a short or non-finite reply, ...): the worker leaves instead of acting on it."""


def job_spec(text: str) -> JobSpec:
    """The job spec in the server's reply, every field type- and range-checked (JobSpec)."""
    try:
        return JobSpec.from_json(text)
    except (TypeError, ValueError) as exc:
        raise UntrustedReply(f"the server's job spec is refused: {exc}") from None


def same_job(held: JobSpec, told: JobSpec, reply: str) -> None:
    """The spec in the server's `reply` is the job it gave this worker before (`held`: at its Status,
    or its last Join): they may differ only where a job may change (common.job.spec.RESUMABLE_FIELDS:
    a resume's --epochs, --balance, ...). Any other difference is a server that contradicts itself;
    the worker leaves rather than train a model built for one job on another's settings."""
    if differs := other_job(held, told):
        changes = ", ".join(f"{name} {old!r:.60} -> {new!r:.60}" for name, (old, new) in differs.items())
        raise UntrustedReply(f"the server's {reply} names another job than the one it gave this worker before "
                             f"({changes})")


def heartbeat_interval(seconds: float) -> float:
    """The server's heartbeat interval, if within [MIN_HEARTBEAT_S, MAX_HEARTBEAT_S]."""
    if not (math.isfinite(seconds) and MIN_HEARTBEAT_S <= seconds <= MAX_HEARTBEAT_S):
        raise UntrustedReply(f"the server's heartbeat interval {seconds:g} s is outside [{MIN_HEARTBEAT_S:g}, "
                             f"{MAX_HEARTBEAT_S:g}] s")
    return seconds


def joined(info: JoinInfo) -> None:
    """A Join reply's own fields: an id and a secret of 1 to MAX_ID_CHARS printable characters (they
    are sent back with every call, and the id is printed), counters and join order >= 0, a layout of
    one value or more, a group as in every plan (`group`)."""
    for what, text in (("worker id", info.worker_id), ("secret", info.secret)):
        if not (0 < len(text) <= MAX_ID_CHARS and text.isprintable()):
            raise UntrustedReply(f"the server's {what} {text!r:.80} is not 1 to {MAX_ID_CHARS} printable characters")
    if min(info.round, info.version, info.epoch, info.index) < 0:
        raise UntrustedReply(f"the server's Join reply has a negative round, version, epoch or join order "
                             f"({info.round}, {info.version}, {info.epoch}, {info.index})")
    layout(info.layout)
    group(info.group, ranked=False)


def layout(entries: Layout) -> None:
    """The parameter layout: at least one value, no negative dimension."""
    bad = next((e for e in entries.entries if any(d < 0 for d in e.shape)), None)
    if bad is not None:
        raise UntrustedReply(f"the server's layout gives {bad.name[:80]!r} the shape {list(bad.shape)}")
    if entries.numel < 1:
        raise UntrustedReply("the server's layout holds no values")


def num_params(said: int, entries: Layout) -> None:
    """A JoinReply's num_params is its layout's number of values: a reply that gives two sizes of the
    parameters names two models, and the values that later fill one would not fit the other (the layout
    is the model the worker builds: worker/session/replica.py)."""
    if said != entries.numel:
        raise UntrustedReply(f"the server's Join reply says num_params {said}, where its layout holds "
                             f"{entries.numel} values")


def group(g: GroupInfo, ranked: bool = True) -> None:
    """--allreduce: a group generation >= 0 and, where the worker has a group, a backend it can form
    the group over (gloo or nccl) and its ranks inside it; where not `ranked` (a Join's), the rank
    may be -1 too: not in the generation yet."""
    if g.generation < 0 or g.world_size < 0:
        raise UntrustedReply(f"the server's group has a negative generation or size ({g.generation}, {g.world_size})")
    if not g.world_size:
        return
    if g.backend not in BACKENDS:
        raise UntrustedReply(f"the server's group backend {g.backend[:40]!r} is not one of {', '.join(BACKENDS)}")
    if ranked and not (0 <= g.rank < g.world_size and 0 <= g.hub_rank < g.world_size):
        raise UntrustedReply(f"the server's group ranks (rank {g.rank}, hub {g.hub_rank}) are outside its size "
                             f"{g.world_size}")
    if not ranked and not -1 <= g.rank < g.world_size:
        raise UntrustedReply(f"the server's group rank {g.rank} is neither -1 (not in the generation yet) nor inside "
                             f"its size {g.world_size}")


def batch_size(batch: int, global_batch: int, max_batch: int, micro_batch: int = 1, samples: int = 0) -> int:
    """A batch the server plans for this worker: in [0, global_batch] (0: parked), within this
    worker's own `max_batch` (0: no bound; with micro-batches it bounds one micro-batch, not the
    batch), a whole number of micro-batches, and at most the training set's `samples` (0: not known
    yet; a larger batch would train a sample twice in one step, and a server refuses a global batch
    above it)."""
    if not 0 <= global_batch <= INT32_MAX:
        raise UntrustedReply(f"the server's global batch {global_batch} is outside [0, {INT32_MAX}]")
    if not 0 <= batch <= global_batch:
        raise UntrustedReply(f"the server planned a batch of {batch}, outside [0, the global batch {global_batch}]")
    if samples and batch > samples:
        raise UntrustedReply(f"the server planned a batch of {batch}, above the training set's {samples} samples")
    if micro_batch <= 1 and max_batch > 0 and batch > max_batch:
        raise UntrustedReply(f"the server planned a batch of {batch}, above this worker's --max-batch {max_batch}")
    if micro_batch > 1 and batch % micro_batch:
        raise UntrustedReply(f"the server planned a batch of {batch}, not a multiple of the job's micro-batch {micro_batch}")
    return batch


def step_plan(plan: StepHeader, max_batch: int, micro_batch: int = 1, samples: int = 0) -> None:
    """A plan's numbers: counters >= 0, a finite learning rate >= 0, a batch within bounds
    (batch_size) unless the job is done (nothing more is drawn), a rank inside its group, a path it
    can switch to (--allreduce auto's trial)."""
    if min(plan.round, plan.version, plan.epoch) < 0:
        raise UntrustedReply(f"the server's plan has a negative round, version or epoch "
                             f"({plan.round}, {plan.version}, {plan.epoch})")
    if not (math.isfinite(plan.lr) and plan.lr >= 0):
        raise UntrustedReply(f"the server's learning rate {plan.lr} is not a finite number >= 0")
    group(plan.group)
    if plan.path not in ("", "ps", "allreduce") or (plan.path == "allreduce" and not plan.group.world_size):
        raise UntrustedReply(f"the server's path {plan.path[:40]!r} is not ps, or allreduce with a group")
    if not plan.done:
        batch_size(plan.batch_size, plan.global_batch, max_batch, micro_batch, samples)


def plan_epoch(plan: StepHeader, spec: JobSpec) -> None:
    """A plan's epoch is one of the job's (0 to epochs - 1), or its end (epochs) in the plan that ends
    it: the server finishes the job as its last epoch ends. Under --sampling exact a slice's epochs
    bound it too (worker.data.slices); without slices nothing else would, and the epoch picks the
    learning rate of the spec's schedule (asp_lr, the fast path's)."""
    if plan.done and plan.epoch > spec.epochs:
        raise UntrustedReply(f"the server's plan ends the job at epoch {plan.epoch}, past its end at epoch {spec.epochs}")
    if not plan.done and plan.epoch >= spec.epochs:
        raise UntrustedReply(f"the server's plan is at epoch {plan.epoch}, past the job's last epoch {spec.epochs - 1}")


def join_epoch(epoch: int, spec: JobSpec) -> None:
    """A Join reply's epoch is one of the job's (0 to epochs - 1), as a plan's that does not end the
    job (`plan_epoch`): a server answers no Join once its job has ended, and the worker's first
    step, its learning rate and (--sampling exact) the epochs its slices may name start there."""
    if epoch >= spec.epochs:
        raise UntrustedReply(f"the server's Join reply is at epoch {epoch}, past the job's last epoch {spec.epochs - 1}")


def asp_lr(plan: StepHeader, spec: JobSpec) -> None:
    """ASP: the learning rate a worker steps at is eta_k = eta * b_k / B at the schedule's epoch (or
    eta itself without --lr-scaling), never above the spec's schedule: a larger one would take steps the
    job never set (one that overflows fp32 would drop every batch)."""
    if spec.mode != "asp" or plan.done:
        return
    most = spec.lr_at(plan.epoch)
    if plan.lr > most * (1 + LR_TOLERANCE):
        raise UntrustedReply(f"the server's learning rate {plan.lr:g} is above the job's {most:g} at epoch {plan.epoch}")


def group_lr(plan: StepHeader, spec: JobSpec, samples: int) -> None:
    """The fast path (a plan that names a group): the group steps its own copy at the plan's learning
    rate, the job's schedule at its epoch times --adaptive-batch's factor for the B in force, which is
    at most max(1, B / B0) (linear, sqrt and AdaScale alike) with B at most the training set's
    `samples` (0: not known) and B0 the spec's global batch. A larger one is no rate the job set."""
    if plan.done or not plan.group.world_size:
        return
    most = spec.lr_at(plan.epoch) * max(1.0, (samples or spec.global_batch) / spec.global_batch)
    if plan.lr > most * (1 + LR_TOLERANCE):
        raise UntrustedReply(f"the server's learning rate {plan.lr:g} for its group is above the job's {most:g} at "
                             f"epoch {plan.epoch} (its schedule, scaled up to a global batch of {samples or spec.global_batch})")


def local_steps(refused_in_a_row: int, lr: float) -> None:
    """ASP: a worker whose last MAX_REFUSED_STEPS local steps could each overflow fp32 at the server's
    learning rate leaves instead of dropping batch after batch (a job spec's own lr can be that large)."""
    if refused_in_a_row >= MAX_REFUSED_STEPS:
        raise UntrustedReply(f"{refused_in_a_row} local steps in a row could overflow fp32 at the server's learning "
                             f"rate {lr:g}")


def probe_step(plan: StepHeader, spec: JobSpec) -> None:
    """A probe (ps.rounds.probation) is a BSP step of a batch, in no group, asking for no snapshot and
    no switch of path: the probationer pushes its whole gradient to its server and nothing else."""
    if not plan.probe or plan.done:
        return
    if spec.mode != "bsp":
        raise UntrustedReply(f"the server asks for a probe step in a {spec.mode.upper()} job; probes are BSP's")
    if plan.batch_size == 0:
        raise UntrustedReply("the server asks for a probe step of batch 0")
    if plan.group.world_size or plan.snapshot_requested or plan.path:
        raise UntrustedReply("the server asks for a probe step and names a group, a snapshot or a path with it; a "
                             "probe is pushed whole to the server alone")


def reply_length(num_values: int, expected: int) -> None:
    """A reply that carries parameters carries exactly the range it is for (0: a header alone)."""
    if num_values not in (0, expected):
        raise UntrustedReply(f"the server's reply carries {num_values} values, not the {expected} of its range")


def header_place(index: int, has_header: bool) -> None:
    """A reply's header is on its first chunk (`index` 0) and on no other."""
    if has_header != (index == 0):
        raise UntrustedReply("the server's reply starts without its header" if index == 0 else
                             f"the server's reply carries a second header, on chunk {index}")


def values_sent(num_values: int, done: bool, required: bool, shard: bool = False) -> None:
    """A reply that must carry values (a Pull of the parameters) carries some, unless it ends the job:
    a header alone would leave the worker training on a model the server never handed it. A `shard`
    server's reply ends no job (its coordinator's does; ps/shards/core.py says done False): its range
    comes whatever its header says."""
    if required and not num_values and shard and done:
        raise UntrustedReply("a shard server's reply carries no values (a shard ends no job; the server's reply does)")
    if required and not num_values and not done:
        raise UntrustedReply("the server's reply carries no values, where this worker asked for its parameters")


def payload(optimizer_state: bool, asked_state: bool) -> None:
    """A reply's values are what was asked for: the optimizer's state (a Pull with optimizer_state),
    else parameters; a header that says otherwise is not loaded into either."""
    if optimizer_state != asked_state:
        said, asked = ("the optimizer's state", "parameters") if optimizer_state else ("parameters", "the optimizer's state")
        raise UntrustedReply(f"the server's reply says it carries {said}, where this worker asked for {asked}")


def finite_values(values: torch.Tensor, what: str = "parameters") -> None:
    """Every value finite: NaN or infinity from a server would poison the model. Checked with numpy on
    the CPU: the reply's receiving threads run beside the training step, and torch's kernels there
    would take the process's whole thread pool (its intra-op setting is the main thread's)."""
    finite = np.isfinite(values.detach().numpy()).all() if values.device.type == "cpu" else torch.isfinite(values).all()
    if values.numel() and not bool(finite):
        raise UntrustedReply(f"the server's {what} hold NaN or Inf values")


def shard_addresses(addresses: Sequence[str]) -> None:
    """--shards: each shard's address as the server advertises it is HOST:PORT with a port in [1, 65535]
    (the host may be "" or a wildcard: the server's own). gRPC takes others as another port than the
    one named (":" alone is 443, 99999 is 34463), where this worker would send its credentials."""
    for entry in addresses:
        try:
            address.split(entry, empty_host=True)
        except ValueError as exc:
            raise UntrustedReply(f"the server's shard address {entry[:80]!r} is not HOST:PORT with a port in "
                                 f"[1, 65535] ({str(exc)[:160]})") from None


def shard_ranges(ranges: Sequence[tuple[str, int, int]], numel: int, server_target: str,
                 allowed_hosts: Sequence[str] = ()) -> None:
    """--shards: the ranges other servers hold tile [its start, `numel`) in order, and each server
    is on the host this worker reached its server at, or one it allowed (`allowed_hosts`): the
    worker sends them its token and its secret."""
    server_host = address.host_of(server_target)
    expected_start = ranges[0][1] if ranges else numel
    if not 0 < expected_start <= numel:
        raise UntrustedReply(f"the server's first shard range starts at {expected_start}, outside (0, {numel}]")
    for shard, start, stop in ranges:
        if start != expected_start or not start < stop <= numel:
            raise UntrustedReply(f"the server's shard ranges do not tile its {numel} values ({shard}: [{start}, {stop}))")
        expected_start = stop
        host = address.host_of(shard)
        if host != server_host and host not in allowed_hosts:
            raise UntrustedReply(f"the server names a shard at {shard}, not on its own host {server_host}; this "
                                 f"worker sends its credentials there only with {ALLOW_SHARD_HOST_FLAG} {host}")
    if expected_start != numel:
        raise UntrustedReply(f"the server's shard ranges end at {expected_start}, not at its {numel} values")
