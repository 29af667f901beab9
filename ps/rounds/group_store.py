"""The collective fast path's key-value store (`ps-server --allreduce`): where a group generation's
ranks meet to build their gloo or NCCL process group, served by the ParameterServer's Rendezvous RPC
(ps.rounds.rendezvous checks who may call it), so that no second port and no unauthenticated store exist.

Pure (no I/O; asyncio for the long polls of get and wait): one generation's keys at a time, with the
semantics of torch.distributed's Store. A call is checked whole before it changes anything; bounds on
key length, value size, the number of keys and their total size keep a member from filling the
server's memory. A key belongs to the member that set it first, and each member has its share of the
generation's keys and bytes (ps/rounds/store_owners.py): no member rewrites another's keys or keeps
it from setting its own. A new generation drops the previous one's keys and refuses its waiters
(their group was replaced)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from common.errors import FailedPrecondition, InvalidArgument
from common.transport.messages import STORE_OPS, StoreAnswer, StoreCall
from ps.rounds.store_owners import KeyOwners

ONE_KEY = ("set", "get", "add", "compare_set", "delete")  # the ops on keys[0] alone
WRITES = ("set", "add", "compare_set", "delete")  # the ops that may change a key: its owner's (store_owners.py)
INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class StoreLimits:
    """What one generation's store holds at most, and how long it holds a get or wait. A member owns
    at most `member_keys` keys and `member_bytes` bytes, and no more than its equal share of the
    generation's: a member's keys are its address (gloo), an arrival mark, NCCL's unique ids (rank 0)
    and a barrier's counter, a few hundred bytes."""

    key_chars: int = 512
    value_bytes: int = 64 * 1024  # NCCL's unique id is 128 bytes, gloo's addresses a few hundred
    keys: int = 4096
    total_bytes: int = 16 * 1024 * 1024  # keys and values of the generation together
    member_keys: int = 256
    member_bytes: int = 1024 * 1024
    wait_s: float = 10.0  # a get's or wait's long poll; the worker asks again until its own timeout

    def owners(self, members: int) -> KeyOwners:
        """The owners' record of a generation of `members` members, each with its share."""
        members = max(1, members)
        return KeyOwners(max(1, min(self.member_keys, self.keys // members)),
                         max(1, min(self.member_bytes, self.total_bytes // members)))


class GroupStore:
    """The keys of the current group generation (0: none yet). Driven from one asyncio event loop."""

    def __init__(self, limits: StoreLimits | None = None) -> None:
        self.limits = limits or StoreLimits()
        self.generation = 0
        self._values: dict[str, bytes] = {}
        self._bytes = 0
        self._owners = self.limits.owners(1)
        self._changed = asyncio.Event()  # set (and replaced) at every change: wakes the long polls

    def begin(self, generation: int, members: int = 1) -> None:
        """Start `generation` of `members` members: the previous one's keys are dropped, its waiters refused."""
        self.generation = generation
        self._values, self._bytes = {}, 0
        self._owners = self.limits.owners(members)
        self._wake()

    async def call(self, c: StoreCall, member: int = 0) -> StoreAnswer:
        """Run `c` on the generation's keys as rank `member`; FailedPrecondition when it is not (or no
        longer) the current generation's or the keys are full, InvalidArgument when it is malformed or
        oversize, PermissionDenied when it would rewrite another member's key (nothing changes)."""
        self._check(c)
        if c.op in ("get", "wait"):
            ready = await self._until_set(c.generation, c.keys, min(c.wait_s, self.limits.wait_s))
            return StoreAnswer(ready, self._values[c.keys[0]] if ready and c.op == "get" else b"")
        key = c.keys[0] if c.keys else ""
        if c.op == "set" and self._values.get(key) == c.value:
            return StoreAnswer()  # changes nothing, whoever sets it: torch's barrier may end on several ranks
        if c.op in WRITES:
            self._owners.check_write(c.op, key, member)
        if c.op == "set":
            self._put(key, c.value, member)
            return StoreAnswer()
        if c.op == "add":
            total = _integer(key, self._values.get(key, b"0")) + c.amount
            if not INT64[0] <= total <= INT64[1]:
                raise InvalidArgument(f"adding {c.amount} to store key {key!r} leaves the 64-bit range")
            self._put(key, str(total).encode(), member, counter=True)
            return StoreAnswer(number=total)
        if c.op == "compare_set":
            current = self._values.get(key)
            if current is None and c.expected:
                return StoreAnswer(value=c.expected)
            if current is None or current == c.expected:
                self._put(key, c.value, member)
                return StoreAnswer(value=c.value)
            return StoreAnswer(value=current)
        if c.op == "delete":
            old = self._values.pop(key, None)
            if old is not None:
                self._bytes -= len(key) + len(old)
                self._owners.forget(key, len(key) + len(old))
            return StoreAnswer(old is not None)
        if c.op == "check":
            return StoreAnswer(all(k in self._values for k in c.keys))
        return StoreAnswer(number=len(self._values))  # num_keys

    def _check(self, c: StoreCall) -> None:
        lim = self.limits
        if c.generation != self.generation:
            raise FailedPrecondition(f"group generation {c.generation} is not the current one ({self.generation}): "
                                     "its store is gone")
        if c.op not in STORE_OPS:
            raise InvalidArgument(f"unknown store op {c.op!r}; expected one of {', '.join(STORE_OPS)}")
        if c.op in ONE_KEY and len(c.keys) != 1:
            raise InvalidArgument(f"store op {c.op} takes one key, got {len(c.keys)}")
        if c.op in ("check", "wait") and not 1 <= len(c.keys) <= lim.keys:
            raise InvalidArgument(f"store op {c.op} takes 1 to {lim.keys} keys, got {len(c.keys)}")
        if c.op == "num_keys" and c.keys:
            raise InvalidArgument(f"store op num_keys takes no keys, got {len(c.keys)}")
        for key in c.keys:
            if not 1 <= len(key) <= lim.key_chars:
                raise InvalidArgument(f"a store key has 1 to {lim.key_chars} characters, got {len(key)}")
        for name, value in (("value", c.value), ("expected value", c.expected)):
            if len(value) > lim.value_bytes:
                raise InvalidArgument(f"a store {name} has at most {lim.value_bytes} bytes, got {len(value)}")
        if not (math.isfinite(c.wait_s) and c.wait_s >= 0):
            raise InvalidArgument(f"a store call's wait_s must be finite and >= 0, got {c.wait_s}")

    def _put(self, key: str, value: bytes, member: int, counter: bool = False) -> None:
        """Store `value` under `key` as `member` within the generation's bounds and, for the key's
        owner, within its share (else nothing changes). A counter is the share of the member whose
        add created it; the others' adds change it by a few digits."""
        old = self._values.get(key)
        if old is None and len(self._values) >= self.limits.keys:
            raise FailedPrecondition(f"the group's store holds at most {self.limits.keys} keys")
        added = len(value) - (len(old) if old is not None else -len(key))
        if self._bytes + added > self.limits.total_bytes:
            raise FailedPrecondition(f"the group's store holds at most {self.limits.total_bytes} bytes")
        if self._owners.owner(key, member) == member:
            self._owners.check_room(member, old is None, added)
        self._owners.record(key, member, added, counter)
        self._values[key], self._bytes = value, self._bytes + added
        self._wake()

    async def _until_set(self, generation: int, keys: tuple[str, ...], wait_s: float) -> bool:
        """Whether every one of `keys` is set within `wait_s` seconds; FailedPrecondition once
        `generation` is replaced."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            if self.generation != generation:
                raise FailedPrecondition(f"group generation {generation} was replaced by generation "
                                         f"{self.generation} (a member came or went): form the new group")
            if all(k in self._values for k in keys):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


def _integer(key: str, value: bytes) -> int:
    """The counter a store add works on (a decimal integer, as torch's stores keep it)."""
    try:
        return int(value.decode("ascii"))
    except ValueError:
        raise InvalidArgument(f"store key {key!r} holds no integer to add to") from None
