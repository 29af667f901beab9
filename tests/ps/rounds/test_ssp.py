"""--staleness-bound (SSP): the pure gate under random speeds, joins, evictions and parking, and the
coordinator holding and releasing real replies (an in-process server)."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.rounds.asp import AspSettings, staleness_factor
from ps.rounds.ssp import EpochCounts, WorkerClocks, epoch_fields
from protos import ps_pb2
from tests.rpc_calls import SECRETS, TIMEOUT, header, push, push_chunks, rand, snapshot, start_cluster


class GateModel:
    """Workers driven through the gate as the coordinator drives them: a computing worker pushes (its
    update applied, its clock ticks), then either reads at once or is held until released."""

    def __init__(self, bound: int) -> None:
        self.clocks = WorkerClocks(bound)
        self.bound = bound
        self.running: set[str] = set()
        self.held: set[str] = set()
        self.applied: list[int] = []  # every applied update's clock staleness
        self.next_id = 0

    def sync(self) -> None:
        self.clocks.sync(self.running)
        self.held &= self.running
        for worker in sorted(self.held):
            if not self.clocks.held(worker):
                self.held.discard(worker)
                self.clocks.read(worker)

    def join(self) -> None:
        worker = f"w{self.next_id}"
        self.next_id += 1
        self.running.add(worker)
        self.sync()
        self.clocks.read(worker)

    def remove(self, index: int) -> None:  # leave, eviction or parking
        if self.running:
            self.running.discard(sorted(self.running)[index % len(self.running)])
            self.sync()

    def push(self, index: int) -> None:
        computing = sorted(self.running - self.held)
        if not computing:
            return
        worker = computing[index % len(computing)]
        self.applied.append(self.clocks.tick(worker))
        self.sync()
        if self.clocks.held(worker):
            self.held.add(worker)
        else:
            self.clocks.read(worker)


EVENTS = st.lists(
    st.tuples(st.sampled_from(["push", "push", "push", "push", "join", "remove"]), st.integers(0, 10)),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(bound=st.integers(0, 4), start=st.integers(1, 5), events=EVENTS)
def test_no_applied_update_is_staler_than_the_bound_and_someone_can_always_go_on(bound: int, start: int, events) -> None:
    model = GateModel(bound)
    for _ in range(start):
        model.join()
    for kind, index in events:
        getattr(model, kind)(*([] if kind == "join" else [index]))
        assert all(s <= bound for s in model.applied), model.applied
        if model.running:  # the slowest running worker is never held: no deadlock
            assert model.running - model.held
            assert all(model.clocks.ahead(w) <= bound for w in model.running - model.held)


def test_bound_zero_is_lock_step() -> None:
    model = GateModel(0)
    for _ in range(3):
        model.join()
    model.push(0)
    assert model.held == {"w0"}
    model.push(0)  # w1: w0 is held, so index 0 of the computing ones is w1
    assert model.held == {"w0", "w1"}
    model.push(0)  # w2 brings the slowest up: all three go on
    assert model.held == set() and set(model.clocks.clocks.values()) == {1}


def test_a_newcomer_starts_at_the_slowest_clock_and_holds_nobody_back_for_the_time_it_was_away() -> None:
    clocks = WorkerClocks(1)
    clocks.sync(["a", "b"])
    for _ in range(3):
        clocks.tick("a")
        clocks.tick("b")
    clocks.sync(["a", "b", "c"])
    assert clocks.clocks == {"a": 3, "b": 3, "c": 3} and not clocks.held("a")
    clocks.sync(["c"])  # a and b gone: c keeps its clock
    clocks.sync([])
    clocks.sync(["d"])
    assert clocks.clocks == {"d": 3}


def test_staleness_lr_factors() -> None:
    assert [staleness_factor("off", t, 4) for t in (0, 1, 9)] == [1.0, 1.0, 1.0]
    assert [staleness_factor("inverse", t, 4) for t in (0, 1, 4)] == [1.0, 1.0, 0.25]
    assert [staleness_factor("excess", t, 4) for t in (0, 3, 6)] == [1.0, 1.0, 0.5]
    with pytest.raises(ValueError, match="--staleness-lr must be one of off, inverse, excess"):
        AspSettings(staleness_lr="sqrt")
    with pytest.raises(ValueError, match="--staleness-bound must be >= 0"):
        AspSettings(staleness_bound=-1)


def test_epoch_fields_per_worker() -> None:
    a, b = EpochCounts(), EpochCounts()
    a.update(2, 1)
    a.update(4, 0)
    b.waited(0.25)
    assert epoch_fields({"a": a, "b": b}) == {
        "staleness_mean": {"a": 3.0, "b": 0.0},
        "staleness_max": {"a": 4, "b": 0},
        "clock_staleness_max": {"a": 1, "b": 0},
        "ssp_waits": {"a": 0, "b": 1},
        "ssp_wait_s": {"a": 0.0, "b": 0.25},
    }


# --------------------------------------------------------------- the coordinator
def test_a_worker_ahead_waits_for_the_slowest_and_both_replies_hold_both_updates(ps_server, threads) -> None:
    c = start_cluster(ps_server, threads, "--mode", "asp", "--global-batch", "32", "--staleness-bound", "0")
    da, db = rand(c.numel, seed=1), rand(c.numel, seed=2)
    pending = threads.submit(push, c.server.stub(), push_chunks(header(c.ids["a"], da, version=0), da))
    deadline = time.monotonic() + TIMEOUT
    while snapshot(c.server)["version"] < 1:  # a's update applied: its reply is held
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.2)
    assert not pending.done()
    hb, params_b = push(c.stub, push_chunks(header(c.ids["b"], db, version=0), db))
    ha, params_a = pending.result(TIMEOUT)
    expected = c.theta0 + da + db
    assert ha.version == hb.version == 2
    torch.testing.assert_close(params_a, expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(params_b, expected, rtol=0, atol=1e-7)
    counts = c.server.call(lambda: {m.name: m.asp for m in c.server.coordinator.members.values()})
    assert (counts["a"].waits, counts["b"].waits) == (1, 0)
    assert (counts["a"].clock_staleness_max, counts["b"].staleness_max) == (0, 1)


def test_an_evicted_slow_worker_releases_the_waiting_one_within_the_eviction_time(ps_server, threads) -> None:
    evict_after = 1.0
    c = start_cluster(ps_server, threads, "--mode", "asp", "--global-batch", "32", "--staleness-bound", "0",
                      "--evict-after", str(evict_after))
    coordinator = c.server.coordinator
    reaper = c.server.call(lambda: asyncio.get_running_loop().create_task(coordinator.reap_forever(coordinator.heartbeat_interval)))
    da = rand(c.numel, seed=1)
    started = time.monotonic()
    pending = threads.submit(push, c.server.stub(), push_chunks(header(c.ids["a"], da, version=0), da))
    beat = ps_pb2.HeartbeatRequest(worker_id=c.ids["a"], secret=SECRETS[c.ids["a"]])
    while not pending.done():  # a beats while it waits, as a worker's heartbeat thread does; b is silent
        c.stub.Heartbeat(beat, timeout=TIMEOUT)
        assert time.monotonic() - started < TIMEOUT
        time.sleep(0.1)
    ha, _ = pending.result()
    waited = time.monotonic() - started
    assert ha.version == 1 and not ha.done
    assert waited < evict_after + 1.5, waited  # the eviction sweep runs every evict_after/4
    assert [m.name for m in c.server.call(lambda: list(coordinator.members.values()))] == ["a"]
    c.server.call(reaper.cancel)


def test_a_parked_worker_holds_nobody_back(ps_server, threads) -> None:
    c = start_cluster(ps_server, threads, "--mode", "asp", "--global-batch", "32", "--staleness-bound", "0")
    coordinator = c.server.coordinator
    c.server.call(lambda: coordinator.policy.plan())  # the plan exists
    real_plan = coordinator.policy.plan

    def parked_b() -> dict[str, int]:
        plan = dict(real_plan())
        plan["b"] = 0
        return plan

    coordinator.policy.plan = parked_b  # the batch policy parks b (batch 0 in the plan)
    try:
        da = rand(c.numel, seed=1)
        for version in range(3):  # a goes on alone, never held
            h, _ = push(c.stub, push_chunks(header(c.ids["a"], da, version=version), da))
            assert h.version == version + 1
    finally:
        coordinator.policy.plan = real_plan
