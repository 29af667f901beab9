"""A BSP job of simulated workers driving a real batch policy (ps/control, built by name through
`build_policy` and called only through its BatchPolicy contract) in the order ps/rounds calls it:

- start: every first worker `add_worker`, then `replan` (ps/rounds/admission.py `activate_pending`);
- each round: the workers with a batch push; each push is `observe(name, batch, ms)` in the order the
  pushes arrive (the fastest first); a worker that leaves is `remove_worker` then `replan` at once, a
  failed one the same when the server evicts it (departures.py `remove`);
- the round closes (round_close.py `next_round`): `observe_round(close-to-close ms)` from the second
  close on (bsp.py `next_round`); then a decision, `adjust`, when `adjust_every` rounds passed since
  the last one or the policy says one is due (epochs.py `adjust_due`); then the workers that joined
  during the round `add_worker` and `replan` (`activate_pending`).

A round lasts the slowest pushing worker's step (a failed worker: `evict_ms`, the server's wait
before it evicts) plus the server's own cost, `server_fixed_ms` + `server_per_worker_ms` per pushing
worker. Time is simulated: nothing sleeps, and the only clock read is the CPU time the policy spends
(time.process_time around each of its calls). Every plan is checked to sum to B exactly (BSP) and
to keep each batch within its bounds or 0 for a parked worker; a plan that does not raises
AssertionError."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.simulation.optimum import Optimum, best_split, round_ms
from benchmarks.simulation.population import MAX_MS, Population, SpeedLaw
from ps.control.checks import integer, positive, real
from ps.control.config import PolicyConfig
from ps.control.micro import unit_config
from ps.control.policy import BatchPolicy, build_policy

EVENT_KINDS = ("speed", "join", "leave", "fail")
MAX_FACTOR = 1e6
"""The most a speed change multiplies or divides a worker's times by (population.py's MAX_MS says why)."""
MAX_GLOBAL_BATCH = 2**53
"""The largest B: a float holds every whole number up to it, and a plan's batches fit an int64."""


