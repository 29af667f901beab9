"""The checks a checkpoint passes before a resume loads it: a good one passes with its job changes,
each spoilt field is an InvalidCheckpoint naming it (the resume with real processes is
tests/e2e/test_checkpoint_faults.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from ps.rounds.checkpoint_checks import COUNTER_LIMIT, InvalidCheckpoint, check_checkpoint
from ps.server_job import Job, build_job
from tests.conftest import job_args


@pytest.fixture(scope="module")
def job() -> Iterator[Job]:
    built = build_job(job_args("--epochs", "3"))
    yield built
    built.evaluator.close()
    built.metrics.close()


def good_state(job: Job) -> dict[str, Any]:
    """The job's checkpoint with a momentum buffer, as after a step."""
    state = job.coordinator.checkpoint_state()
    state["optimizer"]["state"] = {0: {"momentum_buffer": torch.zeros(state["params"].numel())}}
    return state


def group(state: dict[str, Any]) -> dict[str, Any]:
    return state["optimizer"]["param_groups"][0]


def numel(job: Job) -> int:
    return job.coordinator.layout.numel


def test_a_good_checkpoint_passes_with_the_job_changes(job: Job) -> None:
    state = good_state(job)
    assert check_checkpoint(state, job.spec, numel(job)) == {}
    longer = build_job(job_args("--epochs", "5"))
    try:
        assert check_checkpoint(state, longer.spec, numel(job)) == {"epochs": (3, 5)}
    finally:
        longer.evaluator.close()
        longer.metrics.close()


SPOILERS: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("missing-round", lambda s: s.pop("round"), "it has no round"),
    ("spec-not-text", lambda s: s.update(spec=b"{}"), "its job spec must be JSON text, got bytes"),
    ("spec-not-json", lambda s: s.update(spec="{"), "its job spec: the job spec is not JSON"),
    ("spec-not-a-spec", lambda s: s.update(spec='{"lr": "fast"}'), "lr must be float"),
    ("spec-unknown-field", lambda s: s.update(spec='{"layers": 3}'), "unknown job spec fields"),
    ("another-job", lambda s: s.update(spec=s["spec"].replace('"lr": 0.1', '"lr": 0.5')), "written for a different job: --lr differs (--lr: checkpoint 0.5, command line 0.1)"),
    ("epoch-text", lambda s: s.update(epoch="abc"), "its epoch must be a whole number in [0, 1000000], got 'abc'"),
    ("epoch-float", lambda s: s.update(epoch=1.5), "its epoch must be a whole number"),
    ("epoch-bool", lambda s: s.update(epoch=True), "its epoch must be a whole number"),
    ("epoch-huge", lambda s: s.update(epoch=10**6 + 1), "its epoch must be a whole number in [0, 1000000]"),
    ("round-negative", lambda s: s.update(round=-1), f"its round must be a whole number in [0, {COUNTER_LIMIT}], got -1"),
    ("version-huge", lambda s: s.update(version=COUNTER_LIMIT + 1), "its version must be a whole number"),
    ("samples-huge", lambda s: s.update(samples=10**30), "its samples must be a whole number"),
    ("params-short", lambda s: s.update(params=s["params"][:-1]), "values, the model has"),
    ("params-int", lambda s: s.update(params=torch.zeros(s["params"].numel(), dtype=torch.int64)), "a flat float tensor"),
    ("params-list", lambda s: s.update(params=[0.0]), "a flat float tensor, got list"),
    ("params-nan", lambda s: s["params"].__setitem__(5, math.nan), "its params hold NaN or Inf values"),
    ("params-inf", lambda s: s["params"].__setitem__(5, -math.inf), "its params hold NaN or Inf values"),
    ("buffer-nan", lambda s: s["optimizer"]["state"][0]["momentum_buffer"].__setitem__(0, math.nan), "NaN or Inf"),
    ("buffer-short", lambda s: s["optimizer"]["state"][0].update(momentum_buffer=torch.zeros(3)), "float tensor of"),
    ("lr-zero", lambda s: group(s).update(lr=0.0), "the optimizer's lr must be a number in (0, inf), got 0.0"),
    ("lr-inf", lambda s: group(s).update(lr=math.inf), "the optimizer's lr must be a number in (0, inf)"),
    ("lr-text", lambda s: group(s).update(lr="0.1"), "the optimizer's lr must be a number"),
    ("momentum-nan", lambda s: group(s).update(momentum=math.nan), "the optimizer's momentum must be a number in [0, 1), got nan"),
    ("momentum-one", lambda s: group(s).update(momentum=1.0), "the optimizer's momentum must be a number in [0, 1)"),
    ("dampening", lambda s: group(s).update(dampening=-5), "the optimizer's dampening must be a number in [0, 1], got -5"),
    ("weight-decay", lambda s: group(s).update(weight_decay=-1e-4), "the optimizer's weight_decay must be a number in [0, inf)"),
    ("maximize", lambda s: group(s).update(maximize=True), "the optimizer's maximize must be False, got True"),
    ("nesterov-damped", lambda s: group(s).update(nesterov=True, dampening=0.5), "nesterov needs momentum > 0 and dampening 0"),
    # hyperparameters in range but not the job's (--momentum 0.9, no weight decay, no Nesterov): taken before
    ("momentum-other", lambda s: group(s).update(momentum=0.5), "its optimizer's momentum is 0.5, the job's is 0.9"),
    ("weight-decay-other", lambda s: group(s).update(weight_decay=0.25), "its optimizer's weight_decay is 0.25, the job's is 0.0"),
    ("nesterov-other", lambda s: group(s).update(nesterov=True), "its optimizer's nesterov is True, the job's is False"),
    ("fused-junk", lambda s: group(s).update(fused="junk"), "its optimizer's fused is 'junk', the job's is None"),
    ("unknown-key", lambda s: group(s).update(lookahead=5), "its optimizer's lookahead is 5, the job's optimizer has no lookahead"),
    ("two-groups", lambda s: s["optimizer"]["param_groups"].append({}), "one parameter group"),
    ("policy-junk", lambda s: s.update(controller={"junk": [1, 2]}), "its batch policy state does not restore"),
    ("policy-text", lambda s: s.update(controller="dynamic"), "its batch policy state does not restore"),
    ("policy-workers", lambda s: s["controller"].update(workers="all"), "its batch policy state does not restore"),
    ("cursor-text", lambda s: s.update(slice_cursor="0"), "its slice_cursor must be a whole number"),
    ("put-back-junk", lambda s: s.update(slices_put_back=[[0, 1]]), "its slices_put_back must be"),
]


