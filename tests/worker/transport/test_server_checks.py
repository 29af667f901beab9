"""What a worker takes from its server (worker/transport/server_checks.py), which modules it imports a factory
from (common/job/registry.py), and the job spec's field types (common/job/spec.py): pure checks."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import fields, replace

import pytest
import torch

from common.job.models import build_model
from common.job.registry import ImportRefused, import_allowed
from common.job.spec import RESUMABLE_FIELDS, JobSpec
from common.transport.layout import Layout, TensorEntry
from common.transport.messages import GroupInfo, JoinInfo, StepHeader
from worker.transport import server_checks as checks


def plan(world_size: int = 0, rank: int = 0, **fields: object) -> StepHeader:
    base = {"round": 3, "version": 0, "epoch": 1, "batch_size": 8, "done": False, "lr": 0.1, "global_batch": 32}
    group = GroupInfo(world_size=world_size, rank=rank, backend="gloo" if world_size else "")
    return StepHeader(**{**base, **fields}, group=group)  # type: ignore[arg-type]


def test_import_prefixes_are_whole_module_names() -> None:
    assert import_allowed("mypkg", ["mypkg"]) and import_allowed("mypkg.models.big", ["mypkg"])
    assert not import_allowed("mypkgs", ["mypkg"]) and not import_allowed("builtins", ["mypkg", ""])
    assert import_allowed("anything", None)  # the server: its operator names the modules


def test_a_refused_factory_path_imports_nothing() -> None:
    sys.modules.pop("tests.common.job.test_models", None)
    with pytest.raises(ImportRefused, match="--allow-import tests"):
        build_model("tests.common.job.test_models:exploding_model", (1, 8, 8), 10, {}, 0, allowed=())
    assert "tests.common.job.test_models" not in sys.modules


@pytest.mark.parametrize(("field", "value", "message"), [
    ("seed", "1", "seed must be int"), ("workers", 2.0, "workers must be int"), ("workers", True, "workers must be int"),
    ("lr", float("nan"), "lr must be float"), ("lr", "0.1", "lr must be float"), ("allreduce", 1, "allreduce must be bool"),
    ("model", 7, "model must be str"), ("model_options", {"a": object()}, "model_options must be dict"),
    ("lr_milestones", ("3",), "lr_milestones must be tuple"), ("seed", -1, "seed must be in [0, 2^62)"),
    ("global_batch", 2**31, "at most 2147483647"), ("model", "mlp\x1b", "printable characters"),
])
def test_every_spec_field_is_type_and_range_checked(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        JobSpec(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ['[1]', '{"lr_milestones": 3}', '{"seed": "exec"}', 'not json', '{"nope": 1}'])
def test_a_spec_from_the_wire_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(checks.UntrustedReply, match="the server's job spec is refused"):
        checks.job_spec(text)
    assert checks.job_spec(json.dumps({"lr": 1, "lr_milestones": [2, 4]})).lr_at(4) == pytest.approx(0.01)


def test_plans_and_batches_within_the_workers_bounds() -> None:
    checks.step_plan(plan(), max_batch=8)
    checks.step_plan(plan(batch_size=0), max_batch=8)  # parked
    checks.step_plan(plan(batch_size=0, global_batch=0), max_batch=8)  # nobody planned
    checks.step_plan(plan(batch_size=99, done=True), max_batch=8)  # the job is over: nothing is drawn
    checks.step_plan(plan(batch_size=24), max_batch=8, micro_batch=4)  # the memory bounds a micro-batch
    checks.step_plan(plan(path="ps"), max_batch=8)  # --allreduce auto's trial: the path from this reply on
    checks.step_plan(plan(world_size=2, path="allreduce"), max_batch=8)
    checks.step_plan(plan(), max_batch=8, samples=8)  # the whole training set
    with pytest.raises(checks.UntrustedReply, match="above the training set's 7 samples"):
        checks.step_plan(plan(), max_batch=8, samples=7)
    for bad, max_batch, micro in ((plan(batch_size=9), 8, 1), (plan(batch_size=33), 0, 1), (plan(batch_size=-1), 0, 1),
                                  (plan(batch_size=6), 0, 4), (plan(lr=float("inf")), 0, 1), (plan(round=-1), 0, 1),
                                  (plan(world_size=2, rank=2), 0, 1), (plan(global_batch=2**31), 0, 1),
                                  (plan(path="allreduce"), 0, 1), (plan(path="gpu"), 0, 1),
                                  (replace(plan(world_size=2), group=GroupInfo(world_size=2, backend="mpi")), 0, 1),
                                  (replace(plan(), group=GroupInfo(generation=-1)), 0, 1)):
        with pytest.raises(checks.UntrustedReply):
            checks.step_plan(bad, max_batch, micro)


def test_a_probe_step_is_a_bsp_batch_in_no_group_asking_nothing_else() -> None:
    bsp, asp = JobSpec(global_batch=32), JobSpec(global_batch=32, mode="asp")
    checks.probe_step(plan(probe=True), bsp)
    checks.probe_step(plan(probe=True, done=True, batch_size=0), asp)  # the job is over: nothing is probed
    checks.probe_step(plan(world_size=2, path="allreduce"), bsp)  # no probe: the job's path
    for bad, spec, said in ((plan(probe=True), asp, "probes are BSP's"),
                            (plan(probe=True, batch_size=0), bsp, "batch 0"),
                            (plan(probe=True, world_size=2), bsp, "names a group"),
                            (plan(probe=True, snapshot_requested=True), bsp, "a snapshot"),
                            (plan(probe=True, path="ps"), bsp, "or a path")):
        with pytest.raises(checks.UntrustedReply, match=said):
            checks.probe_step(bad, spec)


def test_replies_heartbeats_and_shards() -> None:
    checks.reply_length(0, 10)
    checks.reply_length(10, 10)
    with pytest.raises(checks.UntrustedReply, match="carries 9 values, not the 10"):
        checks.reply_length(9, 10)
    with pytest.raises(checks.UntrustedReply, match="NaN or Inf"):
        checks.finite_values(torch.tensor([0.0, float("inf")]))
    assert checks.heartbeat_interval(0.25) == 0.25
    for seconds in (0.001, 0.0, float("nan"), 1e9):
        with pytest.raises(checks.UntrustedReply, match="heartbeat interval"):
            checks.heartbeat_interval(seconds)
    checks.shard_ranges([("10.0.0.5:7000", 4, 8), ("10.0.0.5:7001", 8, 10)], 10, "10.0.0.5:50051")
    checks.shard_ranges([("[::1]:7000", 4, 10)], 10, "[::1]:50051")
    checks.shard_ranges([("10.0.0.6:7000", 4, 10)], 10, "10.0.0.5:50051", allowed_hosts=["10.0.0.6"])
    for ranges in ([("10.0.0.6:7000", 4, 10)], [("10.0.0.5:7000", 4, 9)], [("10.0.0.5:7000", 4, 6), ("10.0.0.5:7001", 7, 10)],
                   [("10.0.0.5:7000", 0, 10)]):
        with pytest.raises(checks.UntrustedReply):
            checks.shard_ranges(ranges, 10, "10.0.0.5:50051")


def join_reply(**fields: object) -> JoinInfo:
    base = {"worker_id": "w-0a1b2c3d", "index": 0, "batch_size": 8, "round": 0, "version": 0, "epoch": 0,
            "job_json": "{}", "layout": Layout((TensorEntry("w", (2, 3), "float32"),)), "heartbeat_interval_s": 1.0,
            "secret": "ab" * 32}
    return JoinInfo(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "said"), [
    ({"worker_id": ""}, "worker id ''"), ({"secret": ""}, "secret ''"), ({"worker_id": "w\x1b[2J"}, "worker id"),
    ({"secret": "s" * 257}, "1 to 256 printable"), ({"index": -1}, "negative round, version, epoch or join order"),
    ({"round": -1}, "negative"), ({"layout": Layout(())}, "layout holds no values"),
    ({"layout": Layout((TensorEntry("w", (-2, 3), "float32"),))}, "shape [-2, 3]"),
    ({"group": GroupInfo(1, -1, 2, "mpi")}, "backend 'mpi'"),
])
def test_a_join_reply_names_the_worker_and_its_place_within_bounds(fields: dict[str, object], said: str) -> None:
    checks.joined(join_reply())
    checks.joined(join_reply(group=GroupInfo(3, -1, 2, "gloo")))  # not in the generation yet: a plan will say
    with pytest.raises(checks.UntrustedReply, match=re.escape(said)):
        checks.joined(join_reply(**fields))


def test_a_join_replys_num_params_is_its_layouts_number_of_values() -> None:
    six = Layout((TensorEntry("w", (2, 3), "float32"),))
    checks.num_params(6, six)
    for said in (5, 0, 7, -6):
        with pytest.raises(checks.UntrustedReply, match=re.escape(f"says num_params {said}, where its layout holds 6 values")):
            checks.num_params(said, six)


def test_a_plans_epoch_is_one_of_the_jobs_and_its_end_only_in_the_last_plan() -> None:
    spec = JobSpec(global_batch=32, epochs=2, sampling="independent")
    checks.plan_epoch(plan(epoch=0), spec)
    checks.plan_epoch(plan(epoch=1), spec)
    checks.plan_epoch(plan(epoch=2, done=True), spec)  # the plan that ends the job: its epochs all trained
    for bad, said in ((plan(epoch=2), "is at epoch 2, past the job's last epoch 1"),
                      (plan(epoch=3, done=True), "ends the job at epoch 3, past its end at epoch 2")):
        with pytest.raises(checks.UntrustedReply, match=re.escape(said)):
            checks.plan_epoch(bad, spec)


def test_an_asp_learning_rate_stays_within_the_jobs_schedule() -> None:
    asp = JobSpec(global_batch=32, mode="asp", lr=0.1, lr_milestones=(2,), lr_gamma=0.5)
    checks.asp_lr(plan(lr=0.1 * 8 / 32), asp)
    checks.asp_lr(plan(lr=0.1), asp)  # without --lr-scaling
    checks.asp_lr(plan(lr=1e300), JobSpec(global_batch=32))  # BSP: the server steps, the worker does not
    checks.asp_lr(plan(lr=1e300, done=True), asp)
    for bad in (plan(lr=1e300), plan(lr=0.1, epoch=2), plan(lr=0.11)):
        with pytest.raises(checks.UntrustedReply, match="above the job's"):
            checks.asp_lr(bad, asp)
    checks.local_steps(checks.MAX_REFUSED_STEPS - 1, 1e30)
    with pytest.raises(checks.UntrustedReply, match=f"{checks.MAX_REFUSED_STEPS} local steps in a row could overflow"):
        checks.local_steps(checks.MAX_REFUSED_STEPS, 1e30)


def test_a_replys_header_and_payload_are_what_was_asked() -> None:
    checks.header_place(0, True)
    checks.header_place(3, False)
    checks.payload(False, False)
    checks.payload(True, True)
    checks.values_sent(0, done=False, required=False)  # a header alone where it may be one (a parked poll)
    checks.values_sent(0, done=True, required=True)  # the job is over: nothing is trained on
    with pytest.raises(checks.UntrustedReply, match="carries no values, where this worker asked for its parameters"):
        checks.values_sent(0, done=False, required=True)
    with pytest.raises(checks.UntrustedReply, match="starts without its header"):
        checks.header_place(0, False)
    with pytest.raises(checks.UntrustedReply, match="second header, on chunk 2"):
        checks.header_place(2, True)
    with pytest.raises(checks.UntrustedReply, match="carries the optimizer's state, where this worker asked for parameters"):
        checks.payload(True, False)


def test_a_spec_may_change_only_where_one_job_may() -> None:
    """A resume's changes (common.job.spec.RESUMABLE_FIELDS) are one job; any other difference is a server
    that contradicts itself, refused naming each field and both values."""
    held = JobSpec(workers=2, global_batch=32)
    assert set(RESUMABLE_FIELDS) <= {f.name for f in fields(JobSpec)}
    checks.same_job(held, replace(held, epochs=20, balance="busy", allreduce=True, overlap=False,
                                  sampling="independent", gradient_norms=False), "Join reply")
    with pytest.raises(checks.UntrustedReply, match=re.escape(
            "the server's Join reply names another job than the one it gave this worker before (mode 'bsp' -> 'asp', "
            "global_batch 32 -> 64)")):
        checks.same_job(held, replace(held, mode="asp", global_batch=64, epochs=3), "Join reply")
