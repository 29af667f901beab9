"""Whole BSP rounds of two in-process sessions on fixed data, and the same rounds as one process with
torch.optim: what the worker's bucketed and forward-order steps are checked against."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from common.job.datasets import build_dataset
from common.job.models import build_model
from worker.connection import connect
from worker.runtime import Session

TIMEOUT = 60.0


# ------------------------------------------------------------- whole rounds
def _sessions(ps_server, threads, *args: str, overlap_on: bool = True) -> tuple[object, list[Session]]:
    server = ps_server("--global-batch", "32", "--controller", "static", "--lr", "0.05", *args)
    futures = [threads.submit(connect, server.target, name, cores, overlap=overlap_on, threads=None, allow_imports=("tests",))
               for name, cores in (("a", 12.0), ("b", 20.0))]
    return server, [f.result(TIMEOUT) for f in futures]


def _train(ps_server, threads, *args: str, rounds: int = 3, overlap_on: bool = True,
           edit=None) -> tuple[torch.Tensor, list[Session]]:
    """`rounds` BSP rounds of two sessions on fixed data (a the first 12 samples of each 32, b the
    rest), b pushing once a's push is in (the server sums in arrival order); the parameters after
    them and the sessions (closed)."""
    server, sessions = _sessions(ps_server, threads, *args, overlap_on=overlap_on)
    data = build_dataset("digits", {}, 0)
    try:
        for r in range(rounds):
            futures = []
            start = 32 * r
            for session in sessions:
                n = session.batch_size
                x, y = data.train_x[start : start + n], data.train_y[start : start + n]
                start += n

                def step(session: Session = session, x: torch.Tensor = x, y: torch.Tensor = y) -> None:
                    session.next_batch()
                    session.model.zero_grad()
                    F.cross_entropy(session.model(x), y).backward()
                    if edit is not None:
                        edit(session.model)
                    session.step()

                futures.append(threads.submit(step))
                deadline = time.monotonic() + TIMEOUT
                while len(futures) == 1 and not server.call(lambda: len(server.coordinator.bsp.pushed)):
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
            for future in futures:
                future.result(TIMEOUT)
        for session in sessions:
            session.wait_params()  # the last reply's parameters may still be streaming in
        params = sessions[0]._replica.parts.params.clone()
        assert torch.equal(params, sessions[1]._replica.parts.params)
        return params, sessions
    finally:
        for session in sessions:
            session.close()


def _reference(optimizer: str, model_name: str = "mlp", rounds: int = 3, edit=None) -> torch.Tensor:
    """The same rounds as one process: each step on all 32 samples, with torch.optim."""
    data = build_dataset("digits", {}, 0)
    model = build_model(model_name, data.input_shape, data.num_classes, {"hidden": 16}, 0)
    opt = (torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=0.05))
    for r in range(rounds):
        opt.zero_grad()
        F.cross_entropy(model(data.train_x[32 * r : 32 * (r + 1)]), data.train_y[32 * r : 32 * (r + 1)]).backward()
        if edit is not None:
            edit(model)
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
