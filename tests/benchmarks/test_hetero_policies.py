"""benchmarks.hetero.policies: the batch-policy comparison from a run's metrics events (pure)."""

from __future__ import annotations

import pytest

from benchmarks.hetero.policies import compare, measured_costs, policy_record


def adjust(changed: bool, phase: str | None = None, **fields: object) -> dict:
    return {"event": "adjust", "changed": changed, **({"phase": phase} if phase else {}), **fields}


EVENTS = [
    adjust(True, "replan"),
    adjust(False, "wait"),
    adjust(True, "probe"),
    adjust(True, "solve", previous={"predicted_round_ms": 50.0, "measured_round_ms": 60.0, "rounds": 4}),
    adjust(False, "hold", previous={"predicted_round_ms": 40.0, "measured_round_ms": 41.0, "rounds": 8},
           fits={"a": {"q": 0.2, "s": 5.0}, "b": {"q": 0.2, "s": 5.0}, "c": {"q": 0.8, "s": 120.0}}, overhead_ms=2.0),
    adjust(False, "hold", previous={"predicted_round_ms": 40.0, "measured_round_ms": 10.0, "rounds": 1}),
    {"event": "epoch", "batch_sizes": {"a": 64, "b": 64, "c": 0}, "compute_ms": {"a": 18.0, "b": 19.8, "c": 130.0}},
]


def test_policy_record_counts_decisions_after_the_probe_and_the_prediction_error() -> None:
    record = policy_record(EVENTS)
    assert (record["decisions"], record["probe_decisions"], record["decisions_after_probe"]) == (2, 1, 1)
    assert record["decisions_after_probe_besides_reprobes"] == 1
    reprobed = policy_record([*EVENTS[:5], adjust(True, "reprobe"), adjust(False, "wait"), adjust(True, "solve")])
    assert (reprobed["decisions_after_probe"], reprobed["decisions_after_probe_besides_reprobes"]) == (3, 1)
    assert record["parked"] == ["c"] and record["busy_spread_above_min_batch"] == pytest.approx(1.1)
    # the one-round measurement is left out; median of 1/6 and 1/41
    assert record["prediction_errors_counted"] == 2
    assert record["prediction_error_median"] == pytest.approx((10 / 60 + 1 / 41) / 2, abs=1e-4)


def test_compare_prices_each_plan_against_the_optimum_with_and_without_parking() -> None:
    costs, overhead = measured_costs(EVENTS)
    out = compare(costs, overhead, 128, 1, {"model": {"a": 64, "b": 64, "c": 0}, "dynamic": {"a": 60, "b": 60, "c": 8}})
    assert out["optimum_parked"]["parked"] == ["c"] and out["optimum_parked"]["round_ms"] == pytest.approx(17.8 + 2.0)
    assert out["optimum_held"]["round_ms"] == pytest.approx(0.8 + 120.0 + 2.0)
    assert out["runs"]["model"]["of_optimum"] == 1.0
    assert out["runs"]["dynamic"]["of_optimum"] == pytest.approx(19.8 / (0.8 * 8 + 120 + 2), rel=1e-3)


@pytest.mark.parametrize("case", ["quickstart", "hl8-fixed"])
def test_case_targets_read_the_runs(case: str) -> None:
    from benchmarks.hetero.modes import case_targets

    runs = {"dynamic": {"samples_per_s": 100.0, "policy": {"decisions": 5}},
            "model": {"samples_per_s": 120.0, "policy": {"decisions": 2, "decisions_after_probe_besides_reprobes": 1,
                                                          "busy_spread_above_min_batch": 1.05,
                                                          "prediction_error_median": 0.03}}}
    targets = case_targets(case, runs, {"runs": {"model": {"of_optimum": 0.97}}})
    assert all(t["pass"] for t in targets), targets
    assert len(targets) == (6 if case == "hl8-fixed" else 5)


def test_busy_spread_averages_the_trailing_epochs_at_the_final_plan() -> None:
    plan = {"a": 64, "b": 64, "c": 0}
    epochs = [{"event": "epoch", "batch_sizes": {"a": 60, "b": 68, "c": 0}, "compute_ms": {"a": 10.0, "b": 40.0}},
              *({"event": "epoch", "batch_sizes": plan, "compute_ms": {"a": 20.0, "b": t}} for t in (19.0, 21.0, 26.0))]
    # the epoch at the older plan is left out; b's mean over the three is 22.0
    assert policy_record(epochs)["busy_spread_above_min_batch"] == pytest.approx(22.0 / 20.0)
    assert policy_record(epochs[:1] + epochs[-1:])["busy_spread_above_min_batch"] == pytest.approx(26.0 / 20.0)
