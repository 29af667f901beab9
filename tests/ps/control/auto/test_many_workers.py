"""Tests asked of every worker at once (ps/control/auto/many_workers.py): among more workers than the
reference job a test's bar rises so that noise alone passes it anywhere as seldom as in that job; the
late-worker test (imbalance.py) and the changed-speed tests (worker_laws.py) use it. Pure."""

from __future__ import annotations

import random
from statistics import NormalDist

import pytest

from ps.control.auto.change import ALONG_ROUNDS, ALONG_SDS, CHANGE_SDS
from ps.control.auto.imbalance import NOISE_SDS, far_from_balance
from ps.control.auto.many_workers import REFERENCE_WORKERS, family_sds
from ps.control.auto.worker_laws import WorkerLaws
from ps.control.model.worker_times import WARMUP


@pytest.mark.parametrize("sds", [NOISE_SDS, ALONG_SDS, CHANGE_SDS])
def test_among_few_workers_a_test_is_as_written(sds: float) -> None:
    assert [family_sds(sds, n) for n in range(1, REFERENCE_WORKERS + 1)] == [sds] * REFERENCE_WORKERS


@pytest.mark.parametrize("sds", [NOISE_SDS, ALONG_SDS, CHANGE_SDS])
def test_among_many_the_chance_of_any_false_alarm_stays_the_reference_jobs(sds: float) -> None:
    tail = NormalDist().cdf
    reference = 1.0 - (1.0 - tail(-sds)) ** REFERENCE_WORKERS
    bars = [family_sds(sds, n) for n in (REFERENCE_WORKERS + 1, 16, 256, 1024, 10_000)]
    assert bars == sorted(bars) and bars[0] > sds
    for n, bar in zip((REFERENCE_WORKERS + 1, 16, 256, 1024, 10_000), bars, strict=True):
        assert 1.0 - (1.0 - tail(-bar)) ** n == pytest.approx(reference, rel=1e-6)


def _noisy_job(workers: int, late: float, seed: int, noise: float = 0.1) -> tuple[dict[str, list[float]], dict[str, list[tuple[int, int, float, None]]]]:
    """Each worker's five times at batch 10 around 100 ms (`noise`; `late`: the last worker's times
    that much slower), and a history of 30 times that tells the noise."""
    rnd = random.Random(seed)
    times = {f"w{i}": [100.0 * (1 + rnd.gauss(0.0, noise)) for _ in range(5)] for i in range(workers)}
    times[f"w{workers - 1}"] = [t * (1 + late) for t in times[f"w{workers - 1}"]]
    history = {k: [(s, 10, 100.0 * (1 + rnd.gauss(0.0, noise)), None) for s in range(30)] for k in times}
    return times, history


def test_noise_among_a_thousand_workers_is_not_a_plan_far_from_balance() -> None:
    """1,024 workers of the same speed, 10% noise: the slowest mean is ~30% above the fastest by noise
    alone, which beat the width and two standard errors of a pair in 3 of these 20 jobs; a worker
    twice as slow still counts."""
    for seed in range(20):
        times, history = _noisy_job(1024, 0.0, seed)
        plan, lower, upper = dict.fromkeys(times, 10), dict.fromkeys(times, 1), dict.fromkeys(times, 100)
        assert not far_from_balance(times, history, plan, lower, upper, 0.2), seed
    slow, history = _noisy_job(1024, 1.0, 0)
    assert far_from_balance(slow, history, plan, lower, upper, 0.2)


def _laws_after(workers: int, shift: float) -> WorkerLaws:
    """Laws of `workers` workers, the first `w0` settled at 1000 ms (10% noise) then `shift` slower
    for ALONG_ROUNDS rounds (the others push nothing)."""
    rnd = random.Random(7)
    laws = WorkerLaws(min_samples=3, deadband=0.1)
    for i in range(workers):
        laws.add(f"w{i}")
    for _ in range(WARMUP):
        laws.record("w0", 100, 1000.0, None)
    for _ in range(20):
        laws.record("w0", 100, 1000.0 * (1 + rnd.gauss(0.0, 0.1)), None)
    for wobble in (-0.01, 0.0, 0.01):
        laws.record("w0", 100, 1000.0 * (1 + shift + wobble), None)
    return laws


def test_a_shift_that_moves_a_worker_along_in_a_small_job_does_not_among_a_thousand() -> None:
    """30% slower for three rounds (10% noise; ~3.5 standard errors): among 8 workers it changed along
    with another; among 1,024, where some worker is that far off by noise alone at most decisions,
    it did not. A doubling is a change among any number."""
    assert _laws_after(REFERENCE_WORKERS, 0.3).forget_along(["w0"], ALONG_ROUNDS)
    assert not _laws_after(1024, 0.3).forget_along(["w0"], ALONG_ROUNDS)
    doubled = _laws_after(1024, 1.0)
    assert doubled.changed == {"w0"} or doubled.forget_along(["w0"], ALONG_ROUNDS)