@dataclass(frozen=True)
class Event:
    """Something that happens at the start of round `round`: `speed` (a `fraction` of the living
    workers, drawn at random, become `factor` times slower or faster, each way with equal chance),
    `join` (`count` new workers drawn from the speed law; they take part from the next round),
    `leave` (`count` workers leave) or `fail` (`count` workers stop answering; evicted at the round's end)."""

    round: int
    kind: str
    count: int = 0
    fraction: float = 0.0
    factor: float = 2.0
    scaled: tuple[tuple[str, float], ...] = ()
    """A speed change's workers by name and the factor of each (2: twice as slow), instead of drawn."""

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"event kind must be one of {', '.join(EVENT_KINDS)}; got {self.kind!r}")
        if self.round < 0:
            raise ValueError(f"a {self.kind} event's round must be >= 0, got {self.round}")
        if self.kind != "speed" and self.count < 1:
            raise ValueError(f"a {self.kind} event's count of workers must be >= 1, got {self.count}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"a speed change's fraction of the workers must be in [0, 1], got {self.fraction}")
        for factor in (self.factor, *(f for _, f in self.scaled)):
            if not 1.0 / MAX_FACTOR <= factor <= MAX_FACTOR:
                raise ValueError(f"a speed change's factor must be in [{1.0 / MAX_FACTOR:g}, {MAX_FACTOR:g}], got {factor}")
        if self.scaled and self.kind != "speed":
            raise ValueError(f"only a speed event names workers to scale, not a {self.kind} event")


@dataclass(frozen=True)
class Scenario:
    """A simulated job: the policy and its settings, the workers' speed law, the rounds, the
    server's cost and the events."""

    policy: str
    workers: int
    global_batch: int
    rounds: int = 200
    adjust_every: int = 5
    law: SpeedLaw = field(default_factory=SpeedLaw)
    seed: int = 0
    deadband: float = 0.1
    min_batch: int = 1
    max_batch: int | None = None
    micro_batch: int = 1
    min_samples: int = 3
    server_fixed_ms: float = 1.0
    server_per_worker_ms: float = 0.02
    evict_ms: float = 10_000.0
    events: Sequence[Event] = ()
    policy_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)
    """Policies' own settings (ps/control/settings.py, ps-server's `--<policy>-<setting>` flags) by
    policy name; the run's policy takes its entry, its declared defaults for the rest."""

    def __post_init__(self) -> None:
        """Refuse, before anything runs, a scenario a run could not go through: a count or a cost out
        of range, settings the policy refuses, or events after which the workers cannot make up B
        (none left, too many for each to take its least batch, too few for their largest batches)."""
        for name in ("workers", "global_batch", "rounds", "adjust_every"):
            integer(name, getattr(self, name), minimum=1)
        integer("seed", self.seed, minimum=0)
        if self.global_batch > MAX_GLOBAL_BATCH:
            raise ValueError(f"global_batch {self.global_batch} is above {MAX_GLOBAL_BATCH} (2**53); lower B")
        for name in ("server_fixed_ms", "server_per_worker_ms"):
            if not 0 <= real(name, getattr(self, name)) <= MAX_MS:
                raise ValueError(f"{name} must be in [0, {MAX_MS:g}], got {getattr(self, name)}")
        if positive("evict_ms", self.evict_ms) > MAX_MS:
            raise ValueError(f"evict_ms must be at most {MAX_MS:g}, got {self.evict_ms}")
        config = self.config()
        m, unit = config.micro_batch, unit_config(config)  # a worker's bounds in whole micro-batches
        least = unit.min_batch * m
        most = None if unit.max_batch is None else unit.max_batch * m
        if most is not None and most < least:
            raise ValueError(f"max_batch {config.max_batch} holds no whole number of micro-batches of {m} "
                             f"from min_batch {config.min_batch} on")
        for event in self.events:  # a worker joining in round j is drawn at its end: named from round j + 1 on
            drawn = self.workers + sum(e.count for e in self.events if e.kind == "join" and e.round < event.round)
            unknown = [n for n, _ in event.scaled if n not in {f"w{i}" for i in range(drawn)}]
            if unknown:
                raise ValueError(f"the speed change at round {event.round} names {', '.join(map(str, unknown))}, "
                                 f"not among the run's workers by then (w0 to w{drawn - 1})")
        for start, count in self.living():
            if count == 0:
                raise ValueError(f"the events leave no worker from round {start} on (a run needs one at least)")
            if count * least > config.global_batch:
                raise ValueError(f"{count} workers (from round {start} on) need {count * least} samples at the least "
                                 f"({least} each), more than B = {config.global_batch}; lower min_batch or micro_batch, "
                                 f"or raise B")
            if most is not None and count * most < config.global_batch:
                raise ValueError(f"{count} workers (from round {start} on) take {count * most} samples at most "
                                 f"({most} each), less than B = {config.global_batch}; raise max_batch or lower B")

    def living(self) -> list[tuple[int, int]]:
        """How many workers are in the job, as (round, count) from each round on where that changes
        (first (0, workers)), the events acting as a run applies them: a leave at its round's start,
        a failure's eviction and then the joins at its end, a departure never more than are left."""
        counts, count = [(0, self.workers)], self.workers
        for r in sorted({e.round for e in self.events if e.round < self.rounds}):
            failing = joining = 0
            for event in (e for e in self.events if e.round == r):
                if event.kind == "leave":
                    count -= min(event.count, count - failing)
                    counts.append((r, count))
                elif event.kind == "fail":
                    failing += min(event.count, count - failing)
                elif event.kind == "join":
                    joining += event.count
            if failing:
                count -= failing
                counts.append((r + 1, count))
            if joining:
                count += joining
                counts.append((r + 1, count))
        return counts

    def config(self) -> PolicyConfig:
        return PolicyConfig(policy=self.policy, global_batch=self.global_batch, deadband=self.deadband,
                            min_batch=self.min_batch, max_batch=self.max_batch, micro_batch=self.micro_batch,
                            min_samples=self.min_samples, options=dict(self.policy_options.get(self.policy, {})))

    def server_ms(self, pushing: int) -> float:
        """The server's own part of a round with `pushing` workers."""
        return self.server_fixed_ms + self.server_per_worker_ms * pushing


