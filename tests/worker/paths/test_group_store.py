"""The worker's side of the fast path's store (worker/paths/group_store.py) against an in-process server:
a gloo process group forms on it and all-reduces, a get waits through the server's long polls, a key
is rewritten by its owner alone, and what goes wrong (a key never set, a replaced generation, another
rank's key) is one CollectiveError."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from tests.fast_path_jobs import TINY
from tests.hostile_server import Scenario, serving
from tests.processes import ENV
from tests.repo import ROOT
from tests.rpc_calls import TIMEOUT
from worker.transport.client import Joined, PSClient
from worker.paths.group_store import MIN_STORE_POLL_S, ServerStore
from worker.paths.process_group import CollectiveError


def joined_pair(server, threads) -> list[tuple[PSClient, Joined]]:
    """Two workers of an --allreduce job, each with its own client, in rank order."""
    clients = [PSClient(server.target) for _ in range(2)]
    futures = [threads.submit(c.join, f"w{i}", 1.0, TIMEOUT) for i, c in enumerate(clients)]
    pairs = [(c, f.result(TIMEOUT)) for c, f in zip(clients, futures)]
    return sorted(pairs, key=lambda pair: pair[1].group.rank)


def store_of(client: PSClient, joined: Joined, timeout_s: float = 20.0) -> ServerStore:
    return ServerStore(lambda call: client.rendezvous(joined.worker_id, call), joined.group.generation,
                       timedelta(seconds=timeout_s))


def test_a_gloo_group_forms_and_reduces_on_the_servers_store(ps_server, threads) -> None:
    server = ps_server(*TINY)
    pairs = joined_pair(server, threads)
    try:
        stores = [store_of(c, j) for c, j in pairs]  # held while the groups live: torch calls back into them

        def rank(r: int) -> torch.Tensor:
            group = dist.ProcessGroupGloo(stores[r], r, 2, timedelta(seconds=20))
            values = torch.full((5,), float(r + 1))
            group.allreduce([values]).wait()  # type: ignore[attr-defined]  # torch's stubs omit the backend's collectives
            return values

        futures = [threads.submit(rank, r) for r in range(2)]
        assert all(torch.equal(f.result(TIMEOUT), torch.full((5,), 3.0)) for f in futures)
        assert stores[0].num_keys() >= 2  # the ranks' addresses, kept at the server
        assert stores[1].add("count", 2) == 2 and stores[0].add("count", 3) == 5
        with pytest.raises(CollectiveError, match="PERMISSION_DENIED: store key 'count' belongs to rank 1"):
            stores[0].compare_set("count", "5", "x")  # a counter takes every rank's add, its creator's rewrite alone
        assert stores[1].compare_set("count", "5", "x") == b"x" and stores[0].get("count") == b"x"
        assert stores[1].delete_key("count") and not stores[0].check(["count"])
    finally:
        for client, _ in pairs:
            client.close()


def test_a_get_waits_for_a_peer_and_gives_up_at_the_timeout(ps_server, threads) -> None:
    server = ps_server(*TINY)
    pairs = joined_pair(server, threads)
    try:
        first, second = (store_of(c, j, timeout_s=1.0) for c, j in pairs)
        waiting = threads.submit(first.get, "late")
        time.sleep(0.3)
        second.set("late", b"here")
        assert waiting.result(TIMEOUT) == b"here"
        start = time.monotonic()
        with pytest.raises(CollectiveError, match="group generation 1: no peer set 'absent' in the group's store within 0:00:01"):
            first.wait(["absent"])
        assert 0.9 < time.monotonic() - start < 5
        client, joined = pairs[0]
        stale = ServerStore(lambda call: client.rendezvous(joined.worker_id, call), joined.group.generation + 1,
                            timedelta(seconds=1))
        with pytest.raises(CollectiveError, match="FAILED_PRECONDITION: group generation 2 is not the current one"):
            stale.set("k", "v")
    finally:
        for client, _ in pairs:
            with contextlib.suppress(Exception):
                client.close()


def test_a_server_that_answers_a_long_poll_at_once_is_not_asked_in_a_busy_loop() -> None:
    """A server answers a get "not set yet" once the call's wait_s has passed: one written from the
    .proto alone that answers it at once is asked again no sooner than MIN_STORE_POLL_S after."""
    group = {"world_size": 2, "rank": 0, "generation": 1, "backend": "gloo"}
    with serving(Scenario(join=group, store={"ready": False})) as (fake, target):
        client = PSClient(target)
        try:
            store = store_of(client, client.join("w", 1.0, TIMEOUT), timeout_s=2.0)
            start = time.monotonic()
            with pytest.raises(CollectiveError, match="no peer set 'k' in the group's store within 0:00:02"):
                store.get("k")
            took = time.monotonic() - start
        finally:
            client.close()
    assert fake.calls.count("Rendezvous") <= 2.0 / MIN_STORE_POLL_S + 2, fake.calls.count("Rendezvous")
    assert 1.9 < took < 5, took


@pytest.mark.parametrize(("value", "said"), [
    (b"", re.escape("CollectiveError: group generation 1's store: the server answers '0//cpu//0/0' with an empty "
                    "value, which no rank of a group sets")),
    (b"1", re.escape("CollectiveError: group generation 1's store: the server answers '0//cpu//0/0' with 1 bytes, "
                     "where this rank set ") + r"\d+" + re.escape(" under the same prefix")),
    (b"\x00" * 8, re.escape("CollectiveError: group generation 1's store: the server answers '0//cpu//0/0' with 8 "
                            "bytes, where this rank set ") + r"\d+" + re.escape(" under the same prefix")),
], ids=["empty", "one-byte", "eight-zeros"])
def test_store_values_gloo_cannot_read_as_addresses_end_the_group_not_the_process(value: bytes, said: str) -> None:
    """A server whose store answers every get with one value: gloo reads it as the ranks' addresses. An
    empty one crashed the process (a segfault), a short one escaped as a MemoryError (std::bad_alloc) or,
    now and then, crashed it too (gloo reads past the value); each is a CollectiveError now, before gloo
    reads it (a value of another length than the one this rank set under the same prefix), which the
    worker recovers from by waiting for the next group."""
    run = subprocess.run([sys.executable, "-m", "tests.hostile_store", value.hex()], capture_output=True, text=True,
                         env=ENV, cwd=ROOT, timeout=120)
    assert run.returncode == 0 and re.fullmatch(said, run.stdout.strip()), (run.returncode, run.stdout,
                                                                            run.stderr[-2000:])
