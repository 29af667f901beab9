"""The BSP collective fast path with real processes on gloo: equal to the PS path, a step that reads
its report's reply at the next step, and re-forming the group when a worker leaves."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from ps.checkpoint import checkpoint_files, read_checkpoint
from common.transport.layout import flatten_params
from common.transport.messages import PushMeta
from tests.processes import Cluster, start_server
from worker import connect
from worker.training_loop import train
from worker.transport.client import PSClient, ServerError
from tests.fast_path_jobs import JOB, TINY, finish, report


# ------------------------------------------------------------ real processes


def _train_in_process(target: str, name: str) -> int:
    with connect(target, name=name, cores=1.0) as session:
        train(session, quiet=True)
        return session.steps


# two workers, two epochs of 45 steps in all (digits' training samples at a global batch of 64)
# each worker draws its own batches on both paths (the fast path does not take the server's slices)
EQUAL_JOB = [*JOB, "--workers", "2", "--global-batch", "64", "--epochs", "2", "--lr-milestones", "1",
             "--momentum", "0.9", "--nesterov", "--weight-decay", "1e-4", "--sampling", "independent"]


def _run_both(ps_server, threads, workdir: Path, ar_dir: Path, ps_dir: Path, resume: bool = False) -> tuple[Cluster, int]:
    """EQUAL_JOB on the fast path (a real server and two worker processes on gloo, checkpoints in
    `ar_dir`) and on the PS path (an in-process server and two in-process workers, checkpoints in
    `ps_dir`), each resumed from its directory if `resume`; returns the finished fast-path cluster
    and the steps each PS-path worker took."""
    workdir.mkdir()
    flags = {d: ["--checkpoint-dir", str(d), *(["--resume", str(d)] if resume else [])] for d in (ar_dir, ps_dir)}
    cluster = start_server(workdir, [*EQUAL_JOB, "--allreduce", *flags[ar_dir]])
    try:
        for i in range(2):
            cluster.start_worker(f"w{i}", "--device", "cpu")  # as the in-process PS-path workers compute
        server = ps_server(*EQUAL_JOB, *flags[ps_dir])
        steps = [threads.submit(_train_in_process, server.target, f"w{i}") for i in range(2)]
        (taken,) = {f.result(120) for f in steps}
        server.job.checkpointer.flush()
        server.call(server.job.final_checkpoint)
        finish(cluster, 120)
    finally:
        cluster.stop()
    return cluster, taken


def _assert_same_checkpoints(ps_dir: Path, ar_dir: Path, count: int) -> None:
    """Same rounds, parameters and momentum (to 1e-5) in the two directories' checkpoints."""
    ps, ar = ({p.name: read_checkpoint(p) for p in checkpoint_files(d)} for d in (ps_dir, ar_dir))
    assert ps.keys() == ar.keys() and len(ps) == count
    for name in ps:
        assert (ps[name]["round"], ps[name]["samples"]) == (ar[name]["round"], ar[name]["samples"])
        torch.testing.assert_close(ar[name]["params"], ps[name]["params"], rtol=0, atol=1e-5)
        momentum = [c["optimizer"]["state"][0]["momentum_buffer"] for c in (ar[name], ps[name])]
        assert momentum[1].abs().max() > 1e-3  # the PS path's has grown: a real comparison
        torch.testing.assert_close(*momentum, rtol=0, atol=1e-5)


def test_fast_path_equals_the_ps_path(ps_server, threads, tmp_path: Path) -> None:
    """Same seeds, same batches: after every epoch the fast path's server checkpoint (real processes,
    gloo) matches the PS path's (an in-process server and two in-process workers) to 1e-5, momentum
    included (rank 0's snapshot carries it). Resumed from the fast path's checkpoint after epoch 1,
    the last epoch again ends the same on both paths: the fast path's workers start from the
    checkpoint's momentum as the PS path's server does."""
    cluster, steps = _run_both(ps_server, threads, tmp_path / "first", tmp_path / "allreduce", tmp_path / "ps")
    assert steps == 45
    _assert_same_checkpoints(tmp_path / "ps", tmp_path / "allreduce", 2)  # after epoch 1 and at the end
    assert [e["world_size"] for e in cluster.events("regroup")] == [2]
    assert len(cluster.events("snapshot")) == 2 and len(cluster.events("eval")) == 2

    after_epoch_1 = checkpoint_files(tmp_path / "allreduce")[0]
    for resumed in ("resumed-ps", "resumed-allreduce"):
        (tmp_path / resumed).mkdir()
        shutil.copy(after_epoch_1, tmp_path / resumed / after_epoch_1.name)
    cluster, steps = _run_both(ps_server, threads, tmp_path / "second", tmp_path / "resumed-allreduce",
                               tmp_path / "resumed-ps", resume=True)
    assert steps == 45 - read_checkpoint(after_epoch_1)["round"] and [e["epoch"] for e in cluster.events("resume")] == [1]
    _assert_same_checkpoints(tmp_path / "resumed-ps", tmp_path / "resumed-allreduce", 2)


