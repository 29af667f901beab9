"""The hyperparameters each optimizer accepts: the job's own groups pass, every value outside what
the optimizer takes is a ValueError naming it, and the store refuses such a state dict whole."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from common.job.spec import JobSpec
from common.params.hyperparameters import check_adam, check_sgd
from common.params.stepping import adam_group, make_stepper, sgd_group

SGD = JobSpec(optimizer="sgd", momentum=0.9, weight_decay=1e-4, nesterov=True)
ADAM = JobSpec(optimizer="adam", weight_decay=1e-4)


def test_the_jobs_own_groups_pass() -> None:
    for spec in (SGD, JobSpec(momentum=0.0), JobSpec()):
        check_sgd(sgd_group(spec))
    check_adam(adam_group(ADAM))


@pytest.mark.parametrize(("change", "needle"), [
    ({"lr": 0}, "lr must be a number in (0, inf), got 0"),
    ({"lr": -0.1}, "lr must be a number in (0, inf)"),
    ({"lr": math.nan}, "lr must be a number in (0, inf), got nan"),
    ({"lr": True}, "lr must be a number"),
    ({"weight_decay": math.inf}, "weight_decay must be a number in [0, inf)"),
    ({"maximize": True}, "maximize must be False, got True"),
    ({"maximize": 0}, "maximize must be False, got 0"),
    ({"momentum": math.nan}, "momentum must be a number in [0, 1), got nan"),
    ({"momentum": 1}, "momentum must be a number in [0, 1), got 1"),
    ({"momentum": -0.5}, "momentum must be a number in [0, 1)"),
    ({"dampening": -5}, "dampening must be a number in [0, 1], got -5"),
    ({"dampening": 1.5}, "dampening must be a number in [0, 1]"),
    ({"nesterov": "yes"}, "nesterov must be False or True, got 'yes'"),
    ({"nesterov": True, "momentum": 0.0}, "nesterov needs momentum > 0 and dampening 0"),
    ({"nesterov": True, "dampening": 0.1}, "nesterov needs momentum > 0 and dampening 0"),
])
def test_sgd_refuses_what_it_does_not_take(change: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_sgd({**sgd_group(SGD), **change})
    assert needle in str(caught.value)


@pytest.mark.parametrize(("change", "needle"), [
    ({"betas": (0.9,)}, "betas must be two numbers in [0, 1)"),
    ({"betas": (0.9, 1.0)}, "betas[1] must be a number in [0, 1), got 1.0"),
    ({"betas": (math.nan, 0.999)}, "betas[0] must be a number in [0, 1), got nan"),
    ({"eps": 0.0}, "eps must be a number in (0, inf), got 0.0"),
    ({"maximize": True}, "maximize must be False"),
    ({"amsgrad": True}, "amsgrad and decoupled weight decay are not supported"),
    ({"lr": math.inf}, "lr must be a number in (0, inf)"),
])
def test_adam_refuses_what_it_does_not_take(change: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_adam({**adam_group(ADAM), **change})
    assert needle in str(caught.value)


def test_the_store_refuses_a_state_dict_with_a_bad_group_and_keeps_its_own() -> None:
    stepper = make_stepper(torch.zeros(10), SGD)
    before = stepper.state_dict()
    bad = {"state": {}, "param_groups": [{**sgd_group(SGD), "momentum": math.nan}]}
    with pytest.raises(ValueError, match="momentum must be a number in"):
        stepper.load_state_dict(bad)
    assert stepper.state_dict() == before
