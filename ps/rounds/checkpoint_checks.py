"""The checks a checkpoint passes before a resume loads anything from it.

A file whose checksum verifies is still data from a disk, trusted no more than a request: every field
this server reads is checked for its type and range before the coordinator takes it. The job's spec
must parse (JSON, then a valid JobSpec) and be this job's; the counters must be whole numbers in
[0, COUNTER_LIMIT] (the epoch at most JobSpec's MAX_EPOCHS); the parameters finite and as many as the
model has; the optimizer state one the job's optimizer loads (finite buffers of that length,
hyperparameters within what it accepts: common.params.hyperparameters, and but for the learning rate
the job spec's own: the load would take them over the job's); the batch policy's state one
that restores; the exact epochs' cursor whole numbers. Each failure is an InvalidCheckpoint naming the
field and what was wrong with it. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import torch

from common.job.spec import MAX_EPOCHS, JobSpec
from common.params.stepping import make_stepper
from ps.control.policy import policy_from_state
from ps.rounds.checkpoint_state import resume_changes

COUNTERS = ("round", "version", "epoch", "samples")
COUNTER_LIMIT = 2**53
"""The largest step or sample count a checkpoint may hold: exact as a float64 and in JSON, and beyond
any job (285 years at a million steps a second)."""
REQUIRED = ("format", "spec", "params", "optimizer", "controller", *COUNTERS)
"""The fields every resume reads (the `model` entry is for readers of the file, not for a resume)."""
RESTORE_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError)
"""What reading a malformed nested state back (a policy's, an optimizer's) may raise."""


class InvalidCheckpoint(ValueError):
    """A checkpoint that verifies but holds a field this server cannot use; the message names it."""


def check_checkpoint(checkpoint: Any, spec: JobSpec, numel: int) -> dict[str, tuple[Any, Any]]:
    """The checkpoint's job changes (checkpoint_state.resume_changes) once every field passed;
    InvalidCheckpoint naming the first that did not. `numel`: the model's parameter count."""
    if not isinstance(checkpoint, dict):
        raise InvalidCheckpoint(f"it holds a {type(checkpoint).__name__}, not a checkpoint's fields")
    missing = [key for key in REQUIRED if key not in checkpoint]
    if missing:
        raise InvalidCheckpoint(f"it has no {', '.join(missing)}")
    changes = _job_changes(checkpoint, spec)
    for key in COUNTERS:
        _whole(checkpoint, key, MAX_EPOCHS if key == "epoch" else COUNTER_LIMIT)
    _check_params(checkpoint["params"], numel)
    stepper = make_stepper(torch.empty(numel), spec)
    job_group = stepper.state_dict()["param_groups"][0]
    try:
        stepper.load_state_dict(checkpoint["optimizer"])
    except RESTORE_ERRORS as exc:
        raise InvalidCheckpoint(f"its optimizer state does not load: {exc}") from None
    _check_job_hyperparameters(checkpoint["optimizer"]["param_groups"][0], job_group)
    try:
        policy_from_state(checkpoint["controller"])
    except RESTORE_ERRORS as exc:
        raise InvalidCheckpoint(f"its batch policy state does not restore: {exc}") from None
    _check_slices(checkpoint)
    return changes


def _job_changes(checkpoint: dict[str, Any], spec: JobSpec) -> dict[str, tuple[Any, Any]]:
    text = checkpoint["spec"]
    if not isinstance(text, str):
        raise InvalidCheckpoint(f"its job spec must be JSON text, got {type(text).__name__}")
    try:
        JobSpec.from_json(text)
        return resume_changes(checkpoint, spec)
    except (ValueError, TypeError) as exc:  # TypeError: a JSON value of a field no JobSpec takes
        raise InvalidCheckpoint(f"its job spec: {exc}") from None


def _check_job_hyperparameters(saved: dict[str, Any], job: dict[str, Any]) -> None:
    """The saved group's hyperparameters are its job's (the spec's, already checked to be this job's):
    the load takes them over the job's, so a momentum or weight decay edited in the file would train
    on silently. The learning rate follows the schedule (set from the epoch after the load)."""
    for key, value in saved.items():
        if key in ("lr", "params"):
            continue
        if key not in job:
            raise InvalidCheckpoint(f"its optimizer's {key} is {value!r:.60}, the job's optimizer has no {key}")
        if not _same(value, job[key]):
            raise InvalidCheckpoint(f"its optimizer's {key} is {value!r:.60}, the job's is {job[key]!r} (a "
                                    f"checkpoint's optimizer hyperparameters are its job spec's)")


def _same(value: Any, expected: Any) -> bool:
    """Equal as a hyperparameter: betas as a tuple or a list, 0 and 0.0 alike (torch writes dampening 0),
    never a bool for a number."""
    if isinstance(value, (list, tuple)) and isinstance(expected, (list, tuple)):
        return list(value) == list(expected)
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (value, expected)):
        return bool(value == expected)
    return type(value) is type(expected) and bool(value == expected)


def _whole(checkpoint: dict[str, Any], key: str, limit: int) -> int:
    value = checkpoint[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise InvalidCheckpoint(f"its {key} must be a whole number in [0, {limit}], got {value!r:.60}")
    return value


def _check_params(params: Any, numel: int) -> None:
    if not isinstance(params, torch.Tensor) or not params.is_floating_point() or params.dim() != 1:
        raise InvalidCheckpoint(f"its params must be a flat float tensor, got {type(params).__name__}")
    if params.numel() != numel:
        raise InvalidCheckpoint(f"its params hold {params.numel()} values, the model has {numel}")
    if not bool(torch.isfinite(params).all()):
        raise InvalidCheckpoint("its params hold NaN or Inf values")


def _check_slices(checkpoint: dict[str, Any]) -> None:
    """The exact epochs' cursor (ps.rounds.epoch_slices checks the ranges against the data set's size)."""
    if "slice_cursor" not in checkpoint:
        return
    for key in ("slice_epoch", "slice_cursor"):
        _whole(checkpoint, key, COUNTER_LIMIT)
    ranges = checkpoint.get("slices_put_back")
    ok = isinstance(ranges, list) and all(
        isinstance(r, (list, tuple)) and len(r) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= COUNTER_LIMIT for v in r) for r in ranges)
    if not ok:
        raise InvalidCheckpoint(f"its slices_put_back must be [epoch, offset, count] triples of whole numbers, "
                                f"got {ranges!r:.80}")