def test_a_step_reads_its_reports_reply_at_the_next_step(ps_server) -> None:
    """The fast path sends a step's report and returns with the new parameters without reading the
    reply; the next step reads it before its all-reduce, so the server's round close overlaps the next
    computation. The batch after the job's end is dropped: steps count the rounds taken."""
    server = ps_server(*TINY, "--workers", "1")
    with connect(server.target, name="w0", cores=1.0) as session:
        read: list[bool] = []
        start_push = session.client.start_push

        def recording_start_push(meta: PushMeta, *args: object):
            reply = start_push(meta, *args)
            if meta.kind != "report":  # rank 0's snapshots go through push(), read at once
                return reply
            index = len(read)
            read.append(False)

            def wait():
                read[index] = True
                return reply()

            return wait

        session.client.start_push = recording_start_push
        batches = session.batches()
        for expected in ([False], [True, False]):
            x, y = next(batches)
            session.model.zero_grad()
            torch.nn.functional.cross_entropy(session.model(x), y).backward()
            session.step()
            assert read == expected
            assert torch.equal(flatten_params(session.model), session._replica.parts.collective.params)  # the new parameters
        train(session, quiet=True)
        assert all(read) and session.done
        assert session.steps == len(read) == server.call(lambda: server.coordinator.round)



@pytest.mark.parametrize("balance", ["busy", "compute"])
def test_the_fast_path_reports_busy_time_with_its_own_part(ps_server, balance: str) -> None:
    """Under --balance busy (the BSP default) a fast-path step reports its compute plus the previous
    step's own part (worker/timing/own_time.py: the CPU from its compute's end to the next fetch); under
    --balance compute, its compute alone."""
    server = ps_server(*TINY, "--workers", "1", "--balance", balance)
    with connect(server.target, name="w0", cores=1.0) as session:
        reported: list[tuple[float, float]] = []  # (reported, compute) per report
        start_push = session.client.start_push

        def recording_start_push(meta: PushMeta, *args: object):
            if meta.kind == "report":
                reported.append((meta.times.compute_ms, session.last_compute_ms))
            return start_push(meta, *args)

        session.client.start_push = recording_start_push
        for x, y in session.batches():
            session.model.zero_grad()
            torch.nn.functional.cross_entropy(session.model(x), y).backward()
            before = session.steps
            session.step()
            if session.steps > before:
                reported[-1] = (reported[-1][0], session.last_compute_ms)
    own = [r - c for r, c in reported[1:]]  # the first step has no previous one
    assert len(own) >= 3
    if balance == "busy":
        assert all(ms > 0 for ms in own), reported
    else:
        assert all(ms == pytest.approx(0.0, abs=1e-6) for ms in own), reported

def _round(target: str) -> int:
    client = PSClient(target)
    try:
        return client.status().round
    except ServerError:
        return -1
    finally:
        client.close()


@pytest.mark.parametrize(("sig", "event"), [(signal.SIGTERM, "leave"), (signal.SIGKILL, "evict")])
def test_group_reforms_when_a_worker_leaves(tmp_path: Path, sig: signal.Signals, event: str) -> None:
    """SIGTERM one of three workers mid-run (while the others wait in the all-reduce), or SIGKILL it
    (no Leave: its peers' all-reduce fails and the server evicts it): the other two re-form a group of
    two and finish the job."""
    cluster = start_server(tmp_path, [*JOB, "--allreduce", "--workers", "3", "--global-batch", "48", "--epochs", "3",
                                      "--checkpoint-dir", str(tmp_path / "ckpt"), "--evict-after", "3"])
    try:
        cluster.start_worker("w0")
        cluster.start_worker("w1")
        victim = cluster.start_worker("w2", "--slowdown", "4")  # the others often wait for it inside the all-reduce
        deadline = time.monotonic() + 120  # process start-up is slow on a busy machine
        while _round(cluster.target) < 3:
            assert time.monotonic() < deadline and cluster.server.poll() is None, cluster.server_log()
            time.sleep(0.05)
        victim.send_signal(sig)
        finish(cluster, 120, killed=victim if sig == signal.SIGKILL else None)
        events = cluster.events()
        kinds = [e["event"] for e in events]
        left = kinds.index(event)
        assert events[left]["worker"] == "w2"
        regroup = next(e for e in events[left:] if e["event"] == "regroup")
        assert regroup["world_size"] == 2 and set(regroup["ranks"]) == {"w0", "w1"}
        (summary,) = cluster.events("summary")
        assert summary["epochs"] == 3 and summary["reason"] == "finished"
        assert [e["epoch"] for e in cluster.events("eval")] == [1, 2, 3]
        for name in ("w0", "w1"):  # a round the leave closed before a survivor's report is not its update
            missed = sum(name in e["workers"] for e in cluster.events("close_without"))
            assert summary["update_counts"][name] == summary["rounds"] - missed
        assert sum(cluster.events("adjust")[-1]["batch_sizes"].values()) == 48
        final = read_checkpoint(checkpoint_files(tmp_path / "ckpt")[-1])
        assert final["round"] == summary["rounds"] and bool(torch.isfinite(final["params"]).all())
        assert summary["accuracy"] > 0.5, summary
    finally:
        cluster.stop()
