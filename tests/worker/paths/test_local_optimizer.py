"""An ASP worker's own optimizer (worker/paths/local_optimizer.py): torch.optim's step as an update Δ, its
state carried across learning-rate changes, a fresh state after a rejoin, overflow refused unchanged."""

from __future__ import annotations

import pytest
import torch

from common.job.spec import JobSpec
from worker.paths.local_optimizer import LocalOptimizer, StepRefused


def reference_updates(spec: JobSpec, theta: torch.Tensor, steps: list[tuple[torch.Tensor, float]], adam: bool = False) -> list[torch.Tensor]:
    """torch.optim over a copy of θ that is put back before every step (the worker pulls new
    parameters between its updates, its optimizer state goes on)."""
    param = torch.nn.Parameter(theta.clone())
    if adam:
        opt = torch.optim.Adam([param], lr=1.0, weight_decay=spec.weight_decay)
    else:
        opt = torch.optim.SGD([param], lr=1.0, momentum=spec.momentum, nesterov=spec.nesterov, weight_decay=spec.weight_decay)
    out = []
    for grad, lr in steps:
        with torch.no_grad():
            param.copy_(theta)
        opt.param_groups[0]["lr"] = lr
        param.grad = grad.clone()
        opt.step()
        out.append(param.detach() - theta)
    return out


@pytest.mark.parametrize("optimizer, extra", [("sgd", {}), ("sgd", {"nesterov": True}), ("adam", {})])
def test_updates_are_the_job_optimizers_steps_with_state_carried_across_lr_changes(optimizer: str, extra: dict) -> None:
    spec = JobSpec(workers=2, global_batch=8, optimizer=optimizer, momentum=0.9, weight_decay=1e-3, **extra)
    theta = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    steps = [(torch.randn(1000, generator=torch.Generator().manual_seed(s)), lr) for s, lr in ((1, 0.05), (2, 0.05), (3, 0.02))]
    local = LocalOptimizer(spec, theta)
    got = [local.update(g.clone(), lr).clone() for g, lr in steps]
    for ours, theirs in zip(got, reference_updates(spec, theta, steps, adam=optimizer == "adam"), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)


def test_momentum_is_carried_and_a_rejoin_starts_fresh() -> None:
    spec = JobSpec(workers=2, global_batch=8, momentum=0.9)
    theta = torch.zeros(10)
    g = torch.ones(10)
    local = LocalOptimizer(spec, theta)
    assert torch.allclose(local.update(g.clone(), 0.1), torch.full((10,), -0.1))
    assert torch.allclose(local.update(g.clone(), 0.1), torch.full((10,), -0.19))  # buf = 0.9·g + g
    local.reset()
    assert torch.allclose(local.update(g.clone(), 0.1), torch.full((10,), -0.1))


def test_a_step_that_could_overflow_is_refused_and_the_state_stays() -> None:
    spec = JobSpec(workers=2, global_batch=8, momentum=0.9)
    local = LocalOptimizer(spec, torch.zeros(10))
    local.update(torch.ones(10), 0.1)
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in local.state_dict()["state"][0].items()}
    with pytest.raises(StepRefused, match="could overflow fp32"):
        local.update(torch.full((10,), 3e38), 10.0)
    after = local.state_dict()["state"][0]
    assert torch.equal(after["momentum_buffer"], before["momentum_buffer"])
    assert torch.allclose(local.update(torch.ones(10), 0.1), torch.full((10,), -0.19))
