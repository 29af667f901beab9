"""The worker's collective (worker/paths/collective.py): the bucketed step equals the server's optimizer
step, the round check past fp32's counting, a group of three ranks in their own processes (gloo),
the reachable address and the reduce algorithm."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed import TCPStore

from common.job.models import build_model
from common.job.spec import JobSpec
from common.params.store import ParameterStore
from tests import collective_ranks
from tests.processes import ENV
from tests.rpc_calls import rand
from common.transport.messages import GroupInfo, StepHeader
from worker.transport.shard_fanout import reachable_address
from worker.paths.collective import Collective


def test_reachable_address_falls_back_to_the_server_host() -> None:
    assert reachable_address("0.0.0.0", 7, "10.1.2.3:50051") == ("10.1.2.3", 7)
    assert reachable_address("", 7, "[::1]:50051") == ("::1", 7)
    assert reachable_address("127.0.0.1", 7, "10.1.2.3:50051") == ("127.0.0.1", 7)


def test_bucketed_step_equals_the_server_optimizer_step() -> None:
    """Several buckets in flight, then the server's optimizer (momentum, weight decay) on the local copy
    (a group of one, in this process: the reduction is the identity)."""
    spec = JobSpec(workers=1, global_batch=8, momentum=0.9, weight_decay=1e-3, nesterov=True)
    model = build_model("mlp", (64,), 10, {"hidden": 16}, 0)
    reference = ParameterStore.of_model(model, spec)
    host = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    collective = Collective(spec, model, collective_ranks.tcp_stores(host.port), timeout_s=30, bucket_bytes=1024)
    try:
        assert collective.bucket_numel * 3 < reference.numel
        for round in range(3):
            grads = rand(reference.numel, seed=round)
            plan = StepHeader(round, round, 0, 8, False, 0.0, 8, group=GroupInfo(1, 0, 1, "gloo"))
            assert collective.step(grads, 8, plan)
            reference.apply_gradient(grads.clone())
        assert collective.round == 3 and collective.reduces == 3
        torch.testing.assert_close(collective.params, reference.flat, rtol=0, atol=1e-7)
    finally:
        collective.close()


def test_the_round_check_holds_past_the_rounds_fp32_can_count() -> None:
    """Each rank adds its round into the fp32 bucket to check the group is in step; the round itself
    stops being exact in fp32 at 2^24 + 1, so the check adds it modulo ROUND_CHECK_MODULUS (it raised
    "collective out of step" at round 16,777,217 before)."""
    spec = JobSpec(workers=1, global_batch=8)
    model = build_model("mlp", (64,), 10, {"hidden": 16}, 0)
    host = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    collective = Collective(spec, model, collective_ranks.tcp_stores(host.port), timeout_s=30)
    try:
        for round in (2**24, 2**24 + 1, 2**31 + 3):
            plan = StepHeader(round, round, 0, 8, False, 0.0, 8, group=GroupInfo(1, 0, 1, "gloo"))
            assert collective.step(torch.zeros(collective.params.numel()), 8, plan)
        assert collective.round == 2**31 + 4
    finally:
        collective.close()


@pytest.mark.parametrize("norms", [True, False])
def test_the_gradient_norms_are_measured_only_when_the_job_asks(norms: bool) -> None:
    """|g_k|² and |g|² go with the round report for --adaptive-batch (the spec's gradient_norms); a job
    without it reports zeros (not measured) and spares the two reads of the gradient."""
    spec = JobSpec(workers=1, global_batch=8, gradient_norms=norms)
    model = build_model("mlp", (64,), 10, {"hidden": 16}, 0)
    host = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    collective = Collective(spec, model, collective_ranks.tcp_stores(host.port), timeout_s=30)
    try:
        grads = rand(collective.params.numel(), seed=1)
        assert collective.step(grads, 8, StepHeader(0, 0, 0, 8, False, 0.0, 8, group=GroupInfo(1, 0, 1, "gloo")))
        expected = float(grads.double().square().sum())
        assert collective.sq_norms == ((pytest.approx(expected), pytest.approx(expected)) if norms else (0.0, 0.0))
    finally:
        collective.close()


@pytest.mark.parametrize("algorithm", ["hub", "ring"])
def test_a_group_of_three_reduces_to_the_batch_weighted_mean(tmp_path: Path, algorithm: str) -> None:
    """Three ranks in their own processes (gloo), several bucket parts, a hub that is not rank 0 and
    moves, one rank further along than the others when the group forms (they adopt its parameters and
    momentum): every rank ends with the same bits, equal to the same steps taken in one process."""
    world = 3
    host = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.collective_ranks", str(r), str(world), str(host.port), algorithm,
                          str(outs[r])], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]
    for proc in procs:
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, output
    saved = [torch.load(out) for out in outs]
    assert all(torch.equal(saved[0]["params"], s["params"]) and torch.equal(saved[0]["state"], s["state"]) for s in saved[1:])
    reference = ParameterStore.of_model(collective_ranks.model(), collective_ranks.spec(world, algorithm))
    assert _bucket_parts(reference.numel) > 2
    for round in range(collective_ranks.PRE):
        reference.apply_gradient(collective_ranks.veteran_grads(round, reference.numel))
    for round in range(collective_ranks.PRE, collective_ranks.PRE + collective_ranks.ROUNDS):
        total = sum(collective_ranks.batch(r, round) for r in range(world))
        mean = sum(collective_ranks.batch(r, round) * collective_ranks.grads(r, round, reference.numel) for r in range(world))
        reference.apply_gradient(mean / total)
    torch.testing.assert_close(saved[0]["params"], reference.flat, rtol=0, atol=1e-6)
    torch.testing.assert_close(saved[0]["state"], reference.flat_optimizer_state(), rtol=0, atol=1e-6)


def _bucket_parts(numel: int) -> int:
    return -(-(numel + 3) * 4 // collective_ranks.BUCKET_BYTES)


def test_the_algorithm_is_checked() -> None:
    assert JobSpec(allreduce=True).hub_reduce("gloo") and not JobSpec(allreduce=True).hub_reduce("nccl")
    assert JobSpec(allreduce=True, allreduce_algorithm="hub").hub_reduce("nccl")
    assert not JobSpec(allreduce=True, allreduce_algorithm="ring").hub_reduce("gloo")
    with pytest.raises(ValueError, match="allreduce algorithm must be one of"):
        JobSpec(allreduce=True, allreduce_algorithm="tree")
