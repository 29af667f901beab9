"""--adaptive-batch gns end to end: a real server and real workers on loopback. B moves within its
bounds with an exact split after every change, the LR follows the rule, Status and the metrics log
show B, φ, the efficiency and the LR, and a checkpoint resumes at the B it was written at; bad flags
are one line and exit 2."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ps.control.global_batch.goodput import lr_factor
from ps.checkpoint import read_checkpoint
from tests.cli_checks import server_refuses
from tests.processes import Cluster, start_server
from worker.transport.client import PSClient, ServerError

JOB = ["--workers", "3", "--dataset", "teacher", "--dataset-arg", "size=6144", "--model-arg", "hidden=64",
       "--global-batch", "64", "--lr", "0.05", "--momentum", "0.9", "--controller", "dynamic",
       "--adaptive-batch", "gns", "--adapt-every", "15", "--adapt-threshold", "0", "--lr-scaling", "adascale",
       "--min-global-batch", "24", "--max-global-batch", "384", "--grace", "5"]
SLOWDOWNS = {"a": "1", "b": "1", "c": "2"}


def run(workdir: Path, args: list[str], watch: bool = False) -> tuple[Cluster, dict | None]:
    workdir.mkdir()
    cluster = start_server(workdir, args)
    seen = None
    try:
        for name, slowdown in SLOWDOWNS.items():
            cluster.start_worker(name, "--slowdown", slowdown)
        if watch:  # Status while it trains: B, φ, the efficiency and the LR
            client = PSClient(cluster.target)
            try:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and seen is None and cluster.server.poll() is None:
                    try:
                        s = client.status()
                    except ServerError:  # the job may end between the poll and the call
                        break
                    if s.noise_scale is not None and s.noise_scale > 0 and s.round > 20:
                        seen = {"mode": s.adaptive_batch, "phi": s.noise_scale, "efficiency": s.efficiency,
                                "lr": s.lr, "global_batch": s.global_batch,
                                "plan": sum(w.batch_size for w in s.workers)}
                    time.sleep(0.2)
            finally:
                client.close()
        assert cluster.wait(240) == 0, cluster.server_log()
    finally:
        cluster.stop()
    return cluster, seen


def check_b_and_splits(cluster: Cluster, start: int, phi: float | None = None) -> list[int]:
    """Every plan sums to the B in force; B stays in the flags' bounds; the LR is the rule's. The Bs."""
    b, seen = start, [start]
    for e in cluster.events():
        if e["event"] == "adapt":
            assert 24 <= e["global_batch"] <= 384 and e["global_batch"] == e["batch"]
            assert e["changed"] == (e["batch"] != b), e
            b = e["global_batch"]
            seen.append(b)
            if e["phi"] is None:  # noise-dominated rounds: unknown, B stays, the LR keeps the last known φ
                assert not e["changed"], e
            else:
                phi = e["phi"]
                assert e["efficiency"] == pytest.approx((phi + 64) / (phi + b), abs=1e-3)  # rounded to 3 places
            assert e["lr"] == pytest.approx(0.05 * lr_factor("adascale", b, 64, phi), rel=1e-3)
        elif e["event"] == "adjust":
            assert sum(e["batch_sizes"].values()) == b, e
            assert all(v >= 1 for v in e["batch_sizes"].values()), e
    return seen


def test_adaptive_batch_moves_b_with_exact_splits_and_resumes_at_its_b(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    first, seen = run(tmp_path / "first", [*JOB, "--epochs", "3", "--checkpoint-dir", str(ckpt)], watch=True)
    assert seen is not None and seen["mode"] == "gns" and seen["global_batch"] == seen["plan"], seen
    assert 0 < seen["efficiency"] and seen["lr"] > 0 and seen["phi"] > 0, seen
    batches = check_b_and_splits(first, 64)
    assert len(first.events("adapt")) >= 2
    assert len(set(batches)) > 1, batches  # threshold 0: B moved
    (summary,) = first.events("summary")
    assert summary["epochs"] == 3 and summary["reason"] == "finished"
    assert summary["short_rounds"] == 0  # every round at the B it was planned at, moved or not
    final = read_checkpoint(first.events("checkpoint")[-1]["path"])
    saved_b = final["adaptive"]["decider"]["batch"]
    assert saved_b == batches[-1] == sum(w["batch"] for w in final["controller"]["workers"])
    assert final["controller"]["config"]["global_batch"] == saved_b and final["adaptive"]["gns"]["rounds"] > 0

    resumed, _ = run(tmp_path / "resumed", [*JOB, "--epochs", "5", "--resume", str(ckpt)])  # >= 15 rounds at any B
    (resume,) = resumed.events("resume")
    assert resume["epoch"] == 3 and resume["controller_changes"] == {}
    first_plan = resumed.events("adjust")[0]["batch_sizes"]
    assert sum(first_plan.values()) == saved_b, first_plan
    check_b_and_splits(resumed, saved_b, final["adaptive"]["decider"]["phi"])
    decisions = [e for e in resumed.events("adapt")]
    # the estimator went on from its saved rounds (a probe may decide before it takes a round)
    assert decisions and decisions[-1]["rounds"] > final["adaptive"]["gns"]["rounds"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--adaptive-batch", "gns", "--mode", "asp"], "--adaptive-batch gns is for --mode bsp"),
    (["--adaptive-batch", "gns", "--min-global-batch", "300", "--max-global-batch", "200"],
     "--min-global-batch 300 exceeds --max-global-batch 200"),
    (["--adaptive-batch", "gns", "--min-global-batch", "0"], "argument --min-global-batch: expected a whole number > 0"),
    (["--adaptive-batch", "gns", "--max-global-batch", "-8"], "argument --max-global-batch: expected a whole number > 0"),
    (["--adaptive-batch", "gns", "--adapt-threshold", "1"], "argument --adapt-threshold: expected a number in [0, 1)"),
    (["--adaptive-batch", "gns", "--adapt-threshold", "-0.01"], "argument --adapt-threshold: expected a number in [0, 1)"),
    (["--adaptive-batch", "gns", "--adapt-every", "0"], "argument --adapt-every"),
    (["--adaptive-batch", "gns", "--lr-scaling", "cubic"], "argument --lr-scaling: invalid choice"),
    (["--adaptive-batch", "bigger"], "argument --adaptive-batch: invalid choice"),
    (["--adaptive-batch", "gns", "--global-batch", "128", "--max-global-batch", "64"],
     "--global-batch 128 is outside [--min-global-batch 4, --max-global-batch 64]"),
    (["--adaptive-batch", "gns", "--workers", "4", "--min-global-batch", "2"], "--min-global-batch 2 is below --workers 4"),
    (["--adaptive-batch", "gns", "--shards", "2"], "--adaptive-batch gns runs with one server: not with --shards"),
    (["--adaptive-batch", "gns", "--micro-batch", "8"], "--adaptive-batch gns does not run with --micro-batch"),
    (["--min-global-batch", "16"], "--min-global-batch needs --adaptive-batch gns"),
    (["--lr-scaling", "linear"], "--lr-scaling needs --adaptive-batch gns"),
    (["--mode", "asp", "--lr-scaling", "sqrt"], "--lr-scaling needs --adaptive-batch gns"),
    (["--adapt-every", "epoch"], "--adapt-every needs --adaptive-batch gns"),
    (["--adapt-threshold", "0.2"], "--adapt-threshold needs --adaptive-batch gns"),
])
def test_bad_adaptive_flags_are_one_line_and_exit_2(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    server_refuses(args, needle, capsys)  # exit 2, the needle, no traceback, nothing listens


def test_on_the_allreduce_fast_path_the_reports_carry_the_norms(tmp_path: Path) -> None:
    cluster, _ = run(tmp_path / "fast", [*JOB, "--allreduce", "on", "--epochs", "2"])
    (summary,) = cluster.events("summary")
    assert summary["allreduce"] is True and summary["reason"] == "finished"
    batches = check_b_and_splits(cluster, 64)
    decisions = cluster.events("adapt")
    # every round's reports carry the norms; a round a deadline closed without a member's report has none
    short = len(cluster.events("short_round"))
    assert len(decisions) >= 2 and all(d["step"] - short <= d["rounds"] <= d["step"] for d in decisions), decisions
    assert len(set(batches)) > 1, batches
