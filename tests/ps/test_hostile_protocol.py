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
import math
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
from ps.rounds.membership import MAX_CORES, MAX_NAME
from common.transport.messages import MAX_COMPUTE_MS
from common.transport.wire import decode, encode, split
from tests.conftest import InProcessServer
from tests.state_compare import assert_same
from tests.hostile_peer import (
    Answer, COMPUTE_MS, CORES, Code, DECLARED_DTYPES, HAS_KIND, INVALID, NAMES, OK, POISON, PRECONDITION,
    PushSpec, SECRETS, STREAM_FAULTS, TIMEOUT, UNKNOWN_IDS, View, WIRE_DTYPES, ask, pick, read_params,
    name_held_back, snapshot, start_server, stop_server, wait_until, worker_id_code,
)


class HostileMachine(RuleBasedStateMachine):
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
        # a short job (B=600, 1 epoch over 1437 samples) ends after ~3 rounds, so "done" gets exercised
        self.global_batch, epochs = (600, 1) if short_job else (24, 100)
        self.max_workers = workers + 2
        self.max_staleness = staleness if self.MODE == "asp" else None
        argv = [
            "--mode", self.MODE, "--workers", str(workers), "--max-workers", str(self.max_workers),
            "--global-batch", str(self.global_batch), "--epochs", str(epochs), "--controller", controller,
            "--adjust-every", "2", "--evict-after", "60", "--lr", "0.05",
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
            )

        return self.server.call(take)

    def name_of(self, worker_id: str) -> str | None:
        return next((n for n, i in self.ids.items() if i == worker_id), None)

    def draw_worker_id(self, data: st.DataObject, extra: Iterable[str] = ()) -> str:
        choices: list[st.SearchStrategy[str]] = [UNKNOWN_IDS]
        if self.ids:
            choices += [st.sampled_from(sorted(self.ids.values()))] * 3
        if self.gone:
            choices.append(st.sampled_from(sorted(self.gone)))
        if extra := sorted(extra):
            choices.append(st.sampled_from(extra))
        return data.draw(st.one_of(choices), label="worker id")

    def right_secret(self, worker_id: str) -> str:
        """The secret the server's Join gives (gave, or will give) that id."""
        return self.server.coordinator.keys.secret(worker_id)

    def draw_secret(self, data: st.DataObject, worker_id: str) -> str:
        """Mostly the worker's own secret; sometimes none, another worker's, or a made-up one."""
        others = sorted(SECRETS[i] for i in self.ids.values() if i != worker_id and i in SECRETS)
        choices = [st.just(self.right_secret(worker_id))] * 6 + [st.just(""), st.text(max_size=70)]
        if others:
            choices.append(st.sampled_from(others))
        return data.draw(st.one_of(choices), label="secret")

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

    # ------------------------------------------------------------------------ Join
    def draw_join(self, data: st.DataObject) -> tuple[str, float]:
        names = [st.builds(lambda: f"n{self.fresh}")] * 4 + [NAMES]
        if self.ids:
            names.append(st.sampled_from(sorted(self.ids)))
        name = data.draw(st.one_of(names), label="name")
        cores = data.draw(st.one_of(st.just(1.0), st.just(2.0), CORES), label="cores")
        return name, cores

    def join_codes(self, name: str, cores: float, v: View) -> set[grpc.StatusCode]:
        if v.done:
            return {PRECONDITION}
        codes = set()
        if not name or len(name) > MAX_NAME or not name.isprintable():
            codes.add(INVALID)
        if not (math.isfinite(cores) and 0 < cores <= MAX_CORES):
            codes.add(INVALID)
        if len(self.ids) + len(v.pending) >= self.max_workers:
            codes.add(PRECONDITION)
        if name in self.ids or name in v.pending.values():
            codes.add(Code.ALREADY_EXISTS)
        elif name in self.held_back:
            codes.add(Code.RESOURCE_EXHAUSTED)
        return codes or {OK}

    def join_call(self, name: str, cores: float) -> Answer:
        answer = ask(lambda: self.stub.Join(ps_pb2.JoinRequest(name=name, cores=cores), timeout=TIMEOUT))
        if answer.code == OK:
            SECRETS[answer.value.worker_id] = answer.value.secret
        return answer

    def admitted(self, name: str, answer: Answer, round_: int) -> None:
        reply = answer.value
        assert reply.worker_id.startswith(f"{name}-") and reply.num_params == self.numel
        assert reply.round == round_
        plan = self.server.call(self.server.coordinator.policy.plan)
        assert reply.batch_size == plan[name] >= 1
        assert reply.secret == self.right_secret(reply.worker_id)
        self.ids[name] = reply.worker_id
        if name == f"n{self.fresh}":
            self.fresh += 1

    def join_later(self, name: str, cores: float) -> None:
        """A BSP Join while workers compute the open round: it waits for the round to close."""
        self.waiting[name] = self.pool.submit(self.join_call, name, cores)
        wait_until(lambda: name in self.view().pending.values() or self.waiting[name].done(), "the late joiner to be pending")
        assert not self.waiting[name].done(), self.waiting[name].result()
        if name == f"n{self.fresh}":
            self.fresh += 1

    def settle_waiting(self, round_: int, done: bool) -> None:
        """The waiting Joins, once their round boundary came (or the job ended)."""
        for name, future in self.waiting.items():
            answer = future.result(2 * TIMEOUT)
            if done:  # the round ended the job: the late joiner is told so
                assert answer.code == PRECONDITION and "has ended" in answer.details, answer
            else:
                assert answer.code == OK, answer
                self.admitted(name, answer, round_)
        self.waiting = {}

    @rule(data=st.data())
    def join(self, data: st.DataObject) -> None:
        name, cores = self.draw_join(data)
        v = self.view()
        expected = self.join_codes(name, cores, v)
        if self.MODE == "bsp" and expected == {OK} and self.ids:
            self.join_later(name, cores)  # the members are computing the open round
            return
        answer = self.refused_leaves_no_trace(lambda: self.join_call(name, cores), expected, f"Join({name!r}, {cores})")
        if answer.code == OK:  # ASP, or nobody computing: admitted at once
            self.admitted(name, answer, v.round)

    # ---------------------------------------------------------- Leave/Pull/Heartbeat
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        worker_id = self.draw_worker_id(data)
        secret = self.draw_secret(data, worker_id)
        v = self.view()
        expected = {self.id_code(worker_id, v, secret)}
        if expected == {OK}:  # going without a push since its join, its name is held back
            self.held_back |= {name_held_back(self.server, worker_id)} - {None}
        answer = self.refused_leaves_no_trace(
            lambda: ask(lambda: self.stub.Leave(ps_pb2.LeaveRequest(worker_id=worker_id, secret=secret), timeout=TIMEOUT)),
            expected, "Leave",
        )
        if answer.code == OK:
            del self.ids[self.name_of(worker_id)]
            self.gone[worker_id] = "left"
            self.admit_waiting_if_alone(v)

    def admit_waiting_if_alone(self, v: View) -> None:
        """The last active worker went: the Joins waiting for its round are admitted at once."""
        if not self.ids and self.waiting:
            self.settle_waiting(v.round, v.done)

    def pull_checked(self, worker_id: str, v: View, secret: str) -> None:
        answer = self.refused_leaves_no_trace(
            lambda: ask(lambda: read_params(self.stub.Pull(ps_pb2.PullRequest(worker_id=worker_id, secret=secret), timeout=TIMEOUT))),
            {self.id_code(worker_id, v, secret)}, "Pull",
        )
        if answer.code == OK:
            h, params = answer.value
            assert (h.round, h.version, h.epoch, h.done) == (v.round, v.version, v.epoch, v.done)
            assert (h.num_values, h.wire_dtype) == (self.numel, "float32")
            assert h.batch_size == v.plan.get(self.name_of(worker_id), 0) and h.global_batch == sum(v.plan.values())
            assert torch.equal(params, v.flat)

    def heartbeat_checked(self, worker_id: str, v: View, secret: str) -> None:
        answer = self.refused_leaves_no_trace(
            lambda: ask(lambda: self.stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=worker_id, secret=secret), timeout=TIMEOUT)),
            {self.id_code(worker_id, v, secret)}, "Heartbeat",
        )
        if answer.code == OK:
            beat = answer.value
            assert (beat.done, beat.epoch, beat.round, beat.version) == (v.done, v.epoch, v.round, v.version)

    @rule(data=st.data())
    def pull(self, data: st.DataObject) -> None:
        worker_id = self.draw_worker_id(data)
        self.pull_checked(worker_id, self.view(), self.draw_secret(data, worker_id))

    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        worker_id = self.draw_worker_id(data)
        self.heartbeat_checked(worker_id, self.view(), self.draw_secret(data, worker_id))

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        """A worker falls silent past --evict-after: the reaper evicts it (and only it)."""
        name = data.draw(st.sampled_from(sorted(self.ids)), label="silent worker")
        worker_id = self.ids[name]
        self.held_back |= {name_held_back(self.server, worker_id)} - {None}

        def silence_and_reap() -> tuple[bool, list[str]]:
            c = self.server.coordinator
            c.members[worker_id].last_seen = c.clock() - c.evict_after - 1.0
            return c.done, c.evict_stale()

        v = self.view()
        done, evicted = self.server.call(silence_and_reap)
        event(f"evict: {'after the end' if done else 'evicted'}")
        if done:
            assert evicted == []  # nobody is evicted once the job has ended
            return
        assert evicted == [name]
        del self.ids[name]
        self.gone[worker_id] = "evicted"
        self.admit_waiting_if_alone(v)

    # ------------------------------------------------------------------------ Push
    def draw_push(self, data: st.DataObject, v: View, extra_ids: Iterable[str] = ()) -> PushSpec:
        worker_id = self.draw_worker_id(data, extra_ids)
        round_ = v.round + data.draw(st.sampled_from([0] * 6 + [-1, 1, 2, -v.round - 1, 2**62]), label="round offset")
        version = v.version - data.draw(st.sampled_from([0] * 4 + [1, 2, 3, -1, -2, v.version + 1, -(2**62)]), label="staleness")
        told = sorted(v.batches_told(worker_id, round_ if self.MODE == "bsp" else version)) or [v.plan.get(self.name_of(worker_id) or "", 1)]
        planned = pick(data, told, "told batch")
        B = self.global_batch
        return PushSpec(
            worker_id=worker_id,
            round=round_,
            version=version,
            batch_size=data.draw(
                st.one_of(st.just(planned), st.just(planned), st.integers(1, B),
                          st.sampled_from([0, -1, -(2**31), B + 1, 2**31 - 1])),
                label="batch",
            ),
            compute_ms=data.draw(COMPUTE_MS, label="compute_ms"),
            wire_dtype=data.draw(DECLARED_DTYPES, label="wire dtype"),
            num_values=self.numel + data.draw(st.sampled_from([0] * 8 + [-1, 1, -self.numel, self.numel]), label="num_values offset"),
            stream=data.draw(st.sampled_from(["ok"] * 8 + list(STREAM_FAULTS)), label="stream"),
            poison=data.draw(POISON, label="poison"),
            scale=data.draw(st.sampled_from([0.01, 1.0, 1e3]), label="scale"),
            seed=data.draw(st.integers(0, 2**16), label="seed"),
            kind=data.draw(st.sampled_from([0] * 12 + [1, 2, 7, -3]), label="kind") if HAS_KIND else 0,
            secret=self.draw_secret(data, worker_id),
        )

    def push_codes(self, spec: PushSpec, v: View) -> set[grpc.StatusCode]:
        """Every code the push may get: one per fault it has (OK if none)."""
        if spec.stream in ("empty", "no-header"):
            return {INVALID}  # nothing else can be checked without a header
        codes = set()
        if (code := self.id_code(spec.worker_id, v, spec.secret or "")) != OK:
            codes.add(code)
        if spec.wire_dtype not in WIRE_DTYPES or spec.kind != 0:
            codes.add(INVALID)
        if not 0 < spec.batch_size <= self.global_batch:
            codes.add(INVALID)
        if not (math.isfinite(spec.compute_ms) and 0 <= spec.compute_ms <= MAX_COMPUTE_MS):
            codes.add(INVALID)
        if spec.num_values != self.numel:
            codes.add(INVALID)
        if spec.stream != "ok" or not spec.payload_is_finite():
            codes.add(INVALID)
        if not v.done:  # once the job has ended, any push just hears "done"
            if self.MODE == "bsp" and (spec.round != v.round or spec.worker_id in v.pushed):
                codes.add(PRECONDITION)
            too_old = self.max_staleness is not None and v.version - spec.version > self.max_staleness
            if self.MODE == "asp" and (not 0 <= spec.version <= v.version or too_old):
                codes.add(PRECONDITION)
            step = spec.round if self.MODE == "bsp" else spec.version
            if spec.batch_size not in v.batches_told(spec.worker_id, step):  # not the server's plan for it
                codes.add(PRECONDITION)
        return codes or {OK}

    def push_call(self, spec: PushSpec) -> Answer:
        chunks = spec.chunks()
        return ask(lambda: read_params(self.stub.Push(iter(chunks), timeout=TIMEOUT)))

    def hostile_push_now(self, data: st.DataObject, v: View, extra_ids: Iterable[str] = ()) -> None:
        """One generated push that cannot block: in BSP a push that would be valid gets a NaN compute time."""
        spec = self.draw_push(data, v, extra_ids)
        expected = self.push_codes(spec, v)
        if self.MODE == "bsp" and expected == {OK} and not v.done:
            spec = dataclasses.replace(spec, compute_ms=math.nan)
            expected = {INVALID}
        event(f"push stream: {spec.stream}")
        answer = self.refused_leaves_no_trace(lambda: self.push_call(spec), expected, f"Push({spec})")
        if answer.code != OK:
            return
        h, params = answer.value
        after = self.view()
        assert torch.equal(params, after.flat) and h.num_values == self.numel
        if v.done:
            assert h.done and after.version == v.version and torch.equal(after.flat, v.flat)
            return
        assert self.MODE == "asp"  # an ASP update is applied at once: θ + Δ, one version later
        delta = decode(split(encode(spec.values(), spec.payload_dtype)), self.numel, spec.payload_dtype)
        assert torch.equal(after.flat, v.flat + delta)
        assert h.version == after.version == v.version + 1
        assert after.samples == v.samples + spec.batch_size

    @rule(data=st.data())
    def hostile_push(self, data: st.DataObject) -> None:
        self.hostile_push_now(data, self.view())

    @rule(data=st.data())
    def another_hostile_push(self, data: st.DataObject) -> None:  # pushes are what most input goes into
        self.hostile_push_now(data, self.view())

    @rule()
    def status(self) -> None:
        self.check_status()

    # ------------------------------------------------------------------ BSP rounds
    def valid_push(self, data: st.DataObject, name: str, v: View, version: int | None = None) -> PushSpec:
        """A push as `name` of what the server told it for the open round (ASP: for `version`, default the current)."""
        version = v.version if version is None else version
        told = v.batches_told(self.ids[name], v.round if self.MODE == "bsp" else version)
        return PushSpec(
            worker_id=self.ids[name], round=v.round, version=version,
            batch_size=pick(data, sorted(b for b in told if b > 0) or [v.plan.get(name, 1)], "batch"),
            compute_ms=data.draw(st.floats(0.0, 1e4), label="compute_ms"),
            wire_dtype=data.draw(st.sampled_from(WIRE_DTYPES), label="wire dtype"), num_values=self.numel,
            seed=data.draw(st.integers(0, 2**16), label="seed"),
        )

    def pushed_ids(self) -> set[str]:
        return self.server.call(lambda: set(self.server.coordinator.bsp.pushed))

    def run_round(self, data: st.DataObject) -> None:
        """A BSP round: some workers push (their calls wait), hostile calls hit the open round, then the
        others push or leave; the round closes on exactly the valid pushes and answers them all."""
        v = self.view()
        names = data.draw(st.permutations(sorted(self.ids)), label="push order")
        specs = {n: self.valid_push(data, n, v) for n in names}
        if v.done:  # every push hears at once that the job has ended
            answers = [f.result(2 * TIMEOUT) for f in [self.pool.submit(self.push_call, specs[n]) for n in names]]
            assert all(a.code == OK and a.value[0].done for a in answers), answers
            return
        first = data.draw(st.integers(1, len(names)), label="first pushers")
        waiting = {n: self.pool.submit(self.push_call, specs[n]) for n in names[:first]}
        late = len(self.waiting)
        if first < len(names):
            wait_until(lambda: self.pushed_ids() >= {self.ids[n] for n in waiting} or any(f.done() for f in waiting.values()),
                       "the first pushes to reach the round")
            assert not any(f.done() for f in waiting.values()), {n: f.result() for n, f in waiting.items() if f.done()}
            for op in data.draw(st.lists(st.sampled_from(["push", "push", "pull", "heartbeat", "join", "status"]), max_size=4), label="mid-round"):
                mid = self.view()
                assert mid.pushed == {self.ids[n] for n in waiting} and mid.round == v.round
                if op == "push":
                    self.hostile_push_now(data, mid, extra_ids=mid.pending)
                elif op == "pull":
                    worker_id = self.draw_worker_id(data, mid.pending)
                    self.pull_checked(worker_id, mid, self.draw_secret(data, worker_id))
                elif op == "heartbeat":
                    worker_id = self.draw_worker_id(data, mid.pending)
                    self.heartbeat_checked(worker_id, mid, self.draw_secret(data, worker_id))
                elif op == "status":
                    self.check_status()
                else:
                    name, cores = self.draw_join(data)
                    expected = self.join_codes(name, cores, mid)
                    if expected == {OK}:  # a late joiner waits for the round boundary
                        self.join_later(name, cores)
                    else:
                        self.refused_leaves_no_trace(lambda name=name, cores=cores: self.join_call(name, cores), expected,
                                                     f"Join({name!r}, {cores}) mid-round")
            rest = names[first:]
            leaving = data.draw(st.lists(st.booleans(), min_size=len(rest), max_size=len(rest)), label="leavers")
            for i, (name, leaves) in enumerate(zip(rest, leaving)):
                if leaves:
                    self.held_back |= {name_held_back(self.server, self.ids[name])} - {None}
                    answer = ask(lambda name=name: self.stub.Leave(
                        ps_pb2.LeaveRequest(worker_id=self.ids[name], secret=SECRETS[self.ids[name]]), timeout=TIMEOUT))
                    assert answer.code == OK, answer
                    self.gone[self.ids.pop(name)] = "left"
                else:
                    waiting[name] = self.pool.submit(self.push_call, specs[name])
                    if i < len(rest) - 1:
                        wait_until(lambda name=name: self.ids[name] in self.pushed_ids() or waiting[name].done(), f"{name}'s push")
        answers = {n: f.result(2 * TIMEOUT) for n, f in waiting.items()}
        after = self.view()
        event(f"round: {len(names) - len(waiting)} left, {late} joins waiting before it and {len(self.waiting) - late} "
              f"during it, {'ended the job' if after.done else 'job goes on'}")
        assert after.round == v.round + 1 and after.version == v.version + 1, (v.round, after.round)
        assert after.samples == v.samples + sum(specs[n].batch_size for n in waiting)
        for n, answer in answers.items():
            assert answer.code == OK, (n, answer)
            h, params = answer.value
            assert (h.round, h.version, h.done) == (after.round, after.version, after.done)
            assert h.batch_size == after.plan.get(n, 0) and torch.equal(params, after.flat)
        self.settle_waiting(after.round, after.done)

    # ------------------------------------------------------------------ ASP bursts
    def run_burst(self, data: st.DataObject) -> None:
        """Every worker pushes a valid update at the same time; each is applied once, or (with a
        staleness limit the others' updates overtook) refused as too old."""
        v = self.view()
        specs = []
        for name in sorted(self.ids):  # each from a version it was told a batch at (the latest, mostly)
            told = sorted(version for version, batches in v.told[self.ids[name]].items() if max(batches) > 0)
            if not told:  # told 0 since: the epoch's last samples went to the others, it waits for the job's end
                continue
            version = told[-1] if data.draw(st.booleans(), label="latest version") else pick(data, told, "version")
            specs.append(self.valid_push(data, name, v, version))
        answers = [f.result(2 * TIMEOUT) for f in [self.pool.submit(self.push_call, s) for s in specs]]
        allowed = {OK} if self.max_staleness is None or v.done else {OK, PRECONDITION}
        assert all(a.code in allowed for a in answers), answers
        applied = sum(a.code == OK for a in answers)
        event(f"burst: {applied} of {len(answers)} applied{' (job done)' if v.done else ''}")
        after = self.view()
        if v.done:
            assert after.version == v.version
        elif after.done:  # the job ended during the burst: the pushes after that were not applied
            assert v.version < after.version <= v.version + applied
        else:
            assert after.version == v.version + applied

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
