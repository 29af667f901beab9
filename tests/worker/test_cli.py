"""worker/cli.py: the built-in loop's line for a loss that is not finite (non_finite_loss): it names a
sample that is not finite where there is one, else the parameters and their largest magnitude, as the
server's where the worker never steps them itself (the PS path); the exit status after an early end;
and the bound on --step-overhead-ms."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from common.job.endings import ENDED_EARLY
from worker.flags import parse_args
from worker.training_loop import end_status, non_finite_loss
from worker.probes.resources import MAX_STEP_OVERHEAD_MS


def model(scale: float) -> nn.Module:
    layer = nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight.fill_(scale)
        layer.bias.zero_()
    return layer


@pytest.mark.parametrize("servers", [True, False], ids=["ps-path", "fast-path"])
def test_a_sample_that_is_not_finite_is_named_whatever_the_parameters(servers: bool) -> None:
    said = str(non_finite_loss("step 4: the loss is nan", torch.tensor([[1.0, float("nan")]]), model(3e38), servers))
    assert said == "step 4: the loss is nan: a sample holds NaN or Inf; the server refuses a gradient that is not finite"


def test_on_finite_samples_the_parameters_are_named_with_their_largest_magnitude() -> None:
    x = torch.ones(1, 2)
    servers = str(non_finite_loss("step 4: the loss is inf", x, model(-3e38), servers=True))
    assert servers.startswith("step 4: the loss is inf on finite samples, from the server's parameters as it sent them "
                              "(the largest |value| 3e+38): its learning rate diverged")
    own = str(non_finite_loss("step 4: the loss is inf", x, model(2e20), servers=False))
    assert "at parameters whose largest |value| is 2e+20: the learning rate diverged" in own and "server's" not in own


def test_the_last_line_says_why_a_job_the_server_stopped_ended() -> None:
    """A job the server ended before its epochs (the workers left cannot split --global-batch) is not
    "job done" on the worker: its last line gives the server's reason."""
    from common.transport.messages import StepHeader
    from worker.training_loop import end_line

    def session(reason: str) -> Any:
        plan = StepHeader(round=9, version=9, epoch=3, batch_size=0, done=True, lr=0.1, global_batch=64, reason=reason)
        return SimpleNamespace(name="w0", steps=9, parked_polls=0, streamed_replies=9, plan=plan)

    assert end_line(session("finished")) == "w0: job done after 9 steps, 9 replies streamed in forward order"
    assert end_line(session("the workers left cannot split --global-batch (bounds sum to [2, 60])")) == (
        "w0: job ended (the workers left cannot split --global-batch (bounds sum to [2, 60])) after 9 steps, "
        "9 replies streamed in forward order")
    forged = end_line(session("stopping)\x1b[2J\nps-worker: error: forged ("))  # a hostile server's reason
    assert forged.startswith("w0: job ended (stopping)\\x1b[2J\\nps-worker: error: forged () after 9 steps")
    assert forged.isprintable()


def test_the_exit_status_after_an_early_end_is_the_servers_unless_told_otherwise(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 after an early end, as ps-server; --early-end-status (or $PS_EARLY_END_STATUS) gives another
    for a supervisor that restarts a worker on any status but 0; a finished or stopped job is 0."""
    early = "the workers left cannot split --global-batch (bounds sum to [2, 60])"
    assert [end_status(reason) for reason in ("finished", "stopping", "", early)] == [0, 0, 0, ENDED_EARLY]
    assert [end_status(reason, 0) for reason in ("finished", early)] == [0, 0]
    assert parse_args(["--server", "127.0.0.1:1"]).early_end_status == ENDED_EARLY
    monkeypatch.setenv("PS_EARLY_END_STATUS", "0")
    assert parse_args(["--server", "127.0.0.1:1"]).early_end_status == 0
    assert parse_args(["--server", "127.0.0.1:1", "--early-end-status", "5"]).early_end_status == 5  # the flag wins
    with pytest.raises(SystemExit) as refused:
        parse_args(["--server", "127.0.0.1:1", "--early-end-status", "256"])
    assert refused.value.code == 2 and "expected a whole number in [0, 255], got '256'" in capsys.readouterr().err


@pytest.mark.parametrize("given", ["1e308", "60000.5"])
def test_a_step_overhead_past_the_most_emulated_is_a_usage_error(
    given: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """1e308 ms was taken, and every step burned CPU forever; the flag and its variable both refuse it."""
    assert parse_args(["--server", "127.0.0.1:1", "--step-overhead-ms", "60000"]).step_overhead_ms == MAX_STEP_OVERHEAD_MS
    with pytest.raises(SystemExit) as flag:
        parse_args(["--server", "127.0.0.1:1", "--step-overhead-ms", given])
    assert flag.value.code == 2 and f"expected a number in [0, 60000], got '{given}'" in capsys.readouterr().err
    monkeypatch.setenv("PS_STEP_OVERHEAD_MS", given)
    with pytest.raises(SystemExit) as variable:
        parse_args(["--server", "127.0.0.1:1"])
    assert variable.value.code == 2 and "PS_STEP_OVERHEAD_MS" in capsys.readouterr().err
