"""Who owns each key of a group generation's store (ps/rounds/group_store.py) and what each member holds.

A key belongs to the rank that set it first. The others may read it, wait on it and check it, and
add to it when it is a counter (a key an `add` created: torch's store-based barrier has every rank
add to one), never set it to another value, compare_set or delete it: a member cannot rewrite a
peer's address or take its place in the group. What a member owns counts against its share of the
generation's keys and bytes, so one member filling its share leaves the others theirs. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import FailedPrecondition, PermissionDenied


@dataclass
class Owner:
    rank: int
    counter: bool  # created by an add: the others may add to it too


@dataclass
class Holding:
    keys: int = 0
    bytes: int = 0

    def add(self, keys: int = 0, nbytes: int = 0) -> None:
        """`keys` more keys holding `nbytes` more bytes (negative: fewer)."""
        self.keys += keys
        self.bytes += nbytes


class KeyOwners:
    """The owners of one generation's keys; each member owns at most `keys_each` keys of
    `bytes_each` bytes (keys and values) in all."""

    def __init__(self, keys_each: int, bytes_each: int) -> None:
        self.keys_each, self.bytes_each = keys_each, bytes_each
        self._owners: dict[str, Owner] = {}
        self._held: dict[int, Holding] = {}

    def check_write(self, op: str, key: str, member: int) -> None:
        """PermissionDenied unless `member` may `op` (set, add, compare_set, delete) `key`."""
        owner = self._owners.get(key)
        if owner is None or owner.rank == member or (op == "add" and owner.counter):
            return
        may = "add to it, read it or wait on it" if owner.counter else "read it or wait on it"
        raise PermissionDenied(f"store key {key!r} belongs to rank {owner.rank}, which set it first: rank {member} "
                               f"may {may}, not {op.replace('_', ' ')} it")

    def owner(self, key: str, member: int) -> int:
        """The rank that owns `key` (`member` when no one does yet)."""
        owner = self._owners.get(key)
        return member if owner is None else owner.rank

    def check_room(self, member: int, new_key: bool, added_bytes: int) -> None:
        """FailedPrecondition when `member` would own more than its share with one more key
        (`new_key`) and `added_bytes` more bytes."""
        held = self._held.get(member, Holding())
        if new_key and held.keys >= self.keys_each:
            raise FailedPrecondition(f"rank {member} owns {held.keys} keys of the group's store, the most one member may")
        if held.bytes + added_bytes > self.bytes_each:
            raise FailedPrecondition(f"rank {member} would own more than {self.bytes_each} bytes of the group's store, "
                                     "the most one member may")

    def record(self, key: str, member: int, added_bytes: int, counter: bool = False) -> None:
        """`key` was written and holds `added_bytes` more than before; a new key is `member`'s
        (`counter`: an add created it)."""
        owner = self._owners.get(key)
        if owner is None:
            owner = self._owners[key] = Owner(member, counter)
            self._held.setdefault(member, Holding()).add(keys=1)
        self._held.setdefault(owner.rank, Holding()).add(nbytes=added_bytes)

    def forget(self, key: str, size: int) -> None:
        """`key`, of `size` bytes (key and value), was deleted."""
        owner = self._owners.pop(key)
        self._held[owner.rank].add(keys=-1, nbytes=-size)