@dataclass
class Decision:
    """One `adjust`: the round it closed, whether it changed the plan, the policy's CPU for it (s),
    the plan it left (batches by population index, 0: parked or not in the job), and the round from
    which the workers it planned for are in the job (`round` + 1 where a failure evicted workers as
    the round closed, before the decision; else the last event's round at or before `round`)."""

    round: int
    changed: bool
    cpu_s: float
    plan: np.ndarray
    workers_from: int


@dataclass
class Trace:
    """What a simulation saw: the plans in order (each with the first round it is in force and why:
    "start", "decision", "replan"), the decisions, each round's time, the rounds from which an
    event's change is in force, and the policy's CPU spent observing pushes and rounds and asking
    whether a decision is due (s)."""

    scenario: Scenario
    plans: list[tuple[int, str, np.ndarray]] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    round_ms: list[float] = field(default_factory=list)
    event_rounds: list[int] = field(default_factory=list)
    observe_cpu_s: float = 0.0
    due_cpu_s: float = 0.0
    population: Population | None = None
    speeds_at: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    """(q, s, alive) as they were from round r on, for r = 0 and every event round."""

    def optimum_at(self, round_index: int) -> Optimum:
        """The exact optimum (parking allowed, whatever the policy) for the workers as they were at
        `round_index`; its round without the server's cost."""
        start = max(r for r in self.speeds_at if r <= round_index)
        q, s, alive = self.speeds_at[start]
        sc = self.scenario
        hi = sc.global_batch if sc.max_batch is None else sc.max_batch
        best = best_split(q[alive], s[alive], sc.global_batch, sc.min_batch, hi, unit=sc.micro_batch)
        full = np.zeros(len(q), dtype=np.int64)
        full[alive] = best.batches
        return Optimum(full, best.round_ms)

    def round_of(self, plan: np.ndarray, round_index: int) -> float:
        """A plan's noise-free round with the server's cost, for the workers as they were at `round_index`."""
        start = max(r for r in self.speeds_at if r <= round_index)
        q, s, _ = self.speeds_at[start]
        return round_ms(q, s, plan) + self.scenario.server_ms(int(np.count_nonzero(plan)))


