"""benchmarks.simulation.engine: a simulated BSP job drives a real policy in ps/rounds' call order,
deterministically for a seed, and every plan it reads sums to B."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmarks.simulation.engine import Event, Scenario, Simulation, simulate
from benchmarks.simulation.population import SpeedLaw


def small(**overrides: Any) -> Scenario:
    settings = {"policy": "dynamic", "workers": 6, "global_batch": 96, "rounds": 40, "seed": 3}
    return Scenario(**{**settings, **overrides})


class Recorder:
    """A batch policy that records the calls made on it and passes them on."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.policy, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)
        return call


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    runs = [simulate(small(policy=p, seed=s)) for p in ("dynamic", "model") for s in (3, 3, 4)]
    for a, b, c in (runs[0:3], runs[3:6]):
        assert a.round_ms == b.round_ms and a.round_ms != c.round_ms
        assert all(np.array_equal(x[2], y[2]) for x, y in zip(a.plans, b.plans, strict=True))


@pytest.mark.parametrize("policy", ["uniform", "static", "dynamic", "model", "auto"])
def test_every_plan_sums_to_b_through_changes_joins_leaves_and_failures(policy: str) -> None:
    events = [Event(10, "speed", fraction=0.5, factor=3.0), Event(15, "join", count=3), Event(20, "leave", count=2),
              Event(25, "fail", count=1)]
    trace = simulate(small(policy=policy, rounds=40, events=events))
    assert all(int(p.sum()) == 96 for _, _, p in trace.plans)
    assert sorted(set(trace.event_rounds)) == [10, 16, 20, 26]
    alive = trace.speeds_at[26][2]
    assert int(alive.sum()) == 6 and len(alive) == 9  # 6 + 3 joined - 2 left - 1 failed
    assert trace.round_ms[25] >= 10_000.0  # the round waited for the failed worker's eviction


@pytest.mark.parametrize("seed", [1, 2])
def test_workers_failing_or_leaving_in_one_round_are_distinct(seed: int) -> None:
    events = [Event(5, "fail", count=2), Event(5, "fail", count=1), Event(5, "leave", count=2)]
    trace = simulate(small(rounds=8, seed=seed, events=events))
    assert int(trace.speeds_at[6][2].sum()) == 1  # 6 - 3 failed - 2 left, each worker picked once


def test_the_workers_in_the_job_follow_the_events_and_a_scenario_they_cannot_run_is_refused() -> None:
    events = [Event(5, "leave", count=2), Event(5, "fail", count=1), Event(5, "join", count=3), Event(40, "join", count=1)]
    assert small(events=events).living() == [(0, 6), (5, 4), (6, 3), (6, 6)]  # round 40 is past the run's end
    with pytest.raises(ValueError, match="no worker from round 6 on"):
        small(events=[Event(5, "fail", count=9), Event(5, "join", count=2)])  # evicted before the joins come in
    with pytest.raises(ValueError, match="no worker from round 5 on"):
        small(events=[Event(5, "leave", count=6)])
    with pytest.raises(ValueError, match=r"9 workers \(from round 6 on\) need 144 samples"):
        small(micro_batch=16, events=[Event(5, "join", count=3)])  # one micro-batch of 16 each, B = 96
    with pytest.raises(ValueError, match=r"5 workers \(from round 3 on\) take 80 samples at most"):
        small(max_batch=16, events=[Event(3, "leave", count=1)])
    for bad in ({"seed": -1}, {"server_fixed_ms": float("nan")}, {"server_per_worker_ms": -1.0}, {"evict_ms": 0.0},
                {"rounds": 0}, {"deadband": 1.0}):
        with pytest.raises(ValueError):
            small(**bad)


def test_micro_batched_plans_are_whole_micro_batches() -> None:
    trace = simulate(small(policy="dynamic", global_batch=96, micro_batch=8))
    assert all(int(p.sum()) == 96 and not (p % 8).any() for _, _, p in trace.plans)


def test_the_policy_is_called_in_the_coordinators_order() -> None:
    sim = Simulation(small(policy="dynamic", workers=3, rounds=10, adjust_every=5))
    recorder = Recorder(sim.policy)
    sim.policy = recorder  # type: ignore[assignment]
    sim.run()
    calls = [c for c in recorder.calls if c not in ("plan", "decision_due")]
    pushes = ["observe"] * 3
    # round 0 has no close before it to time; a decision after the fifth and the tenth close
    assert calls == ["add_worker"] * 3 + ["replan", *pushes, *(pushes + ["observe_round"]) * 4, "adjust",
                                          *(pushes + ["observe_round"]) * 5, "adjust"]


def test_a_plan_that_does_not_sum_to_b_stops_the_run() -> None:
    sim = Simulation(small())

    class Short(Recorder):
        def plan(self) -> dict[str, int]:
            return {k: max(1, b - 1) for k, b in self.policy.plan().items()}

    sim.policy = Short(sim.policy)  # type: ignore[assignment]
    with pytest.raises(AssertionError, match="sums to"):
        sim.run()


def test_the_round_is_the_slowest_push_plus_the_servers_cost() -> None:
    trace = simulate(small(policy="uniform", law=SpeedLaw(q_ms=1.0, s_ms=2.0, sigma=0.0, noise=0.0),
                           server_fixed_ms=1.0, server_per_worker_ms=0.5))
    assert trace.round_ms[0] == pytest.approx(16 * 1.0 + 2.0 + 1.0 + 0.5 * 6)


def test_times_a_float_cannot_hold_are_refused_and_the_largest_taken_stay_finite() -> None:
    """A fixed cost of 1e308 ms or a speed change of 1e200 sends a step or a round to inf, which the
    policy refuses mid-run; the largest values taken give finite rounds."""
    for bad in ({"server_fixed_ms": 1e308}, {"server_per_worker_ms": 1e300}, {"evict_ms": 1e308}, {"global_batch": 2**53 + 1}):
        with pytest.raises(ValueError):
            small(**bad)
    for factors in ({"factor": 1e200}, {"scaled": (("w0", 1e-200),)}):
        with pytest.raises(ValueError, match=r"factor must be in \[1e-06, 1e\+06\]"):
            Event(2, "speed", fraction=1.0, **factors)
    trace = simulate(small(workers=4, global_batch=2**53, law=SpeedLaw(q_ms=1e12, s_ms=1e12, sigma=3.0, noise=3.0),
                           server_fixed_ms=1e12, server_per_worker_ms=1e12, evict_ms=1e12, rounds=12,
                           events=[Event(4, "speed", fraction=1.0, factor=1e6), Event(8, "fail", count=1)]))
    assert np.isfinite(trace.round_ms).all()
