"""The fast path's store at the server (ps/rounds/group_store.py, pure): torch's Store semantics for
one generation, long polls that wake on a set, a new generation that drops the keys and refuses the
old one's waiters, and bounds that refuse a call whole."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from common.transport.messages import StoreCall
from ps.rounds.group_store import GroupStore, StoreLimits
from ps.rounds.rendezvous import Rendezvous


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())  # type: ignore[arg-type]


def at(generation: int, op: str, *keys: str, **fields: Any) -> StoreCall:
    return StoreCall(generation, op, keys, **fields)


def contents(store: GroupStore) -> tuple[int, dict[str, bytes], int]:
    return store.generation, dict(store._values), store._bytes


def test_the_ops_follow_torchs_store() -> None:
    async def body() -> None:
        store = GroupStore()
        store.begin(1)
        assert (await store.call(at(1, "set", "a", value=b"x"))).ready
        assert (await store.call(at(1, "get", "a"))).value == b"x"
        assert (await store.call(at(1, "add", "n", amount=5))).number == 5
        assert (await store.call(at(1, "add", "n", amount=-7))).number == -2
        assert (await store.call(at(1, "get", "n"))).value == b"-2"
        assert (await store.call(at(1, "check", "a", "n"))).ready
        assert not (await store.call(at(1, "check", "a", "zz"))).ready
        assert (await store.call(at(1, "wait", "a", "n"))).ready
        assert (await store.call(at(1, "num_keys"))).number == 2
        # compare_set as TCPStore does it: absent and nothing expected sets it; absent and something
        # expected answers the expected value; present answers what it holds after the swap (or not)
        assert (await store.call(at(1, "compare_set", "c", expected=b"q", value=b"v"))).value == b"q"
        assert (await store.call(at(1, "compare_set", "c", value=b"v"))).value == b"v"
        assert (await store.call(at(1, "compare_set", "c", expected=b"w", value=b"u"))).value == b"v"
        assert (await store.call(at(1, "compare_set", "c", expected=b"v", value=b"u"))).value == b"u"
        assert (await store.call(at(1, "delete", "c"))).ready
        assert not (await store.call(at(1, "delete", "c"))).ready
        assert contents(store) == (1, {"a": b"x", "n": b"-2"}, len("a") + 1 + len("n") + 2)

    run(body)


def test_a_get_waits_for_its_key_and_a_wait_says_when_it_ran_out() -> None:
    async def body() -> None:
        store = GroupStore()
        store.begin(1)
        waiting = asyncio.ensure_future(store.call(at(1, "get", "k", wait_s=5.0)))
        both = asyncio.ensure_future(store.call(at(1, "wait", "k", "j", wait_s=5.0)))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await store.call(at(1, "set", "k", value=b"1"))
        assert (await asyncio.wait_for(waiting, 1)).value == b"1"
        await asyncio.sleep(0.05)
        assert not both.done()
        await store.call(at(1, "set", "j", value=b"2"))
        assert (await asyncio.wait_for(both, 1)).ready
        missing = await store.call(at(1, "get", "absent", wait_s=0.05))
        assert (missing.ready, missing.value) == (False, b"")
        assert not (await store.call(at(1, "wait", "absent"))).ready  # wait_s 0: at once

    run(body)


def test_the_long_poll_is_capped_by_the_server() -> None:
    async def body() -> None:
        store = GroupStore(StoreLimits(wait_s=0.05))
        store.begin(1)
        assert not (await asyncio.wait_for(store.call(at(1, "wait", "k", wait_s=3600.0)), 2)).ready

    run(body)


def test_a_new_generation_drops_the_keys_and_refuses_the_old_waiters() -> None:
    async def body() -> None:
        store = GroupStore()
        store.begin(1)
        await store.call(at(1, "set", "a", value=b"x"))
        waiting = asyncio.ensure_future(store.call(at(1, "get", "b", wait_s=5.0)))
        await asyncio.sleep(0.05)
        store.begin(2)
        with pytest.raises(FailedPrecondition, match="group generation 1 was replaced by generation 2"):
            await asyncio.wait_for(waiting, 1)
        assert contents(store) == (2, {}, 0)
        with pytest.raises(FailedPrecondition, match=r"group generation 1 is not the current one \(2\)"):
            await store.call(at(1, "set", "a", value=b"x"))
        assert contents(store) == (2, {}, 0)

    run(body)


@pytest.mark.parametrize(
    ("call", "error", "needle"),
    [
        (at(1, "set", "k" * 513, value=b"x"), InvalidArgument, "a store key has 1 to 512 characters, got 513"),
        (at(1, "set", "", value=b"x"), InvalidArgument, "a store key has 1 to 512 characters, got 0"),
        (at(1, "set", "k", value=b"x" * (64 * 1024 + 1)), InvalidArgument, "a store value has at most 65536 bytes"),
        (at(1, "compare_set", "k", expected=b"x" * (64 * 1024 + 1)), InvalidArgument, "a store expected value has at most"),
        (at(1, "set", "a", "b", value=b"x"), InvalidArgument, "store op set takes one key, got 2"),
        (at(1, "check"), InvalidArgument, "store op check takes 1 to 3 keys, got 0"),
        (at(1, "num_keys", "a"), InvalidArgument, "store op num_keys takes no keys"),
        (at(1, "unknown (9)", "a"), InvalidArgument, "unknown store op 'unknown (9)'"),
        (at(1, "wait", "a", wait_s=float("nan")), InvalidArgument, "wait_s must be finite and >= 0"),
        (at(1, "wait", "a", wait_s=-1.0), InvalidArgument, "wait_s must be finite and >= 0"),
        (at(1, "add", "text", amount=1), InvalidArgument, "store key 'text' holds no integer to add to"),
        (at(1, "add", "n", amount=2**63 - 1), InvalidArgument, "leaves the 64-bit range"),
        (at(2, "set", "k", value=b"x"), FailedPrecondition, "group generation 2 is not the current one (1)"),
        (at(1, "set", "new", value=b"x"), FailedPrecondition, "the group's store holds at most 3 keys"),
        (at(1, "set", "text", value=b"y" * 100), FailedPrecondition, "the group's store holds at most 100 bytes"),
    ],
)
def test_a_bad_or_oversize_call_is_refused_and_changes_nothing(call: StoreCall, error: type, needle: str) -> None:
    async def body() -> None:
        store = GroupStore(StoreLimits(keys=3, total_bytes=100))
        store.begin(1)
        for key, value in (("text", b"abc"), ("n", b"7"), ("k", b"v")):
            await store.call(at(1, "set", key, value=value))
        before = contents(store)
        with pytest.raises(error) as info:
            await store.call(call)
        assert needle in str(info.value)
        assert contents(store) == before

    run(body)


def test_only_a_rank_of_the_current_generation_reaches_its_store() -> None:
    async def body() -> None:
        rendezvous = Rendezvous()
        group = rendezvous.regroup(["a", "b"], {})
        assert group is not None and rendezvous.store.generation == group.generation == 1
        await rendezvous.call("a", at(1, "set", "k", value=b"1"))
        with pytest.raises(PermissionDenied, match="worker 'c' holds no rank in group generation 1"):
            await rendezvous.call("c", at(1, "set", "k", value=b"2"))
        assert (await rendezvous.call("b", at(1, "get", "k"))).value == b"1"
        rendezvous.regroup(["b"], {})
        with pytest.raises(FailedPrecondition, match="group generation 1 is not the current one"):
            await rendezvous.call("a", at(1, "get", "k"))
        assert rendezvous.regroup(["b"], {}) is None and rendezvous.store.generation == 2  # unchanged: same generation

    run(body)


def test_a_key_belongs_to_the_member_that_set_it_first() -> None:
    async def body() -> None:
        store = GroupStore()
        store.begin(1, members=2)
        await store.call(at(1, "set", "addr/0", value=b"10.0.0.1:5000"), member=0)
        before = contents(store)
        for call in (at(1, "set", "addr/0", value=b"10.6.6.6:6666"), at(1, "compare_set", "addr/0", value=b"x"),
                     at(1, "compare_set", "addr/0", expected=b"10.0.0.1:5000", value=b"x"), at(1, "delete", "addr/0"),
                     at(1, "add", "addr/0", amount=1)):
            with pytest.raises(PermissionDenied, match=f"store key 'addr/0' belongs to rank 0, which set it first: rank 1 "
                                                       f"may read it or wait on it, not {call.op.replace('_', ' ')} it"):
                await store.call(call, member=1)
            assert contents(store) == before
        assert (await store.call(at(1, "get", "addr/0"), member=1)).value == b"10.0.0.1:5000"
        assert (await store.call(at(1, "wait", "addr/0"), member=1)).ready
        assert (await store.call(at(1, "check", "addr/0"), member=1)).ready
        await store.call(at(1, "set", "addr/0", value=b"10.0.0.1:5000"), member=1)  # what it holds: changes nothing
        assert contents(store) == before
        await store.call(at(1, "set", "addr/0", value=b"10.0.0.1:5001"), member=0)  # its owner may
        assert (await store.call(at(1, "delete", "addr/0"), member=0)).ready
        await store.call(at(1, "set", "addr/0", value=b"mine"), member=1)  # gone: the next to set it owns it
        with pytest.raises(PermissionDenied, match="belongs to rank 1"):
            await store.call(at(1, "set", "addr/0", value=b"x"), member=0)

    run(body)


def test_every_member_adds_to_a_counter_and_only_its_creator_rewrites_it() -> None:
    async def body() -> None:
        store = GroupStore()
        store.begin(1, members=3)
        key = "store_based_barrier_key:1"  # torch's barrier: every rank adds 1, then reads it with add 0
        assert [(await store.call(at(1, "add", key, amount=1), member=m)).number for m in (2, 0, 1)] == [1, 2, 3]
        assert (await store.call(at(1, "add", key, amount=0), member=0)).number == 3
        for m in (0, 1, 2):  # every rank may see the count complete and set the same key
            await store.call(at(1, "set", f"{key}:last_worker", value=b"1"), member=m)
        with pytest.raises(PermissionDenied, match="belongs to rank 2, which set it first: rank 0 may add to it, read "
                                                   "it or wait on it, not delete it"):
            await store.call(at(1, "delete", key), member=0)
        with pytest.raises(PermissionDenied, match="not set it"):
            await store.call(at(1, "set", key, value=b"0"), member=1)
        assert (await store.call(at(1, "delete", key), member=2)).ready

    run(body)


def test_a_member_that_fills_its_share_leaves_the_others_theirs() -> None:
    async def body() -> None:
        store = GroupStore(StoreLimits(keys=8, total_bytes=80))
        store.begin(1, members=2)  # each member: 4 keys, 40 bytes
        for i in range(4):
            await store.call(at(1, "set", f"a{i}", value=b"x"), member=0)
        with pytest.raises(FailedPrecondition, match="rank 0 owns 4 keys of the group's store, the most one member may"):
            await store.call(at(1, "set", "a4", value=b"x"), member=0)
        with pytest.raises(FailedPrecondition, match="rank 0 would own more than 40 bytes of the group's store"):
            await store.call(at(1, "set", "a0", value=b"x" * 35), member=0)
        for i in range(4):
            await store.call(at(1, "set", f"b{i}", value=b"y" * 6), member=1)
        assert (await store.call(at(1, "num_keys"), member=1)).number == 8
        store.begin(2, members=8)  # a larger group: smaller shares, one key each at least
        await store.call(at(2, "set", "c", value=b"z"), member=5)
        with pytest.raises(FailedPrecondition, match="rank 5 owns 1 keys"):
            await store.call(at(2, "set", "d", value=b"z"), member=5)
        await store.call(at(2, "set", "d", value=b"z"), member=6)

    run(body)


def test_the_shares_fit_what_gloo_nccl_and_torchs_barrier_set() -> None:
    """Each rank's keys as torch 2 and this worker set them (worker/paths/collective.py's arrival, gloo's
    address, NCCL's unique ids from rank 0, the barrier), for the largest group the default limits
    give every member ten keys."""
    async def body() -> None:
        members = StoreLimits().keys // 10
        store = GroupStore()
        store.begin(1, members=members)
        for rank in range(members):
            await store.call(at(1, "set", f"arrived/{rank}", value=b"1"), member=rank)
            await store.call(at(1, "set", f"0//cpu//0/{rank}", value=b"a" * 300), member=rank)
            await store.call(at(1, "add", "store_based_barrier_key:1", amount=1), member=rank)
        for comm in range(4):
            await store.call(at(1, "set", str(comm), value=b"n" * 128), member=0)
        await store.call(at(1, "set", "store_based_barrier_key:1:last_worker", value=b"1"), member=members - 1)

    run(body)
