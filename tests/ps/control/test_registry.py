"""A batch policy is one new file and one line in ps/control/registry.py: the toy policy of
tests/toy_policy.py, registered with that one line, is a --policy choice, is built, checkpointed and
read back through the registry, and plans the batches a real job's workers train at. The setting it
declares for itself (`share`) is a `--toy-share` flag of ps-server, with its help and bounds, that
reaches the policy and survives a checkpoint and a resume."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from common.transport.messages import JoinAsk
from ps.checkpoint import write_checkpoint
from ps.control.config import PolicyConfig, config_changes
from ps.control.policy import build_policy, policy_from_state
from ps.control.registry import POLICIES
from ps.server_flags import build_parser, describe_policy_changes
from ps.server_job import Job, build_job
from tests.conftest import job_args
from tests.processes import ENV
from tests.repo import ROOT
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
    with pytest.raises(ValueError, match="policy must be one of uniform, static, dynamic, model, auto; got 'toy'"):
        PolicyConfig(policy="toy")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--policy", "toy"])


@pytest.mark.slow
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


def test_a_policys_own_setting_is_a_flag_of_ps_server_with_its_help_and_bounds() -> None:
    registered = f"from ps.control.registry import POLICIES; POLICIES['toy'] = {TOY!r}"
    help_text = subprocess.run([sys.executable, "-c", f"{registered}; from ps.server import main; main(['--help'])"],
                               capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120, check=True).stdout
    flat = " ".join(help_text.split())
    assert "--toy-share FLOAT --policy toy: shares of B the first worker by name takes, one for each other " \
           "(in [1, 16]) (default: 3.0)" in flat
    assert "--toy-share" not in build_parser().format_help()  # only a registered policy's settings are flags


def test_the_flag_parses_and_refuses_a_value_out_of_bounds(toy: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["--policy", "toy", "--toy-share", "5"]).toy_share == 5.0
    assert not hasattr(build_parser().parse_args(["--policy", "toy"]), "toy_share")  # unset: the policy's default
    for bad in ("0.5", "17", "nan", "many"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--policy", "toy", "--toy-share", bad])
        assert "argument --toy-share: share must be" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"share must be in \[1, 16\], got 0.5"):
        PolicyConfig(policy="toy", options={"share": 0.5})
    with pytest.raises(ValueError, match="policy toy has no setting 'shares'"):
        PolicyConfig(policy="toy", options={"shares": 2.0})
    with pytest.raises(ValueError, match="--toy-share is for --policy toy, not --policy auto"):
        build_job(job_args("--toy-share", "5"))


def _joined(job: Job, names: tuple[str, ...]) -> dict[str, int]:
    """Join `names` (the job's expected workers) and return the plan they start with."""
    async def join_all() -> dict[str, int]:
        infos = await asyncio.gather(*(job.coordinator.join(JoinAsk(name, 1.0)) for name in names))
        return {name: info.batch_size for name, info in zip(names, infos, strict=True)}
    return asyncio.run(join_all())


def _closed(job: Job) -> None:
    job.evaluator.close()
    job.metrics.close()


def test_the_setting_reaches_the_policy_and_survives_a_checkpoint_and_a_resume(
        toy: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ("--policy", "toy", "--global-batch", "60", "--checkpoint-dir", str(tmp_path))
    job = build_job(job_args(*flags, "--toy-share", "5"))
    try:
        assert job.coordinator.policy.config.options == {"share": 5.0}
        assert _joined(job, ("a", "b")) == {"a": 50, "b": 10}  # 5 shares to 1
        state = job.coordinator.checkpoint_state()
    finally:
        _closed(job)
    assert state["controller"]["config"]["options"] == {"share": 5.0}
    write_checkpoint(tmp_path, state, 0, keep=1)
    resumed = build_job(job_args(*flags, "--toy-share", "5", "--resume", str(tmp_path)))
    try:
        assert "controller settings differ" not in capsys.readouterr().err
        assert _joined(resumed, ("b", "a")) == {"a": 50, "b": 10}  # the checkpoint's plan, same workers
        assert resumed.coordinator.policy.config.options == {"share": 5.0}
    finally:
        _closed(resumed)
    changed = build_job(job_args(*flags, "--toy-share", "2", "--resume", str(tmp_path)))
    try:
        assert "(--toy-share 5.0 -> 2.0); the command line's apply" in capsys.readouterr().err
        assert _joined(changed, ("a", "b")) == {"a": 40, "b": 20}  # the command line's share applies
    finally:
        _closed(changed)


def test_a_checkpoint_written_before_a_setting_existed_reads_back_with_its_default(toy: None) -> None:
    policy = build_policy(PolicyConfig(policy="toy", global_batch=64))
    policy.add_worker("a")
    policy.replan()
    state = policy.state_dict()
    del state["config"]["options"]  # as a checkpoint of the toy before it declared `share`
    assert policy_from_state(state).config.options == {"share": 3.0}
    later = PolicyConfig(policy="toy", global_batch=64, options={"share": 4.0})
    assert config_changes(policy.config, later) == {"toy.share": (3.0, 4.0)}
    assert config_changes(later, PolicyConfig(policy="dynamic", global_batch=64)) == {"policy": ("toy", "dynamic"), "toy.share": (4.0, None)}
    assert describe_policy_changes({"toy.share": (3.0, 4.0)}).startswith(
        "the controller settings differ from the checkpoint's (--toy-share 3.0 -> 4.0)")
