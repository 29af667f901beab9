"""Parameters back in forward order (worker/paths/forward_order.py): each module waits for its own
parameters only, so the forward starts while later layers still arrive; a failed reply wakes the
forward and fails the step; parameters read outside their module are waited for before the
forward; and whole BSP rounds with the streamed reply equal the whole-gradient step (the session
tests of tests/worker/paths/test_overlap.py run it too)."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from common.transport.layout import flatten_params, load_flat
from worker.paths import overlap
from worker.transport.client import ServerError
from worker.paths.forward_order import ForwardOrder
from worker.transport.arrivals import Arrivals
from tests.overlap_rounds import _reference, _train

TIMEOUT = 60.0
CHILD_WEIGHT_MODEL = "tests.worker.paths.test_forward_order:reads_child_weight"


class ReadsChildWeight(nn.Module):
    """A parent whose forward uses a child's weight itself (the child's own forward never runs)."""

    def __init__(self, features: int, num_classes: int, hidden: int) -> None:
        super().__init__()
        self.body = nn.Linear(features, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(torch.relu(self.body(x.flatten(1))), self.head.weight, self.head.bias)


def reads_child_weight(input_shape: tuple[int, ...], num_classes: int, hidden: int = 16) -> nn.Module:
    return ReadsChildWeight(math.prod(input_shape), num_classes, hidden)


def _streaming_model() -> tuple[nn.Sequential, torch.Tensor, Arrivals, ForwardOrder]:
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    flat = flatten_params(model)
    load_flat(model, flat)  # the model's parameters are views of the flat vector, as on a worker
    arrivals = Arrivals()
    return model, flat, arrivals, ForwardOrder(model, arrivals)


def _ran_event(module: nn.Module) -> threading.Event:
    event = threading.Event()
    module.register_forward_hook(lambda *_: event.set())
    return event


def test_the_forward_starts_before_the_last_layers_arrive_and_computes_with_the_new_values() -> None:
    model, flat, arrivals, _ = _streaming_model()
    new = torch.randn(flat.numel(), generator=torch.Generator().manual_seed(0))
    x = torch.randn(4, 8)
    first, last = _ran_event(model[0]), _ran_event(model[4])
    first_stop = sum(p.numel() for p in model[0].parameters())
    arrivals.begin([(0, flat.numel())])
    out: list[torch.Tensor] = []
    forward = threading.Thread(target=lambda: out.append(model(x)))
    forward.start()
    flat[:first_stop] = new[:first_stop]  # the first layer's chunk is decoded
    arrivals.advance(0, first_stop)
    assert first.wait(TIMEOUT)
    assert not last.is_set()  # its values are not in: its hook holds it
    flat[first_stop:] = new[first_stop:]
    arrivals.advance(0, flat.numel())
    arrivals.end(0)
    forward.join(TIMEOUT)
    assert last.is_set()
    reference = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    load_flat(reference, new.clone())
    assert torch.equal(out[0], reference(x))
    arrivals.wait_all()
    assert arrivals.take_waited_ms() > 0


def test_ranges_of_several_servers_each_arrive_in_their_own_order() -> None:
    arrivals = Arrivals()
    arrivals.begin([(0, 100), (100, 250)])
    arrivals.advance(1, 150)  # the shard's whole range before the coordinator's first values
    assert arrivals._has(100, 250) and not arrivals._has(0, 10) and not arrivals._has(90, 110)
    arrivals.advance(0, 100)
    assert arrivals._has(0, 250)
    arrivals.end(0)
    arrivals.end(1)
    arrivals.wait_all()


def test_a_reply_that_fails_mid_stream_wakes_the_forward_and_fails_the_step() -> None:
    model, flat, arrivals, _ = _streaming_model()
    arrivals.begin([(0, flat.numel())])
    done = threading.Event()
    forward = threading.Thread(target=lambda: (model(torch.randn(2, 8)), done.set()))
    forward.start()
    arrivals.advance(0, 10)
    arrivals.end(0, ServerError("UNAVAILABLE", "the server went away"))
    forward.join(TIMEOUT)
    assert done.is_set()  # not left waiting for values that will not come
    with pytest.raises(ServerError, match="went away"):
        arrivals.wait_all()
    arrivals.wait_all()  # the error is handed over once; the next reply starts clean
    assert arrivals.begin([(0, 4)]) == [0]


def test_a_parameter_read_outside_its_module_is_waited_for_before_the_forward() -> None:
    model = reads_child_weight((4, 4), 3)
    flat = flatten_params(model)
    load_flat(model, flat)
    arrivals = Arrivals()
    order = ForwardOrder(model, arrivals)
    F.cross_entropy(model(torch.randn(2, 16)), torch.tensor([0, 1])).backward()
    order.check_step(streamed=False)  # the first step ran on complete parameters
    assert order.eager == {2, 3} and not order.warned  # head.weight and head.bias
    body = _ran_event(model.body)
    arrivals.begin([(0, flat.numel())])
    forward = threading.Thread(target=lambda: model(torch.randn(2, 16)))
    forward.start()
    arrivals.advance(0, flat.numel() - 1)  # all but the head's last value
    assert not body.wait(0.2)  # the model's own hook holds the whole forward for the head's values
    arrivals.advance(0, flat.numel())
    arrivals.end(0)
    forward.join(TIMEOUT)
    assert body.is_set()
    order.remove()


def test_the_state_dict_waits_for_the_streaming_values() -> None:
    model, flat, arrivals, _ = _streaming_model()
    arrivals.begin([(0, flat.numel())])
    got: list[dict] = []
    reader = threading.Thread(target=lambda: got.append(model.state_dict()))
    reader.start()
    reader.join(0.2)
    assert not got
    flat.fill_(2.0)
    arrivals.advance(0, flat.numel())
    arrivals.end(0)
    reader.join(TIMEOUT)
    assert all(torch.all(v == 2.0) for v in got[0].values())


# ------------------------------------------------------------- whole rounds
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_streamed_replies_step_like_one_process(ps_server, threads, monkeypatch, optimizer) -> None:
    monkeypatch.setattr(overlap, "BUCKET_VALUES", 100)
    args = ("--optimizer", optimizer, "--momentum", "0.9" if optimizer == "sgd" else "0", "--model-arg", "hidden=16")
    params, sessions = _train(ps_server, threads, *args, rounds=4)
    assert all(s._replica.parts.forward is not None and s._replica.parts.buckets is not None and s._replica.parts.buckets.streamed == 4 for s in sessions)
    torch.testing.assert_close(params, _reference(optimizer, rounds=4), rtol=0, atol=2e-6)


def test_a_model_that_reads_a_childs_weight_steps_exactly(ps_server, threads, monkeypatch) -> None:
    monkeypatch.setattr(overlap, "BUCKET_VALUES", 20)
    params, sessions = _train(ps_server, threads, "--model", CHILD_WEIGHT_MODEL, "--momentum", "0.9", rounds=4)
    assert all(s._replica.parts.forward is not None and s._replica.parts.forward.eager and not s._replica.parts.forward.warned for s in sessions)
    torch.testing.assert_close(params, _reference("sgd", CHILD_WEIGHT_MODEL, rounds=4), rtol=0, atol=2e-6)


def test_the_serial_path_does_not_stream(ps_server, threads) -> None:
    _, sessions = _train(ps_server, threads, "--model-arg", "hidden=16", overlap_on=False)
    assert all(s._replica.parts.forward is None for s in sessions)


@pytest.mark.parametrize("extra", [(), ("--wire-dtype", "bfloat16"), ("--shards", "2")])
def test_a_reply_of_many_chunks_streams_in_as_the_serial_reply_would(ps_server, threads, extra) -> None:
    """An MLP of ~1.1M parameters (5 chunks of the reply; with --shards, each server's range a lane
    of its own): the streamed replies leave the same parameters as the serial path's, bit for bit."""
    started = []

    def server(*argv: str):
        started.append(ps_server(*argv))
        if "--shards" in argv:  # as ps-server does before it admits workers
            asyncio.run_coroutine_threadsafe(started[-1].coordinator.load_shards(), started[-1]._loop).result(TIMEOUT)
        return started[-1]

    args = ("--model-arg", "hidden=1024", "--model-arg", "layers=2", "--momentum", "0.9", *extra)
    try:
        streamed, sessions = _train(server, threads, *args)
        assert all(s._replica.parts.forward is not None and s._replica.parts.buckets is not None and s._replica.parts.buckets.streamed == 3 for s in sessions)
        whole, _ = _train(server, threads, *args, overlap_on=False)
    finally:
        for each in started:
            each.job.close_shards()
    assert torch.equal(streamed, whole)


