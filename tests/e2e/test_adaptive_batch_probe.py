"""--adaptive-batch gns under the default policy (dynamic), real server and workers on loopback: B
is measured at a second batch (a probe) and moves, never past what an epoch can hold
(goodput.MIN_STEPS_PER_EPOCH rounds); every decision names its basis."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.analysis import below_break_even
from ps.control.global_batch.goodput import MIN_STEPS_PER_EPOCH
from tests.processes import Cluster, start_server

TRAIN_SAMPLES = 1438  # digits at the default test fraction 0.2
JOB = ["--workers", "3", "--model", "mlp", "--dataset", "digits", "--global-batch", "128", "--epochs", "4",
       "--controller", "dynamic", "--adaptive-batch", "gns", "--min-global-batch", "64", "--max-global-batch", "1024",
       "--grace", "5"]


def finished(tmp_path: Path, args: list[str], slowdowns: dict[str, str]) -> Cluster:
    """The job of `args` run to its end with a worker per entry of `slowdowns` (name: slowdown)."""
    cluster = start_server(tmp_path, args)
    try:
        for name, slowdown in slowdowns.items():
            cluster.start_worker(name, "--slowdown", slowdown)
        assert cluster.wait(240) == 0, cluster.server_log()
    finally:
        cluster.stop()
    return cluster


def test_under_dynamic_b_is_probed_and_moves_within_the_epoch_bound(tmp_path: Path) -> None:
    cluster = finished(tmp_path, JOB, {"a": "1", "b": "2", "c": "4"})
    decisions = cluster.events("adapt")
    assert decisions, cluster.server_log()
    assert all(e["basis"] in ("guess", "line", "probe", "measured") for e in decisions), decisions
    probes = [e for e in decisions if e["basis"] == "probe"]
    assert probes and probes[0]["changed"] and probes[0]["global_batch"] != 128, decisions
    assert all(e["global_batch"] <= TRAIN_SAMPLES // MIN_STEPS_PER_EPOCH for e in decisions), decisions
    for e in decisions:
        if e["reason"].startswith("taken back"):
            assert e["basis"] == "measured" and e["changed"], e
    plans = [sum(e["batch_sizes"].values()) for e in cluster.events("adjust")]
    assert plans[-1] == decisions[-1]["global_batch"], (plans, decisions)
    (summary,) = cluster.events("summary")
    assert summary["reason"] == "finished" and summary["accuracy"] > 0.8, summary


@pytest.mark.parametrize("policy", ["model", "auto"])
def test_no_plan_puts_an_active_worker_below_its_break_even(tmp_path: Path, policy: str) -> None:
    """The metrics log's decisions (benchmarks.analysis.below_break_even): every active worker with a
    known law is planned at or above its break-even batch, the fixed cost of its round paid for by its
    samples, from B0 = 128 moving down (a worker 8 times slower than the fastest)."""
    args = [*JOB[:JOB.index("--controller")], "--controller", policy, "--adaptive-batch", "gns",
            "--min-global-batch", "16", "--max-global-batch", "512", "--adjust-every", "4", "--grace", "5"]
    cluster = finished(tmp_path, args, {"a": "1", "b": "2", "c": "8"})
    events = cluster.events()
    decisions = cluster.events("adjust")
    known = [e for e in decisions if any(f.get("law", (f.get("batches") or 0) >= 2) for f in (e.get("fits") or {}).values())]
    assert known, decisions  # laws were fitted: the check below has plans to judge
    assert below_break_even(events) == [], [(e["step"], e["batch_sizes"], e.get("fits")) for e in decisions]
    (summary,) = cluster.events("summary")
    assert summary["reason"] == "finished", summary


def test_a_lone_worker_measures_the_noise_scale_from_its_batch_and_its_first_half(tmp_path: Path) -> None:
    """One worker at one B (a range of one B holds it): no second worker and no second batch to pair
    with, so φ rests on the first half of each batch that the built-in loop measures and the push
    carries (worker/session/sub_batch.py): every round adds one, and φ is known from the second decision
    on (the first rounds' signal can read <= 0 from noise alone)."""
    args = ["--workers", "1", "--model", "mlp", "--dataset", "digits", "--global-batch", "64", "--epochs", "2",
            "--controller", "model", "--adaptive-batch", "gns", "--min-global-batch", "64", "--max-global-batch", "64",
            "--grace", "5"]
    cluster = finished(tmp_path, args, {"a": "1"})
    decisions = cluster.events("adapt")
    assert len(decisions) >= 4, cluster.server_log()
    assert [e["rounds"] for e in decisions] == [e["step"] for e in decisions], decisions
    assert all(e["phi"] is not None and e["phi"] > 0 and not e["changed"] for e in decisions[1:]), decisions
    assert cluster.events("gns_skipped") == [], cluster.events("gns_skipped")
