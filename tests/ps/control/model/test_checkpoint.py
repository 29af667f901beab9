"""The model policy's state in checkpoints (ps.control.model.checkpoint, state): a round trip that
decides alike, a resume under other settings, and states that contradict themselves refused."""

from __future__ import annotations

import json

import pytest

from ps.control.config import PolicyConfig
from ps.control.model.policy import ModelPolicy
from ps.control.policy import policy_from_state, reconfigured
from tests.model_policy_runs import check_plan, model, run
from tests.simulated_workers import assert_decides_alike


def test_state_round_trips_and_resumes_under_other_settings() -> None:
    costs = {"a": (0.2, 5.0), "b": (0.2, 5.0), "d": (0.8, 120.0)}
    ctl = model(costs, 128)
    run(ctl, costs, rounds=25)
    state = json.loads(json.dumps(ctl.state_dict()))
    back = policy_from_state(state)
    assert isinstance(back, ModelPolicy)
    assert json.dumps(back.state_dict(), sort_keys=True) == json.dumps(state, sort_keys=True)
    # the restored policy goes on deciding like the original (its workers' first steps after the
    # restore are warm-up, not fitted: the same decisions, the plans within rounding)
    assert_decides_alike(run(back, costs, rounds=15, seed=3), run(ctl, costs, rounds=15, seed=3), costs)
    # model -> dynamic -> model: the dynamic policy replans the parked worker in, the model's fits are gone
    dynamic = reconfigured(ctl, PolicyConfig(policy="dynamic", global_batch=128))
    assert dynamic.parked() == [] and sum(dynamic.plan().values()) == 128
    again = reconfigured(dynamic, ctl.config)
    check_plan(again)
    # --no-park on resume: the parked worker is planned in again
    unparked = reconfigured(ctl, PolicyConfig(policy="model", global_batch=128, park=False))
    assert unparked.parked() == [] and sum(unparked.plan().values()) == 128


def test_a_state_that_contradicts_itself_is_refused() -> None:
    costs = {"a": (0.2, 5.0), "b": (0.2, 5.0), "d": (0.8, 120.0)}
    ctl = model(costs, 128)
    run(ctl, costs, rounds=25)
    state = ctl.state_dict()
    assert ctl.parked() == ["d"]
    broken = json.loads(json.dumps(state))
    broken["model"]["workers"]["d"]["parked"] = None
    with pytest.raises(ValueError, match="batch 0 but is not parked"):
        policy_from_state(broken)
    foreign = json.loads(json.dumps(state))
    foreign["config"]["policy"] = "oracle"
    with pytest.raises(ValueError, match="names policy 'oracle'"):
        policy_from_state(foreign)
    no_model = json.loads(json.dumps(state))
    del no_model["model"]
    with pytest.raises(ValueError):
        policy_from_state(no_model)
    older = json.loads(json.dumps(state))  # written before the re-solve's confirmation existed
    del older["model"]["confirming"]
    assert policy_from_state(older).state_dict()["model"]["confirming"] is False
    garbled = json.loads(json.dumps(state))
    garbled["model"]["confirming"] = "yes"
    with pytest.raises(ValueError, match="'confirming' must be true or false"):
        policy_from_state(garbled)


def test_a_state_written_by_the_single_controller_still_loads() -> None:
    """A checkpoint's controller state from before the policies were split (no policy-specific keys,
    no `samples`) loads as the policy its config names."""
    state = {"version": 1, "adjustments": 2,
             "config": {"policy": "dynamic", "global_batch": 64, "min_batch": 1, "max_batch": None,
                        "deadband": 0.1, "ewma_alpha": 0.5, "keep_global_sum": True, "dynamic_start": "uniform",
                        "min_samples": 3},
             "workers": [{"id": "a", "cores": 1.0, "min_batch": 1, "max_batch": 64, "batch": 40, "ewma_ms": 40.0,
                          "throughput": 1.0},
                         {"id": "b", "cores": 1.0, "min_batch": 1, "max_batch": 64, "batch": 24, "ewma_ms": 48.0,
                          "throughput": 0.5}]}
    ctl = policy_from_state(state)
    assert ctl.config.policy == "dynamic" and ctl.config.park and ctl.plan() == {"a": 40, "b": 24}
    as_model = reconfigured(ctl, PolicyConfig(policy="model", global_batch=64))
    assert sum(as_model.plan().values()) == 64