class Simulation:
    """One run of a Scenario (`run`)."""

    def __init__(self, scenario: Scenario) -> None:
        self.sc = scenario
        self.rng = np.random.default_rng(scenario.seed)
        self.pop = Population(scenario.law, self.rng)
        self.policy: BatchPolicy = build_policy(scenario.config())
        self.trace = Trace(scenario, population=self.pop)
        self.events = sorted(scenario.events, key=lambda e: e.round)
        self._active: tuple[list[str], np.ndarray, np.ndarray] = ([], np.empty(0, dtype=np.int64), np.empty(0))

    # ------------------------------------------------------------------ the policy's plans
    def _install(self, effective: int, why: str) -> np.ndarray:
        """Read the plan in force, check it, and cache the pushing workers."""
        plan = self.policy.plan()
        full = np.zeros(len(self.pop.names), dtype=np.int64)
        for name, b in plan.items():
            full[self.pop.index[name]] = b
        self._check(plan)
        names = [n for n, b in plan.items() if b > 0]
        idx = np.array([self.pop.index[n] for n in names], dtype=np.int64)
        self._active = (names, idx, full[idx].astype(float))
        self.trace.plans.append((effective, why, full))
        return full

    def _check(self, plan: dict[str, int]) -> None:
        sc = self.sc
        total = sum(plan.values())
        assert total == sc.global_batch, f"the plan sums to {total}, not B = {sc.global_batch}"
        hi = sc.global_batch if sc.max_batch is None else sc.max_batch
        bad = {k: b for k, b in plan.items() if b != 0 and not (sc.min_batch <= b <= hi and b % sc.micro_batch == 0)}
        assert not bad, f"batches outside [{sc.min_batch}, {hi}] or not whole micro-batches: {dict(list(bad.items())[:5])}"
        assert set(plan) == set(self.pop.living()), "the plan's workers are not the living ones"

    def _snapshot(self, effective: int) -> None:
        """The workers as they are from round `effective` on (an event's change)."""
        self.trace.speeds_at[effective] = (self.pop.q.copy(), self.pop.s.copy(), self.pop.alive.copy())
        if effective and effective not in self.trace.event_rounds:
            self.trace.event_rounds.append(effective)

    def _replan(self, effective: int) -> None:
        self.policy.replan()
        self._install(effective, "replan")

    # ------------------------------------------------------------------ a run
    def run(self) -> Trace:
        sc = self.sc
        for name in self.pop.add(sc.workers):
            self.policy.add_worker(name)
        self.policy.replan()
        self._snapshot(0)
        self._install(0, "start")
        since = 0
        for r in range(sc.rounds):
            joining, failing = self._events_at(r)
            names, idx, batches = self._active
            ms = self.pop.step_ms(idx, batches)
            pushed = np.ones(len(names), dtype=bool)
            if failing:
                pushed[[names.index(n) for n in failing if n in names]] = False
            cpu = time.process_time()
            for i in np.argsort(ms, kind="stable"):
                if pushed[i]:
                    self.policy.observe(names[i], int(batches[i]), float(ms[i]))
            self.trace.observe_cpu_s += time.process_time() - cpu
            slowest = float(ms[pushed].max()) if pushed.any() else 0.0
            if failing:
                slowest = max(slowest, sc.evict_ms)
                self._remove(r + 1, failing)
            elapsed = slowest + sc.server_ms(int(pushed.sum()))
            self.trace.round_ms.append(elapsed)
            cpu = time.process_time()
            if r > 0:
                self.policy.observe_round(elapsed)
            since += 1
            due = since >= sc.adjust_every or self.policy.decision_due()
            self.trace.due_cpu_s += time.process_time() - cpu
            if due:
                since = 0
                before = self.policy.plan()
                cpu = time.process_time()
                after = self.policy.adjust()
                spent = time.process_time() - cpu
                self.trace.decisions.append(Decision(r, after != before, spent, self._install(r + 1, "decision"),
                                                     workers_from=max(self.trace.speeds_at)))
            if joining:
                for name in self.pop.add(joining):
                    self.policy.add_worker(name)
                self._snapshot(r + 1)
                self._replan(r + 1)
        return self.trace

    def _events_at(self, r: int) -> tuple[int, list[str]]:
        """Apply the events of round `r` that act at its start; the count of workers joining during
        it and the names of those that fail in it."""
        joining, failing = 0, list[str]()
        for event in (e for e in self.events if e.round == r):
            if event.kind == "speed" and event.scaled:
                self.pop.scale(dict(event.scaled))
                self._snapshot(r)
            elif event.kind == "speed":
                chosen = self.pop.pick(round(event.fraction * int(self.pop.alive.sum())))
                ways = self.rng.choice([event.factor, 1.0 / event.factor], size=len(chosen))
                self.pop.scale(dict(zip(chosen, ways.tolist(), strict=True)))
                self._snapshot(r)
            elif event.kind == "join":
                joining += event.count
            elif event.kind == "leave":
                self._remove(r, self.pop.pick(event.count, exclude=failing))
            else:
                failing.extend(self.pop.pick(event.count, exclude=failing))
        return joining, failing

    def _remove(self, effective: int, names: list[str]) -> None:
        for name in names:
            self.policy.remove_worker(name)
        self.pop.remove(names)
        self._snapshot(effective)
        self._replan(effective)


def simulate(scenario: Scenario) -> Trace:
    """Run `scenario` to its end; its trace."""
    return Simulation(scenario).run()


def describe(scenario: Scenario) -> dict[str, Any]:
    """The scenario as plain data, for a report."""
    law = scenario.law
    return {"policy": scenario.policy, "workers": scenario.workers, "global_batch": scenario.global_batch,
            "rounds": scenario.rounds, "adjust_every": scenario.adjust_every, "seed": scenario.seed,
            "law": {"q_ms": law.q_ms, "s_ms": law.s_ms, "sigma": law.sigma, "noise": law.noise,
                    "classes": [vars(c) for c in law.classes], "given": [list(g) for g in law.given]},
            "deadband": scenario.deadband, "options": dict(scenario.config().options),
            "min_batch": scenario.min_batch, "max_batch": scenario.max_batch,
            "micro_batch": scenario.micro_batch, "server_fixed_ms": scenario.server_fixed_ms,
            "server_per_worker_ms": scenario.server_per_worker_ms,
            "events": [vars(e) for e in scenario.events]}
