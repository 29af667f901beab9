"""Hostile protocol sequences: a generated peer joins, pushes, pulls, heartbeats and leaves in any order,
with malformed and mistimed calls, under BSP and ASP.

Every call carries a deadline, so "the server answered" means a status code arrived in time (a
DEADLINE_EXCEEDED counts as a hang and fails the test). Expected codes are computed per input
class from the server's documented checks (docs/protocol.md, "Errors"); a call with several faults may
answer with the code of any of them, but never UNKNOWN or INTERNAL, and a refused call must leave
the server's state bit-for-bit as it was.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from protos import ps_pb2, ps_pb2_grpc
from tests.conftest import InProcessServer
from tests.state_compare import assert_same
from tests.hostile_membership_rules import MembershipRules
from tests.hostile_push_rules import PushRules
from tests.hostile_peer import (
    Answer, OK, SECRETS, TIMEOUT, UNKNOWN_IDS, View, ask, pick_from, snapshot, start_server, stop_server, worker_id_code,
)


class HostileMachine(MembershipRules, PushRules, RuleBasedStateMachine):
    """Random valid and invalid calls against one in-process server; MODE is set by subclasses.

    Between rules the server is idle: BSP rounds open and close inside the `round` rule (the
    pushes run on a thread pool; hostile calls are made while the round is open), so a valid
    push never waits on a rule that will not come.
    """

    MODE = "bsp"

    def __init__(self) -> None:
        super().__init__()
        self.server: InProcessServer | None = None
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="hostile")
        self.ids: dict[str, str] = {}    # active name -> worker id
        self.gone: dict[str, str] = {}   # departed worker id -> "left" | "evicted"
        self.held_back: set[str] = set()  # names that went without a push since their join: refused from then on
        self.fresh = 0
        self.last_step = (0, 0)
        self.waiting: dict[str, concurrent.futures.Future] = {}  # name -> a BSP Join waiting for the round boundary

    # -------------------------------------------------------------- setup/teardown
    @initialize(
        workers=st.integers(2, 3),
        short_job=st.sampled_from([False, False, True]),
        controller=st.sampled_from(["dynamic", "static", "uniform"]),
        staleness=st.sampled_from([None, 0, 2]),
    )
    def start(self, workers: int, short_job: bool, controller: str, staleness: int | None) -> None:
        # a short job (B=600, 1 epoch over 1438 samples) ends after ~3 rounds, so "done" gets exercised. It
        # samples independently: under --sampling exact, where slices of its last epoch went back, which worker
        # the rest reaches depends on the order concurrent pushes arrive in, and a replayed case must draw alike
        # (the exact epochs' end: tests/ps/rounds/test_epoch_slices.py, tests/ps/rounds/test_sampling_resting.py)
        self.global_batch, epochs = (600, 1) if short_job else (24, 100)
        self.max_workers = workers + 2
        self.max_staleness = staleness if self.MODE == "asp" else None
        argv = [
            "--mode", self.MODE, "--workers", str(workers), "--max-workers", str(self.max_workers),
            "--global-batch", str(self.global_batch), "--epochs", str(epochs), "--controller", controller,
            "--adjust-every", "2", "--lr", "0.05",
            # no bound here depends on the wall clock (each is tested on its own: tests/ps/rounds/test_deadlines.py,
            # the evict rule): a replayed case must meet the same state however slowly the machine ran it
            "--round-deadline", "off", "--evict-after", "3600",
            *(["--sampling", "independent"] if short_job else []),
        ]
        if self.max_staleness is not None:
            argv += ["--max-staleness", str(self.max_staleness)]
        self.server = start_server(*argv)
        # the model plans a late joiner at its round boundary: probation off (tests/ps/rounds/test_probation.py)
        self.server.coordinator.probation.available = lambda: False  # type: ignore[method-assign]
        self.stub = ps_pb2_grpc.ParameterServerStub(self.server.channel())
        self.numel = self.server.coordinator.layout.numel
        names = [f"w{i}" for i in range(workers)]
        futures = {
            n: self.pool.submit(ask, lambda n=n, i=i: self.stub.Join(ps_pb2.JoinRequest(name=n, cores=1.0 + i), timeout=TIMEOUT))
            for i, n in enumerate(names)
        }
        for n, f in futures.items():
            answer = f.result(2 * TIMEOUT)
            assert answer.code == OK, answer
            self.ids[n] = answer.value.worker_id
            SECRETS[answer.value.worker_id] = answer.value.secret

    def teardown(self) -> None:
        if self.server is not None:
            stop_server(self.server)
        self.pool.shutdown(wait=True, cancel_futures=True)

    # ----------------------------------------------------------------------- views
    def view(self) -> View:
        def take() -> View:
            c = self.server.coordinator
            return View(
                c.done, c.round, c.version, c.epoch, c.samples, c.policy.plan(), set(c.bsp.pushed),
                {k: m.name for k, m in c.membership.pending.items()}, c.store.flat.clone(),
                {k: {step: set(b) for step, b in m.told.items()} for k, m in c.membership.active.items()},
                {k for k, m in c.membership.active.items() if m.pulled},
            )

        return self.server.call(take)

    def name_of(self, worker_id: str) -> str | None:
        return next((n for n, i in self.ids.items() if i == worker_id), None)

    def draw_worker_id(self, data: st.DataObject, extra: Iterable[str] = ()) -> str:
        unknown = data.draw(UNKNOWN_IDS, label="unknown id")
        return pick_from(data, [[unknown]] + [sorted(self.ids.values())] * 3 + [sorted(self.gone), sorted(extra)], "worker id")

    def right_secret(self, worker_id: str) -> str:
        """The secret the server's Join gives (gave, or will give) that id."""
        return self.server.coordinator.keys.secret(worker_id)

    def draw_secret(self, data: st.DataObject, worker_id: str) -> str:
        """Mostly the worker's own secret; sometimes none, another worker's, or a made-up one."""
        others = sorted(SECRETS[i] for i in self.ids.values() if i != worker_id and i in SECRETS)
        made_up = data.draw(st.text(max_size=70), label="made-up secret")
        return pick_from(data, [[self.right_secret(worker_id)]] * 6 + [[""], [made_up], others], "secret")

    def id_code(self, worker_id: str, v: View, secret: str) -> grpc.StatusCode:
        return worker_id_code(self.ids, self.gone, set(v.pending), worker_id, secret, self.right_secret(worker_id))

    def refused_leaves_no_trace(self, answer_of: Callable[[], Answer], expected: set[grpc.StatusCode], what: str) -> Answer:
        """Make a call expected to be refused; its code must be expected and the state unchanged."""
        before = snapshot(self.server)
        answer = answer_of()
        event(f"{what.partition('(')[0]}: {answer.code.name}")
        assert answer.code in expected, f"{what}: got {answer.code.name} ({answer.details}), expected {sorted(c.name for c in expected)}"
        if answer.code != OK:
            assert_same(before, snapshot(self.server))
        return answer

    # ------------------------------------------------------------------ invariants
    def check_status(self) -> None:
        """The Status RPC says what the coordinator holds."""
        reply = self.stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT)
        s = dataclasses.asdict(self.server.call(self.server.coordinator.status))
        assert (reply.mode, reply.controller, reply.round, reply.version, reply.epoch, reply.epochs, reply.done) == (
            s["mode"], s["controller"], s["round"], s["version"], s["epoch"], s["epochs"], s["done"])
        assert (reply.global_batch, reply.adjustments, reply.expected_workers) == (s["global_batch"], s["adjustments"], s["expected_workers"])
        assert [(w.worker_id, w.name, w.cores, w.batch_size, w.compute_ms, w.updates, w.mean_staleness) for w in reply.workers] == [
            (w["worker_id"], w["name"], w["cores"], w["batch_size"], w["compute_ms"], w["updates"], w["mean_staleness"]) for w in s["workers"]]

    @invariant()
    def server_is_consistent(self) -> None:
        if self.server is None:
            return

        def take() -> dict[str, Any]:
            c = self.server.coordinator
            return {
                "finite": bool(torch.isfinite(c.store.flat).all()),
                "step": (c.round, c.version),
                "done": c.done,
                "active": {k: m.name for k, m in c.membership.active.items()},
                "pending": {k: m.name for k, m in c.membership.pending.items()},
                "departed": dict(c.membership.departed),
                "plan": c.policy.plan(),
                "pushed": set(c.bsp.pushed),
                "acc_count": None if c.bsp.accumulator is None else c.bsp.accumulator.count,
                "status": dataclasses.asdict(c.status()),
            }

        s = self.server.call(take)
        assert s["finite"], "the parameters are not finite"
        assert s["step"][0] >= self.last_step[0] and s["step"][1] >= self.last_step[1], (self.last_step, s["step"])
        self.last_step = s["step"]
        if self.MODE == "bsp":
            assert s["step"][0] == s["step"][1]  # one version per round
            assert s["pushed"] == set() and s["acc_count"] == 0  # no round is open between rules
        else:
            assert s["step"][0] == 0
        active, pending, departed = s["active"], s["pending"], s["departed"]
        assert not (set(active) & set(pending)) and not (set(active) & set(departed)) and not (set(pending) & set(departed))
        names = [*active.values(), *pending.values()]
        assert len(names) == len(set(names)) <= self.max_workers
        assert active == {i: n for n, i in self.ids.items()}, "membership differs from the calls' outcomes"
        assert all(departed.get(i, "").startswith(r) for i, r in self.gone.items())
        if not s["done"]:
            assert sorted(pending.values()) == sorted(self.waiting)  # BSP: Joins waiting for the open round to close
            plan = s["plan"]
            assert set(plan) == set(active.values())
            assert all(1 <= b <= self.global_batch for b in plan.values()), plan
            if plan:  # ASP too: the workers' bounds (--min-batch 1, no --max-batch) can always meet B
                assert sum(plan.values()) == self.global_batch, plan
        status = s["status"]
        assert (status["round"], status["version"], status["done"]) == (*s["step"], s["done"])
        assert [w["worker_id"] for w in status["workers"]] == list(active)
        assert all(w["batch_size"] == s["plan"].get(w["name"], 0) for w in status["workers"])
        assert status["global_batch"] == sum(s["plan"].values())


class BSPMachine(HostileMachine):
    MODE = "bsp"

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def round(self, data: st.DataObject) -> None:
        self.run_round(data)

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def another_round(self, data: st.DataObject) -> None:
        self.run_round(data)


class ASPMachine(HostileMachine):
    MODE = "asp"

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def burst(self, data: st.DataObject) -> None:
        self.run_burst(data)


# HOSTILE_EXAMPLES=400 for a longer hunt than the default run's ~25 s
MACHINE_SETTINGS = settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "40")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
TestHostileBSP = BSPMachine.TestCase
TestHostileBSP.settings = MACHINE_SETTINGS
TestHostileASP = ASPMachine.TestCase
TestHostileASP.settings = MACHINE_SETTINGS
