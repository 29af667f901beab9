"""The coordinator's state in a checkpoint: what is written (the whole model, optimizer, batch policy and
counters, with the job's spec, and the concerns' own parts), and what a resume checks and loads (the
same job; the parameters and optimizer state of this server's range; where the job stood)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

from ps.control.config import config_changes
from ps.control.policy import BatchPolicy, policy_from_state
from common.job.spec import RESUMABLE_FIELDS, JobSpec
from ps.rounds.adaptive_batch import AdaptiveBatchSizing
from ps.rounds.admission import Admission
from ps.rounds.epochs import Epochs
from ps.rounds.sampling import Sampling
from ps.rounds.state import JobState
from ps.rounds.whole_model import WholeModel
from ps.shards.ranges import slice_optimizer_state

CHECKPOINT_FORMAT = 1


def params_digest(flat: torch.Tensor) -> str:
    """SHA-256 of the parameters' fp32 bytes (to show a resume restored them exactly)."""
    return hashlib.sha256(flat.detach().contiguous().numpy().tobytes()).hexdigest()


def checkpoint_state(state: JobState, flat: torch.Tensor, optimizer: dict[str, Any]) -> dict[str, Any]:
    """A self-contained snapshot of everything needed to resume, from the whole model's `flat`
    parameters (a copy) and `optimizer` state."""
    model, offset = {}, 0
    for entry in state.layout.entries:
        model[entry.name] = flat[offset : offset + entry.numel].view(entry.shape).clone()
        offset += entry.numel
    return {
        "format": CHECKPOINT_FORMAT,
        "spec": state.spec.to_json(),
        "model": model,
        "params": flat,
        "optimizer": optimizer,
        "controller": state.policy.state_dict(),  # the batch policy, under the key checkpoints have always had
        "round": state.round,
        "version": state.version,
        "epoch": state.epoch,
        "samples": state.samples,
    }


def resume_changes(checkpoint: dict[str, Any], spec: JobSpec) -> dict[str, tuple[Any, Any]]:
    """The fields of RESUMABLE_FIELDS that differ between the checkpoint's job and `spec`,
    {field: (checkpoint's, spec's)}; ValueError if the checkpoint is another job's."""
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint format {checkpoint.get('format')!r} is not {CHECKPOINT_FORMAT}")
    saved = json.loads(checkpoint["spec"])
    current = json.loads(spec.to_json())
    differ = sorted(k for k in current if saved.get(k) != current[k])
    refused = [k for k in differ if k not in RESUMABLE_FIELDS]
    if refused:
        values = "; ".join(f"{job_flag(k)}: checkpoint {_shown(saved.get(k), k)}, command line {_shown(current[k], k)}"
                           for k in refused)
        raise ValueError(f"the checkpoint was written for a different job: {', '.join(map(job_flag, refused))} "
                         f"{'differs' if len(refused) == 1 else 'differ'} ({values}); "
                         "start the server with the job's original flags")
    return {k: (saved.get(k), current[k]) for k in differ}


NEGATED_FLAGS = {"overlap", "lr_scaling"}
"""Fields whose flag turns them off (--no-overlap): the flag is on where the field is False."""
_FLAGS = {"model_options": "--model-arg", "dataset_options": "--dataset-arg", "lr_scaling": "--no-lr-scaling",
          **RESUMABLE_FIELDS}
"""The ps-server flag of each job spec field whose flag is not its name with dashes."""


def job_flag(field: str) -> str:
    """The ps-server flag that sets job spec field `field` (`global_batch`: --global-batch)."""
    return _FLAGS.get(field, "--" + field.replace("_", "-"))


def _shown(value: Any, field: str) -> str:
    """A spec value in a refusal: a switch as on or off (as its flag reads), anything else as written, cut short."""
    return _flag_value(value, field) if isinstance(value, bool) else f"{value!r:.60}"


def describe_resume_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    """'--epochs 4 -> 8, --balance compute -> cycle' for the warning line of a resume that changes them."""
    return ", ".join(f"{RESUMABLE_FIELDS[k]} {_flag_value(old, k)} -> {_flag_value(new, k)}" for k, (old, new) in changes.items())


def _flag_value(value: Any, field: str) -> str:
    if value is None:  # a field the checkpoint's job predates
        return "unset"
    if isinstance(value, bool):
        return "on" if value != (field in NEGATED_FLAGS) else "off"
    return str(value)


def saved_policy(checkpoint: dict[str, Any], state: JobState) -> BatchPolicy:
    """The checkpoint's batch policy (its key is still "controller"), once the checkpoint is one of this job's (ValueError otherwise)."""
    resume_changes(checkpoint, state.spec)
    try:
        return policy_from_state(checkpoint["controller"])
    except ValueError as exc:
        raise ValueError(f"the checkpoint's policy state cannot be read: {exc}") from None


def load_params(checkpoint: dict[str, Any], state: JobState) -> tuple[torch.Tensor, dict[str, Any]] | None:
    """Load the checkpoint's parameters and optimizer state into the store: all of them, or with
    --shards this server's range, returning the whole for the shards (None without --shards)."""
    if state.shards is None:
        state.store.load_state_dict({"params": checkpoint["params"], "optimizer": checkpoint["optimizer"]})
        return None
    start, stop = state.shards.own
    own = slice_optimizer_state(checkpoint["optimizer"], state.layout.numel, start, stop)
    state.store.load_state_dict({"params": checkpoint["params"][start:stop], "optimizer": own})
    return checkpoint["params"], checkpoint["optimizer"]


class Checkpoints:
    """The checkpoint of the whole job: the shared state's part and each concern's."""

    def __init__(self, state: JobState, whole_model: WholeModel, epochs: Epochs, sampling: Sampling,
                 adaptive: AdaptiveBatchSizing, admission: Admission) -> None:
        self.state = state
        self.whole_model = whole_model
        self.epochs = epochs
        self.sampling = sampling
        self.adaptive = adaptive
        self.admission = admission

    def state_dict(self) -> dict[str, Any]:
        """A self-contained snapshot of everything needed to resume (tensors cloned)."""
        return {**checkpoint_state(self.state, self.whole_model.params(), self.whole_model.optimizer_state()),
                **self.adaptive.state_dict(), **self.sampling.state_dict()}

    def restore(self, checkpoint: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Load a checkpoint before the job starts; workers then rejoin. Returns the batch policy
        settings that differ from the checkpoint's, {field: (checkpoint's, this server's)}: this
        server's apply."""
        s = self.state
        saved = saved_policy(checkpoint, s)
        shard_state = load_params(checkpoint, s)
        if shard_state is not None:
            self.whole_model.hand_shards(shard_state)
        s.resume_at(int(checkpoint["round"]), int(checkpoint["version"]), int(checkpoint["epoch"]),
                    int(checkpoint["samples"]))
        self.epochs.resumed(s.samples)
        self.sampling.restore(checkpoint)  # the epoch's cursor and the ranges put back
        self.adaptive.restore(checkpoint)  # its B: the policy the checkpoint's is compared with and adopted into
        s.store.set_lr(self.adaptive.lr_at(s.epoch))
        self.admission.resume_with(saved)
        changes = config_changes(saved.config, s.policy.config)
        s.metrics.write("resume", step=s.step, epoch=s.epoch, round=s.round, version=s.version,
                        params_sha256=params_digest(checkpoint["params"]),
                        controller_changes={name: list(pair) for name, pair in changes.items()})
        return changes