@pytest.mark.slow
def test_worker_processes_train_with_streamed_replies_through_shards_a_narrow_wire_and_a_token(tmp_path) -> None:
    """Real ps-server, ps-shard and ps-worker processes: the replies (~1.1M parameters, bf16, two
    shards, each server a lane) stream in during the forward, and the job trains to the bar."""
    from tests.processes import start_server

    token = "forward-order-token"
    cluster = start_server(tmp_path, ["--mode", "bsp", "--workers", "2", "--dataset", "digits", "--model-arg", "hidden=1024",
                                      "--epochs", "3", "--global-batch", "64", "--lr", "0.05", "--shards", "2",
                                      "--wire-dtype", "bfloat16", "--token", token, "--quiet"])
    try:
        for name in ("a", "b"):
            cluster.start_worker(name, "--token", token)
        assert cluster.wait(180) == 0, cluster.server_log()
        assert all(proc.returncode == 0 for proc in cluster.workers), [cluster.worker_log(n) for n in "ab"]
        (summary,) = cluster.events("summary")
        assert summary["epochs"] == 3 and summary["accuracy"] >= 0.85, summary
    finally:
        cluster.stop()


def test_a_reply_that_failed_while_it_streamed_drops_the_next_gradient_and_resyncs(ps_server, threads) -> None:
    """The step after a failed streamed reply pushes nothing (its forward may have read old values):
    it pulls the server's parameters instead, and the next step trains on as usual."""
    from worker.connection import connect

    server = ps_server("--workers", "1", "--global-batch", "16", "--model-arg", "hidden=16", "--lr", "0.05")
    session = connect(server.target, "solo", 1.0, threads=None)

    def step() -> None:
        x, y = session.next_batch()
        session.model.zero_grad()
        F.cross_entropy(session.model(x), y).backward()
        session.step()

    try:
        step()
        assert session.steps == 1 and session.streamed_replies == 1
        session.wait_params()
        session._replica.parts.arrivals.begin([(0, 1)])  # as if the reply's stream had broken off
        session._replica.parts.arrivals.end(0, ServerError("FAILED_PRECONDITION", "the reply broke off"))
        round_before = server.call(lambda: server.coordinator.round)
        step()
        assert session.steps == 1  # dropped: nothing pushed, the round still open
        assert server.call(lambda: server.coordinator.round) == round_before
        assert torch.equal(session._replica.parts.params, server.call(lambda: server.coordinator.store.flat.clone()))
        step()
        assert session.steps == 2 and server.call(lambda: server.coordinator.round) == round_before + 1
    finally:
        session.close()
