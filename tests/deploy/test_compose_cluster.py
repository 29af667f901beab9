"""The docker-compose cluster really run: HL8 in containers, trained to the end (``pytest -m compose``).

Deselected by default (the README's ``python -m pytest -q``); ``.ci/run`` starts an engine with
``deploy/engine.sh`` and runs these. Skipped, with the reason, only where no engine answers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.compose_cluster import SERVICES, ComposeCluster, build_image, engine_problem
from deploy.compose_env import container_limits, render_env
from deploy.profiles import default_cpu_budget, load_profile

pytestmark = pytest.mark.compose

EPOCHS = 4


@pytest.fixture(scope="module")
def image() -> None:
    """An engine that answers, and the image built from this working tree (seconds when cached)."""
    problem = engine_problem()
    if problem is not None:
        pytest.skip(f"no Docker engine: {problem}")
    build_image()


def test_hl8_trains_to_the_end_in_containers(image: None, tmp_path: Path) -> None:
    profile = load_profile("hl8")
    scale = default_cpu_budget() / sum(profile.allocation("bsp").workers)  # the cgroup emulator's shares
    env_file = tmp_path / "hl8.env"
    env_file.write_text(render_env(profile, "bsp", scale), encoding="utf-8")
    expected = container_limits(profile, "bsp", scale)
    job = {"EPOCHS": str(EPOCHS), "CONTROLLER": "dynamic"}
    with ComposeCluster(env_file, tmp_path, job=job, server_args=["--lr", "0.02", "--dataset-arg", "size=2048"]) as cluster:
        cluster.up()
        result = cluster.wait(timeout=600)
    print(result.summary_line)

    for service in SERVICES:
        end = result.containers[service]
        assert (end.exit_code, end.restarts, end.running) == (0, 0, False), f"{service}: {end}\n{result.logs[-4000:]}"
        assert end.network_mode == "host"  # no bridge: every packet on loopback
    for k in range(4):
        end = result.containers[f"worker{k}"]
        assert (end.cpu_period_us, end.cpu_quota_us) == (expected.period_us, expected.quota_us(expected.workers[k]))
    if default_cpu_budget() == 1.5:  # 2 cores: the design brief's 8 ms for the 1/8-core worker
        assert expected.period_us == 8000
    assert f"listening on 127.0.0.1:{cluster.port}" in result.logs

    (summary,) = result.of_kind("summary")
    assert summary["epochs"] == EPOCHS and summary["reason"] == "finished", summary
    assert summary["controller"] == "dynamic"
    batches = summary["batch_sizes"]
    assert set(batches) == {"w0", "w1", "w2", "w3"}
    assert sum(batches.values()) == 512
    # the 1-core worker carries the most; the 1/8-core one the least
    assert batches["w3"] == max(batches.values()) and batches["w2"] == min(batches.values()), batches
    assert len(result.of_kind("epoch")) == EPOCHS
    assert result.summary_line is not None, result.logs[-2000:]