@pytest.mark.parametrize(("spoil", "needle"), [(s, n) for _, s, n in SPOILERS], ids=[i for i, _, _ in SPOILERS])
def test_each_spoilt_field_is_refused_naming_it(job: Job, spoil: Callable[[dict[str, Any]], Any], needle: str) -> None:
    state = good_state(job)
    spoil(state)
    with pytest.raises(InvalidCheckpoint) as caught:
        check_checkpoint(state, job.spec, numel(job))
    assert needle in str(caught.value)


def test_a_state_that_is_not_a_mapping_is_refused(job: Job) -> None:
    for junk in ([1, 2], "ckpt", None):
        with pytest.raises(InvalidCheckpoint, match="not a checkpoint's fields"):
            check_checkpoint(junk, job.spec, numel(job))


def test_the_checks_change_nothing_they_read(job: Job) -> None:
    state = good_state(job)
    before = (state["params"].clone(), dict(group(state)), state["optimizer"]["state"][0]["momentum_buffer"].clone())
    check_checkpoint(state, job.spec, numel(job))
    assert torch.equal(state["params"], before[0]) and group(state) == before[1]
    assert torch.equal(state["optimizer"]["state"][0]["momentum_buffer"], before[2])


def test_another_jobs_checkpoint_is_refused_naming_the_flags_that_differ(job: Job) -> None:
    """The refusal named job spec fields (micro_batch, model_options, lr_scaling) where the user has
    flags (--micro-batch, --model-arg, --no-lr-scaling), and said "differ" of one."""
    from ps.rounds.checkpoint_state import resume_changes

    other = build_job(job_args("--epochs", "3", "--model-arg", "hidden=8", "--no-lr-scaling", "--micro-batch", "2"))
    try:
        with pytest.raises(ValueError) as error:
            resume_changes(good_state(job), other.spec)
    finally:
        other.evaluator.close()
        other.metrics.close()
    assert str(error.value) == (
        "the checkpoint was written for a different job: --no-lr-scaling, --micro-batch, --model-arg differ "
        "(--no-lr-scaling: checkpoint off, command line on; --micro-batch: checkpoint 1, command line 2; --model-arg: "
        "checkpoint {'hidden': 16}, command line {'hidden': 8}); start the server with the job's original flags")
