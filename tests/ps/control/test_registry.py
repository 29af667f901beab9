"""A batch policy is one new file and one line in ps/control/registry.py: the toy policy of
tests/toy_policy.py, registered with that one line, is a --policy choice, is built, checkpointed and
read back through the registry, and plans the batches a real job's workers train at."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ps.control.config import PolicyConfig
from ps.control.policy import build_policy, policy_from_state
from ps.control.registry import POLICIES
from ps.server_flags import build_parser
from tests.processes import ENV
from tests.toy_policy import ToyPolicy

TOY = "tests.toy_policy:ToyPolicy"


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(POLICIES, "toy", TOY)  # the one registry line a new policy adds


def test_a_registered_policy_is_built_and_read_back_through_the_registry(toy: None) -> None:
    policy = build_policy(PolicyConfig(policy="toy", global_batch=64))
    assert isinstance(policy, ToyPolicy)
    for name in ("b", "a", "c"):
        policy.add_worker(name)
    assert policy.replan() == {"b": 13, "a": 38, "c": 13}
    copy = policy_from_state(policy.state_dict())
    assert isinstance(copy, ToyPolicy) and copy.plan() == policy.plan()
    micro = build_policy(PolicyConfig(policy="toy", global_batch=64, micro_batch=8))
    for name in ("a", "b"):
        micro.add_worker(name)
    assert micro.replan() == {"a": 48, "b": 16}


def test_an_unregistered_policy_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="policy must be one of uniform, static, dynamic, model; got 'toy'"):
        PolicyConfig(policy="toy")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--policy", "toy"])


def test_a_real_job_trains_at_the_registered_policys_plan(toy: None, ps_server: Callable[..., object],
                                                         tmp_path: Path) -> None:
    assert build_parser().parse_args(["--policy", "toy"]).policy == "toy"
    server = ps_server("--policy", "toy", "--global-batch", "64", "--epochs", "1")
    workers = [subprocess.Popen([sys.executable, "-m", "worker.cli", "--server", server.target, "--name", name,
                                 "--quiet"], stdout=(tmp_path / f"{name}.log").open("w"), stderr=subprocess.STDOUT,
                                env=ENV) for name in ("b", "a")]
    try:
        for proc in workers:
            assert proc.wait(timeout=120) == 0, (tmp_path / "a.log").read_text() + (tmp_path / "b.log").read_text()
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    deadline = time.monotonic() + 10
    while not server.call(lambda: server.coordinator.done):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.05)
    coordinator = server.coordinator
    assert server.call(lambda: (coordinator.policy.config.policy, coordinator.policy.plan())) == ("toy", {"b": 16, "a": 48})
    assert server.call(lambda: coordinator.samples) >= 1000  # digits' training split, at the toy's batches
