"""Robust aggregation with a real ps-server and a real ps-worker: a member with a valid secret (the
project's own client, joined like any worker) pushes plausible gradients for a few rounds and then one
of all-1e30 values. Without a bound the server applies it and the model stays at chance for the rest
of the job; with --max-update-norm or --clip-outliers the push is clipped, an `update_clipped` event
names it, and the job reaches its accuracy. The rule itself: tests/common/params/test_norm_clip.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from common.transport.messages import PushMeta, PushTimes
from tests.processes import start_server
from worker.transport.client import PSClient, ServerError

JOB = ["--workers", "2", "--model-arg", "hidden=64", "--dataset", "digits", "--global-batch", "64", "--lr", "0.1",
       "--epochs", "4", "--controller", "static", "--grace", "2"]
ATTACK_ROUND = 6  # after 2 x 6 pushes: --clip-outliers has its median by then


def mallory(target: str, outcome: dict[str, object]) -> None:
    """Join, push random gradients of norm 1 for ATTACK_ROUND rounds, then all 1e30, and leave."""
    client = PSClient(target)
    try:
        joined = client.join("mallory", 1.0, timeout=120)
        worker_id, numel = joined.worker_id, joined.layout.numel
        params = torch.empty(numel)
        plan = client.pull(worker_id, params)
        noise = torch.Generator().manual_seed(0)
        while not plan.done:
            attack = plan.round >= ATTACK_ROUND
            values = torch.full((numel,), 1e30) if attack else torch.randn(numel, generator=noise) / numel**0.5
            meta = PushMeta(worker_id, plan.round, plan.version, plan.batch_size, PushTimes(1.0), "float32")
            plan = client.push(meta, values, params)
            if attack:
                outcome["attacked_round"] = meta.round
                client.leave(worker_id)
                break
    except ServerError as exc:
        outcome["error"] = exc
    finally:
        client.close()


@pytest.mark.parametrize(
    "bound", [[], ["--max-update-norm", "10"], ["--clip-outliers", "10"]], ids=["off", "max-norm", "outliers"]
)
def test_one_push_of_huge_values_from_a_member_is_clipped_and_the_job_learns(tmp_path: Path, bound: list[str]) -> None:
    cluster = start_server(tmp_path, [*JOB, *bound])
    outcome: dict[str, object] = {}
    attacker = threading.Thread(target=mallory, args=(cluster.target, outcome))
    try:
        attacker.start()
        cluster.start_worker("w0")
        assert cluster.wait(240) == 0, cluster.server_log()
        attacker.join(30)
    finally:
        cluster.stop()
    assert outcome.get("attacked_round") == ATTACK_ROUND, outcome
    (summary,) = cluster.events("summary")
    clipped = cluster.events("update_clipped")
    if not bound:  # the attack as found: applied, and the model never recovers
        assert summary["accuracy"] < 0.3 and clipped == [] and "clipped_updates" not in summary, summary
        return
    assert [e["worker"] for e in clipped] == ["mallory"] and clipped[0]["norm"] > 1e30, clipped
    assert summary["clipped_updates"] == 1 and summary["accuracy"] >= 0.85, summary
