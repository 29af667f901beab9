"""The hostile protocol machine's membership calls (tests/ps/test_hostile_protocol.py): Join, Leave, Pull,
Heartbeat and evictions, each drawn valid or not and checked against the codes the server documents."""

from __future__ import annotations

import math

import grpc
import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from protos import ps_pb2
from ps.rounds.membership import MAX_CORES, MAX_NAME
from tests.hostile_peer import (
    Answer, CORES, Code, INVALID, NAMES, OK, PRECONDITION, SECRETS, TIMEOUT, View, ask, read_params,
    name_held_back, pick, pick_from, wait_until,
)


class MembershipRules:
    """Join, Leave, Pull, Heartbeat and evict rules of HostileMachine (its state and views are its own)."""

    # ------------------------------------------------------------------------ Join
    def draw_join(self, data: st.DataObject) -> tuple[str, float]:
        odd = data.draw(NAMES, label="odd name")
        name = pick_from(data, [[f"n{self.fresh}"]] * 4 + [[odd], sorted(self.ids)], "name")
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
        name = pick(data, sorted(self.ids), "silent worker")
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
