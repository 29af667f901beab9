"""The worker's side of --micro-batch and of the memory bound: k micro-batches give the whole batch's
gradient (a model without BatchNorm), the BatchNorm model normalises each micro-batch alone, the
server's BatchNorm statistics depend on the parameters only, and the memory probe's line and bound."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from common.job.batchnorm import batchnorm_layers, recalibrate, running_stats
from common.job.datasets import build_dataset
from common.job.models import build_model
from common.job.spec import JobSpec
from worker import connect
from worker.data import job_build
from worker.accumulate import backward_in_micro_batches, backward_with_sub_norm
from worker.data.memory_probe import Declared, JobSetupError, declared_max_batch, probe_max_batch


def grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


@pytest.fixture(scope="module")
def digits():
    return build_dataset("digits", {}, 0)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_k_micro_batches_give_the_whole_batchs_gradient(digits, name: str) -> None:
    model = build_model(name, digits.input_shape, digits.num_classes, {}, seed=0)
    x, y = digits.train_x[:48], digits.train_y[:48]
    loss_whole = backward_in_micro_batches(model, x, y, 1)
    whole = grads(model).clone()
    for m in (8, 16, 48):
        loss = backward_in_micro_batches(model, x, y, m)
        assert torch.allclose(grads(model), whole, rtol=1e-5, atol=1e-6), m
        assert torch.allclose(loss, loss_whole, rtol=1e-5)


@pytest.mark.parametrize(("name", "n", "sub"), [("mlp", 48, 24), ("cnn", 33, 16), ("mlp", 2, 1)])
def test_a_sub_batch_pass_gives_the_whole_batchs_gradient_and_the_first_parts_norm(digits, name: str, n: int,
                                                                                    sub: int) -> None:
    model = build_model(name, digits.input_shape, digits.num_classes, {}, seed=0)
    x, y = digits.train_x[:n], digits.train_y[:n]
    model.zero_grad()
    F.cross_entropy(model(x[:sub]), y[:sub]).backward()
    first = grads(model).double()
    loss_whole = backward_in_micro_batches(model, x, y, 1)
    whole = grads(model).clone()
    entered: list[object] = []
    loss, sq_norm = backward_with_sub_norm(model, x, y, sub, first_pass=lambda: _noting(entered),
                                           noted=lambda size, norm: entered.append((size, norm)))
    assert torch.allclose(grads(model), whole, rtol=1e-5, atol=1e-6)
    assert torch.allclose(loss, loss_whole, rtol=1e-5)
    assert sq_norm == pytest.approx(float(first @ first), rel=1e-5)
    assert entered == ["in", "out", (sub, sq_norm)]  # the first pass inside; its norm noted before the rest
    for bad in (0, n):
        with pytest.raises(ValueError, match="part of the batch"):
            backward_with_sub_norm(model, x, y, bad)


@contextlib.contextmanager
def _noting(entered: list[str]) -> Iterator[None]:
    entered.append("in")
    yield
    entered.append("out")


def test_batchnorm_normalises_each_micro_batch_alone(digits) -> None:
    model = build_model("cnn-bn", digits.input_shape, digits.num_classes, {}, seed=0).train()
    x, y = digits.train_x[:32], digits.train_y[:32]
    backward_in_micro_batches(model, x, y, 8)
    accumulated = grads(model).clone()
    by_hand = torch.zeros_like(accumulated)
    for start in range(0, 32, 8):  # each micro-batch's own gradient, a quarter of the weight each
        model.zero_grad()
        F.cross_entropy(model(x[start:start + 8]), y[start:start + 8]).backward()
        by_hand += grads(model) / 4
    assert torch.allclose(accumulated, by_hand, rtol=1e-5, atol=1e-6)
    for per_pass in (8, 16, 20):  # passes of one, two and (rounded down) two micro-batches: the same
        backward_in_micro_batches(model, x, y, 8, per_pass=per_pass)
        assert torch.allclose(grads(model), by_hand, rtol=1e-5, atol=1e-6), per_pass
    assert type(model.features[1]).forward is torch.nn.BatchNorm2d.forward and "forward" not in vars(model.features[1])
    backward_in_micro_batches(model, x, y, 1)  # one pass of 32: other batch statistics, another gradient
    assert not torch.allclose(grads(model), accumulated, rtol=1e-3, atol=1e-4)


def test_the_servers_batchnorm_statistics_depend_on_the_parameters_only(digits) -> None:
    model = build_model("cnn-bn", digits.input_shape, digits.num_classes, {}, seed=0)
    other = copy.deepcopy(model)
    for layer in batchnorm_layers(other):  # a worker's buffers after its own batches: ignored
        layer.running_mean.fill_(5.0)
        layer.running_var.fill_(9.0)
        layer.num_batches_tracked.fill_(77)
    assert recalibrate(model, digits.train_x, 8) and recalibrate(other, digits.train_x, 8)
    assert running_stats(model) == running_stats(other)
    for a, b in zip(batchnorm_layers(model), batchnorm_layers(other)):
        assert torch.equal(a.running_mean, b.running_mean) and torch.equal(a.running_var, b.running_var)
        assert a.momentum == 0.1 and not a.training  # restored, left for evaluation
    assert not recalibrate(build_model("mlp", digits.input_shape, digits.num_classes, {}, seed=0), digits.train_x, 8)


def test_the_cpu_probe_grows_with_the_model_and_bounds_the_batch(digits) -> None:
    small = build_model("cnn-bn", digits.input_shape, digits.num_classes, {"width": 4}, seed=0)
    wide = build_model("cnn-bn", digits.input_shape, digits.num_classes, {"width": 32}, seed=0)
    cpu = torch.device("cpu")
    a = probe_max_batch(small, digits.train_x, digits.train_y, cpu, available_bytes=64e6)
    b = probe_max_batch(wide, digits.train_x, digits.train_y, cpu, available_bytes=64e6)
    assert 0 < a.per_sample_bytes < b.per_sample_bytes
    assert b.max_batch == int((64e6 - b.fixed_bytes) / b.per_sample_bytes) < a.max_batch
    assert probe_max_batch(wide, digits.train_x, digits.train_y, cpu, available_bytes=1.0).max_batch == 0


def test_what_a_worker_declares_at_join() -> None:
    spec = JobSpec(model="cnn-bn", global_batch=64, micro_batch=8)
    assert declared_max_batch(lambda: spec, None, 24) == Declared(24)  # --max-batch wins, the spec is not asked for
    found = declared_max_batch(lambda: spec, None, None)
    assert found.max_batch == 0 and found.pass_samples >= 8 and found.pass_samples % 8 == 0  # a pass, not k*m
    assert found.built is not None and found.built.spec == spec  # handed to the session, not built again
    found = declared_max_batch(lambda: JobSpec(model="cnn-bn"), None, None)
    assert found.max_batch >= 1 and found.pass_samples is None
    with pytest.raises(JobSetupError, match="cannot build"):
        declared_max_batch(lambda: JobSpec(model="no-such-model"), None, None)


def test_a_first_sample_the_dataset_cannot_give_is_a_setup_error_naming_it(tmp_path) -> None:
    """The memory probe reads the first training samples before the worker joins: a dataset's own error
    there (a row of NaN, a corrupt file) is one JobSetupError with its words, not a traceback."""
    import numpy as np

    features = np.random.default_rng(0).random((40, 4))
    features[:, 1] = np.nan
    np.save(tmp_path / "features.npy", features)
    np.save(tmp_path / "labels.npy", np.arange(40) % 2)
    spec = JobSpec(dataset="npy_arrays", dataset_options={"root": str(tmp_path)})
    with pytest.raises(JobSetupError, match=r"first training samples .*features\.npy row \d+ holds NaN or Inf"):
        declared_max_batch(lambda: spec, None, None)


def test_the_probe_leaves_the_model_as_it_was(digits) -> None:
    """The probe's steps run on the model the session then trains: its parameters, BatchNorm buffers,
    gradients (none) and mode are as built."""
    model = build_model("cnn-bn", digits.input_shape, digits.num_classes, {}, seed=0).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe_max_batch(model, digits.train_x, digits.train_y, torch.device("cpu"), small=4, available_bytes=64e6)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and not model.training


def test_a_measuring_worker_builds_the_job_once(ps_server, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    def counted(name: str, *args: object) -> torch.nn.Module:
        built.append(name)
        return build_model(name, *args)

    monkeypatch.setattr(job_build, "build_model", counted)
    server = ps_server("--workers", "1", "--global-batch", "8")  # the mlp: the test's own model for it
    with connect(server.target, name="w0", cores=1.0) as session:
        assert session.max_batch >= 2 and built == ["mlp"]
        x, y = next(iter(session.batches()))
        backward_in_micro_batches(session.model, x, y, 1)
        session.step()
    assert built == ["mlp"]
