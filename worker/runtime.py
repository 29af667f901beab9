"""The worker runtime as a library: join, iterate batches sized by the server's plan, step.

A custom training loop needs three calls::

    from worker import connect
    import torch.nn.functional as F

    with connect("127.0.0.1:50051", name="w0") as session:
        model = session.model
        for x, y in session.batches():          # sizes follow the server's plan
            loss = F.cross_entropy(model(x), y)
            model.zero_grad()
            loss.backward()
            session.step()                       # returns once the reply's header is in

Compute time (data fetch, forward, backward; the wait for the loader is also sent apart) runs from
the moment a batch is fetched until step() is called; it is what the server's batch policy balances
(worker/timing/step_timer.py). How a step goes, on either path: worker/session/step_runner.py.

A worker the server parks (BSP, `--policy model`: batch 0, the round is shorter without it) gets no
batches until it is planned one; it waits in a long poll and pulls the parameters before computing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn
from torch.utils.data import Dataset as TorchDataset

from common.job.datasets import TrainingData
from common.job.spec import JobSpec
from common.transport.messages import StepHeader
from worker.data.job_build import BuiltJob
from worker.data.loader import LoaderError, LoaderOptions
from worker.data.slices import OwnData
from worker.probes.resources import SlowerMachine
from worker.session.membership import Membership
from worker.session.plan_follower import PlanFollower
from worker.session.replica import Replica
from worker.session.step_runner import StepRunner
from worker.transport.client import PSClient, ServerError


class Session:
    """One worker's membership in a job: its model, data, batch size and step(). Joins at construction
    (connect() builds it); `slowdown` and `step_overhead_ms` emulate a slower machine
    (worker/probes/resources.py), `max_batch` and `pass_samples` are the memory probe's
    (worker/data/memory_probe.py), `built` the job it built already, `loader` how batches are read,
    `data` the user's own training set, `allowed_imports` the modules a job's factory path may come
    from (worker/data/job_build.py)."""

    def __init__(
        self, client: PSClient, name: str, cores: float, slowdown: float = 1.0, retry_for: float = 120.0,
        device: torch.device | None = None, step_overhead_ms: float = 0.0, max_batch: int = 0,
        pass_samples: int | None = None, overlap: bool = True, built: BuiltJob | None = None,
        loader: LoaderOptions = LoaderOptions(), data: OwnData | None = None,
        allowed_imports: Sequence[str] = (),
    ) -> None:
        machine = SlowerMachine(slowdown, step_overhead_ms)  # checked before joining
        self.client, self.name, self.cores = client, name, cores
        self.device = device or torch.device("cpu")
        self.max_batch, self.pass_samples = max_batch, pass_samples
        self.closed = False  # set by close(): whether the connection closed (see PSClient.close)
        self._membership = Membership(client, name, cores, self.device, max_batch, retry_for)
        try:
            self._replica = Replica(self._membership, self.device, overlap, built, allowed_imports)
            self._follower = PlanFollower(self._replica, loader, data, max_batch)
            self._steps = StepRunner(self._replica, self._follower, machine)
            self._follower.apply(self._replica.pull_global_model())
        except BaseException:
            self._membership.abandon()
            raise

    # ------------------------------------------------------- what it exposes
    @property
    def worker_id(self) -> str:
        return self._membership.worker_id

    @property
    def rejoins(self) -> int:
        return self._membership.rejoins

    @property
    def spec(self) -> JobSpec:
        return self._replica.spec

    @property
    def model(self) -> nn.Module:
        return self._replica.model

    @property
    def dataset(self) -> TrainingData:
        return self._replica.dataset

    @property
    def plan(self) -> StepHeader:
        return self._follower.plan

    @property
    def batch_size(self) -> int:
        return self.plan.batch_size

    @property
    def epoch(self) -> int:
        return self.plan.epoch

    @property
    def done(self) -> bool:
        return self.plan.done

    @property
    def steps(self) -> int:
        return self._steps.steps

    @property
    def last_compute_ms(self) -> float:
        return self._steps.last_compute_ms

    @property
    def data_wait_ms(self) -> float:
        """The last batch's wait for the loader."""
        return self._steps.timer.data_wait_ms

    @property
    def exposed_ms(self) -> float:
        """The last step's exposed communication: its compute's end to the next fetch, plus the forward's wait."""
        return self._steps.timer.exposed_ms

    @property
    def parked_polls(self) -> int:
        return self._steps.parked_polls

    @property
    def streamed_replies(self) -> int:
        return self._steps.streamed_replies

    # ---------------------------------------------------------------- training
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch of the planned size; starts this step's compute timer."""
        return self._steps.next_batch()

    def batches(self, dataset: TorchDataset | None = None,
                fingerprint: str = "") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches until the server ends the job; call step() after each. While the server parks this
        worker (batch 0) none come: it waits for a batch (wait_parked). `dataset`: your own training set
        instead of the job's, as many samples (worker.data.slices.OwnData; declared at the next Join)."""
        if dataset is not None:
            self._follower.use_dataset(dataset, fingerprint)
        self.model.train()
        while not self.done:
            if self.batch_size == 0:
                self.wait_parked()
                continue
            yield self.next_batch()

    def wait_parked(self) -> StepHeader:
        """Parked: wait in the server's long poll until it plans this worker a batch (or the job ends),
        then pull the parameters; the plan."""
        return self._steps.wait_parked()

    @property
    def sub_batch(self) -> int:
        """How many of the drawn batch's first samples the server's noise scale asks a gradient norm of
        (0: none): half the batch where this worker trains alone in an --adaptive-batch job. A loop
        measures it with worker.accumulate.backward_with_sub_norm and `note_sub_norm`; one that does
        not leaves the server to pair rounds instead (worker/session/sub_batch.py)."""
        return self._steps.sub_batch.size

    def paused_push(self) -> contextlib.AbstractContextManager[None]:
        """Within: backward sends no gradient bucket (the first pass over the sub-batch)."""
        return self._steps.paused_push()

    def note_sub_norm(self, size: int, sq_norm: float) -> None:
        """|g_s|² of the mean gradient over the drawn batch's first `size` (= sub_batch) samples, for
        this step's push."""
        self._steps.sub_batch.note(size, sq_norm)

    def step(self) -> StepHeader:
        """Push this step's gradients; return once the new parameters are in the model."""
        return self._steps.step()

    def wait_params(self) -> StepHeader:
        """Return once the last reply's parameters are all in the model (step() returns at its first
        chunk: worker/paths/forward_order.py); the plan."""
        self._steps.settle_params()
        return self.plan

    # --------------------------------------------------------------- lifecycle
    def leave(self, reason: str = "") -> None:
        """Tell the server this worker is going, and why ("": not said; not needed once the job is done)."""
        if not self.done:
            self._membership.leave(reason)

    def close(self) -> None:
        """Stop the heartbeat, leave the process group and close the connection (`closed` then says
        whether the connection's close finished: see PSClient.close)."""
        self._membership.close()
        self._follower.close()
        self._replica.close()
        self.closed = self.client.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        """Leave unless the job is done (an error, or a loop that stopped early), then close. A worker
        that stops on its data (LoaderError: a corrupt sample) tells the server which."""
        try:
            with contextlib.suppress(ServerError):
                self.leave(error.reason() if isinstance(error, LoaderError) else "")
        finally:
            self.close()
