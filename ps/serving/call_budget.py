"""How many calls a server holds at once, by kind of call and by peer: what keeps one caller, or
callers without the token, from taking the places that the job's workers need.

Pure (no I/O, no gRPC): ps/serving/call_limits.py applies it to every call. Each kind of call has a
budget of its own, so health probes and reflection never take a worker's place and the data plane
never takes the control calls' (heartbeats go on while pushes pile up); within a kind, a bound per
peer address and one in all. A request stream that has sent nothing yet ("silent": a real worker
sends its push's header at once) is the first to go: a call that finds its kind full displaces the
oldest silent one (of its own peer when its peer is full, of any peer when the kind is) rather than
being refused, so streams opened and left empty cannot hold the places of calls that speak.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

DATA, CONTROL, HEALTH, WATCH, REFLECTION = "data", "control", "health", "watch", "reflection"
KINDS = (DATA, CONTROL, HEALTH, WATCH, REFLECTION)
DATA_METHODS = ("Push", "Pull")
"""The methods of the job's services (ParameterServer, ParameterShard) that move parameters."""
JOB_SERVICES = ("/hetero_ps.ParameterServer/", "/hetero_ps.ParameterShard/")


def call_kind(method: str) -> str:
    """The kind of a call, from its full method path ("/hetero_ps.ParameterServer/Push")."""
    if method.startswith(JOB_SERVICES):
        return DATA if method.rsplit("/", 1)[-1] in DATA_METHODS else CONTROL
    if method == "/grpc.health.v1.Health/Watch":
        return WATCH
    if method.startswith("/grpc.health.v1.Health/"):
        return HEALTH
    if method.startswith("/grpc.reflection."):
        return REFLECTION
    return CONTROL


@dataclass(frozen=True)
class Bound:
    """The calls of one kind held at once: from one peer address, and in all."""

    total: int
    per_peer: int

    def __post_init__(self) -> None:
        if not 1 <= self.per_peer <= self.total:
            raise ValueError(f"a call bound needs 1 <= per peer ({self.per_peer}) <= total ({self.total})")


def calls_for_workers(workers: int) -> int:
    """The data-plane (and the control) calls a server of `workers` workers holds at once by default:
    a worker holds a few of each (a push, a pull, a long poll; a heartbeat, a store call), with room."""
    return 16 * workers + 64


HEALTH_BOUND = Bound(total=64, per_peer=16)
"""Check and List answer at once: these bound only a burst."""
WATCH_BOUND = Bound(total=16, per_peer=4)
"""A Watch stays open as long as its caller likes: a handful per address is what monitoring needs."""
REFLECTION_BOUND = Bound(total=8, per_peer=2)
"""grpcurl and the like: one stream per command."""


@dataclass(frozen=True)
class CallBounds:
    """The bound of every kind of call. The job's workers share their addresses on loopback and
    behind NAT, so the data plane's and the control calls' bound per peer is their total unless told."""

    data: Bound
    control: Bound
    health: Bound = HEALTH_BOUND
    watch: Bound = WATCH_BOUND
    reflection: Bound = REFLECTION_BOUND

    @classmethod
    def serving(cls, calls: int, per_peer: int | None = None) -> CallBounds:
        """`calls` data-plane calls and as many control calls at once (--max-concurrent-rpcs), `per_peer`
        of each from one address (--max-rpcs-per-peer; None: `calls`); ValueError naming the flags when
        `per_peer` exceeds `calls`."""
        if per_peer is not None and per_peer > calls:
            raise ValueError(f"--max-rpcs-per-peer {per_peer} exceeds --max-concurrent-rpcs {calls}")
        job = Bound(calls, calls if per_peer is None else per_peer)
        return cls(data=job, control=job)

    def of(self, kind: str) -> Bound:
        bound: Bound = getattr(self, kind)
        return bound


@dataclass(eq=False)
class Ticket:
    """One call held: its peer, its kind, whether it has said anything yet, and what ends it early
    when a newer call displaces it (set by the caller of `admit`)."""

    peer: str
    kind: str
    silent: bool
    on_displaced: Callable[[], object] = field(default=lambda: None, repr=False)
    displaced: bool = False


class Refused(Exception):
    """A call beyond its kind's bound (its peer's or the total) with no silent call to displace."""


class CallBudget:
    """The calls held now, by kind and peer, within `bounds`."""

    def __init__(self, bounds: CallBounds) -> None:
        self.bounds = bounds
        self._held: dict[str, dict[Ticket, None]] = {kind: {} for kind in KINDS}  # in arrival order
        self._per_peer: dict[tuple[str, str], int] = {}

    def admit(self, peer: str, kind: str, silent: bool, on_displaced: Callable[[], object] = lambda: None) -> Ticket:
        """Hold a call of `kind` from `peer` (`silent`: a request stream that has sent nothing yet);
        Refused when its kind is full and no silent call can make room. A call it displaces is released
        and told through its `on_displaced`."""
        bound = self.bounds.of(kind)
        if self._per_peer.get((peer, kind), 0) >= bound.per_peer:
            self._displace(kind, peer, f"{bound.per_peer} {kind} calls from {peer} are held, the most one address may")
        elif len(self._held[kind]) >= bound.total:
            self._displace(kind, None, f"{bound.total} {kind} calls are held, the most this server holds")
        ticket = Ticket(peer, kind, silent, on_displaced)
        self._held[kind][ticket] = None
        self._per_peer[(peer, kind)] = self._per_peer.get((peer, kind), 0) + 1
        return ticket

    def heard(self, ticket: Ticket) -> None:
        """`ticket`'s call sent its first message: it is no longer silent."""
        ticket.silent = False

    def release(self, ticket: Ticket) -> None:
        """`ticket`'s call ended (or was displaced); releasing it again changes nothing."""
        held = self._held[ticket.kind]
        if ticket in held:
            del held[ticket]
            key = (ticket.peer, ticket.kind)
            self._per_peer[key] -= 1
            if not self._per_peer[key]:
                del self._per_peer[key]

    def held(self, kind: str, peer: str | None = None) -> int:
        """The calls of `kind` held now (from `peer`, when given)."""
        if peer is None:
            return len(self._held[kind])
        return self._per_peer.get((peer, kind), 0)

    def _displace(self, kind: str, peer: str | None, full: str) -> None:
        """Release the oldest silent call of `kind` (from `peer`, when given) and tell it; Refused
        (saying `full`) when there is none."""
        victim = next((t for t in self._held[kind] if t.silent and (peer is None or t.peer == peer)), None)
        if victim is None:
            raise Refused(f"{full}; try again later")
        self.release(victim)
        victim.displaced = True
        victim.on_displaced()
