"""The hostile protocol machine's pushes (tests/ps/test_hostile_protocol.py): hostile pushes drawn valid or
not, BSP rounds of valid pushes with hostile calls while they are open, and ASP bursts."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import grpc
import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import rule

from protos import ps_pb2
from common.transport.messages import MAX_COMPUTE_MS
from common.transport.wire import decode, encode, split
from tests.hostile_peer import (
    Answer, COMPUTE_MS, DECLARED_DTYPES, HAS_KIND, INVALID, OK, POISON, PRECONDITION, PushSpec, SECRETS,
    STREAM_FAULTS, TIMEOUT, View, WIRE_DTYPES, ask, pick, read_params, name_held_back, wait_until,
)


class PushRules:
    """Push rules, BSP rounds and ASP bursts of HostileMachine (its state and views are its own)."""

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
            if spec.worker_id in self.ids.values() and spec.worker_id not in v.pulled:  # no Pull since its Join
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

    def first_pulls(self) -> None:
        """Every worker that has not pulled since its Join makes that Pull, as an honest worker does
        before its first push (a hostile push before it is refused: push_codes)."""
        v = self.view()
        for worker_id in sorted(set(self.ids.values()) - v.pulled):
            self.pull_checked(worker_id, v, self.right_secret(worker_id))

    def pushed_ids(self) -> set[str]:
        return self.server.call(lambda: set(self.server.coordinator.bsp.pushed))

    def run_round(self, data: st.DataObject) -> None:
        """A BSP round: some workers push (their calls wait), hostile calls hit the open round, then the
        others push or leave; the round closes on exactly the valid pushes and answers them all."""
        self.first_pulls()
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
            assert h.batch_size == after.plan.get(n, 0), (n, h.batch_size, after.plan)
            assert torch.equal(params, after.flat)
        self.settle_waiting(after.round, after.done)

    # ------------------------------------------------------------------ ASP bursts
    def run_burst(self, data: st.DataObject) -> None:
        """Every worker pushes a valid update at the same time; each is applied once, or (with a
        staleness limit the others' updates overtook) refused as too old."""
        self.first_pulls()
        v = self.view()
        specs = []
        for name in sorted(self.ids):  # each from a version it was told a batch at (the latest, mostly)
            told = sorted(version for version, batches in v.told[self.ids[name]].items() if max(batches) > 0)
            # drawn alike whether or not it pushes: the told versions depend on the order the last burst's pushes came in
            latest = data.draw(st.booleans(), label="latest version")
            version = pick(data, told or [v.version], "version")
            spec = self.valid_push(data, name, v, told[-1] if latest and told else version)
            if told:  # told 0 since: the epoch's last samples went to the others, it waits for the job's end
                specs.append(spec)
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
