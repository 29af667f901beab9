"""--shards: the parameters split across a coordinator and ps-shard processes, with real processes.

The core claim: a sharded server is the same optimizer as one server. The same pushes give the
same parameters and the same optimizer state (checkpoints), and a checkpoint moves between a
sharded and an unsharded server. What a shard refuses, and how shards fail and stop with their
server: test_shard_guards.py.
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest
import torch

from ps.checkpoint import checkpoint_files, read_checkpoint
from ps.server_flags import build_parser
from ps.server_job import build_job
from tests.processes import Cluster, start_server
from tests.shard_processes import shard_children
from tests.sharded_jobs import JOB, ROUNDS, join_two, same, train

# ------------------------------------------------------------- real processes
def drive(target: str, rounds: int = ROUNDS) -> torch.Tensor:
    """Two workers join, train for `rounds` rounds and close their connections; the parameters."""
    workers = join_two(target)
    try:
        return train(workers, rounds)
    finally:
        for client, _ in workers:
            client.close()


def stop_and_checkpoint(cluster: Cluster) -> dict:
    cluster.server.send_signal(signal.SIGTERM)
    assert cluster.server.wait(60) == 0, cluster.server_log()
    return read_checkpoint(checkpoint_files(cluster.workdir / "ckpt")[-1])


def run(tmp_path: Path, name: str, *extra: str) -> tuple[torch.Tensor, dict]:
    workdir = tmp_path / name
    workdir.mkdir()
    cluster = start_server(workdir, [*JOB, "--checkpoint-dir", str(workdir / "ckpt"), *extra])
    try:
        params = drive(cluster.target)
        return params, stop_and_checkpoint(cluster)
    finally:
        cluster.stop()


def ipv6_loopback() -> bool:
    """Whether this machine can listen on ::1 (an IPv6 loopback)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
def test_a_sharded_job_on_the_ipv6_loopback_listens_advertises_and_trains_in_brackets(tmp_path: Path) -> None:
    """--host ::1: the server and the shard it starts listen on [::1]:PORT, the Join reply names the
    shard as [::1]:PORT (unbracketed, gRPC would read no port and the worker refuses it), and workers
    that reach the server at [::1]:PORT train through both."""
    workdir = tmp_path / "v6"
    workdir.mkdir()
    cluster = start_server(workdir, [*JOB, "--host", "::1", "--shards", "2"])
    try:
        workers = join_two(f"[::1]:{cluster.port}")
        try:
            assert [s.address.startswith("[::1]:") for s in workers[0][1].shards] == [True]
            params = train(workers, 2)
        finally:
            for client, _ in workers:
                client.close()
        assert bool(torch.isfinite(params).all())
    finally:
        cluster.stop()


def test_sharded_server_steps_like_one_server(tmp_path: Path) -> None:
    one, one_ckpt = run(tmp_path, "one")
    for shards in ("3",):
        sharded, ckpt = run(tmp_path, f"shards{shards}", "--shards", shards)
        assert same(sharded, one), f"--shards {shards}: max diff {(sharded - one).abs().max()}"
        assert torch.equal(ckpt["params"], sharded) and ckpt["round"] == one_ckpt["round"] == ROUNDS
        momentum, reference = ckpt["optimizer"]["state"][0], one_ckpt["optimizer"]["state"][0]
        assert same(momentum["momentum_buffer"], reference["momentum_buffer"])
        assert not same(sharded, one_ckpt["params"] + 1e-3)  # the comparison can fail


def test_checkpoints_move_between_sharded_and_unsharded_servers(tmp_path: Path) -> None:
    """Resume an unsharded run on 3 shards and go on: same parameters as going on unsharded."""
    _, first = run(tmp_path, "first")
    ckpt_dir = tmp_path / "first" / "ckpt"
    results = {}
    for name, extra in (("unsharded", ()), ("sharded", ("--shards", "3"))):
        workdir = tmp_path / name
        workdir.mkdir()
        resume = workdir / "resume"
        resume.mkdir()
        newest = checkpoint_files(ckpt_dir)[-1]
        (resume / newest.name).write_bytes(newest.read_bytes())
        cluster = start_server(workdir, [*JOB, "--resume", str(resume), *extra])
        try:
            results[name] = drive(cluster.target, rounds=3)
        finally:
            cluster.stop()
    assert not same(results["unsharded"], first["params"])
    assert same(results["sharded"], results["unsharded"])


def test_sharded_training_end_to_end(tmp_path: Path) -> None:
    """Real ps-worker processes train through 2 shards to the accuracy bar; no shard is left behind."""
    cluster = start_server(tmp_path, ["--mode", "bsp", "--workers", "2", "--model-arg", "hidden=64", "--epochs", "6",
                                      "--global-batch", "64", "--shards", "2"])
    try:
        for name in ("a", "b"):
            cluster.start_worker(name)
        assert cluster.wait(180) == 0, cluster.server_log()
        (summary,) = cluster.events("summary")
        assert summary["accuracy"] >= 0.9, summary
        assert summary["epochs"] == 6
        assert [e["step"] for e in cluster.events("first_round")] == [1]
    finally:
        cluster.stop()
    assert not shard_children(cluster.server.pid)


@pytest.mark.parametrize(("args", "message"), [
    (["--shards", "2", "--mode", "asp"], "--shards serves BSP jobs"),
    (["--shards", "2", "--allreduce"], "--shards serves BSP jobs"),
    (["--shard-addresses", "nohost"], "expected HOST:PORT"),
    (["--shard-addresses", "127.0.0.1:1,127.0.0.1:2", "--shards", "2"], "disagrees"),
    (["--shards", "99999"], "exceeds the model's"),
])
def test_bad_shard_flags_are_refused(args: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_job(build_parser().parse_args(["--port", "0", "--model-arg", "hidden=8", "--quiet", *args]))


def test_zero_shards_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--shards", "0"])
    assert exit_.value.code == 2
    assert "argument --shards:" in capsys.readouterr().err


# ------------------------------------------------------------ a shard's inputs
