"""The server's plan as a worker follows it: every reply's StepHeader checked and taken as the
current plan, the next batch drawn at its size (under --sampling exact, from the slice it hands, the
loader starting to read it at once), and the job's path switched when the plan names the other one."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset as TorchDataset

from common.transport.messages import StepHeader
import worker.transport.server_checks as server_checks
from worker.data.loader import Batches, LoaderOptions
from worker.data.sampler import ElasticBatchSampler
from worker.data.slices import OwnData, SliceSource
from worker.session.replica import Replica


class PlanFollower:
    """The plan in force (`plan`: set by the first `apply`) and the batches it asks for, drawn from
    the job's training set or from the user's `data`; `max_batch`: the most this worker's memory holds."""

    def __init__(self, replica: Replica, loader: LoaderOptions, data: OwnData | None, max_batch: int) -> None:
        self._replica = replica
        self._loader, self._own, self._max_batch = loader, data, max_batch
        self._samples = len(replica.dataset.train)  # type: ignore[arg-type]  # common.job.splits.Splits checks __len__
        self.sampler, self._batches = self._draws()
        self.plan: StepHeader

    def _draws(self) -> tuple[SliceSource | ElasticBatchSampler, Batches]:
        """The index source the job's spec calls for (--sampling exact: the server's slices,
        worker/data/slices.py; else its own draws) and the batches read from it."""
        replica = self._replica
        spec, n = replica.spec, self._samples
        sampler = (SliceSource(n, spec.seed, spec.epochs) if spec.exact_epochs
                   else ElasticBatchSampler(n, seed=spec.seed * 1009 + replica.member.joined.index))
        train = replica.dataset.train if self._own is None else self._own.dataset
        return sampler, Batches(train, sampler, self._loader, replica.device)

    def apply(self, plan: StepHeader) -> None:
        """Load the parameters into the model and follow `plan`."""
        self._replica.load()
        self.follow(plan)

    def follow(self, plan: StepHeader) -> None:
        """Take `plan` as the current one, checked: the next batch is drawn at its size (--sampling exact:
        its slice, one clear error if it cannot be trained on; the loader starts reading it now)."""
        replica = self._replica
        if replica.spec.exact_epochs != isinstance(self.sampler, SliceSource):  # a resume changed --sampling or --allreduce
            self._batches.close()
            self.sampler, self._batches = self._draws()
        if isinstance(self.sampler, SliceSource):  # the job's end, which a resume may have moved (Replica._rejoin)
            self.sampler.last_epoch = replica.spec.epochs
        server_checks.step_plan(plan, self._max_batch, replica.spec.micro_batch, self._samples)
        server_checks.probe_step(plan, replica.spec)
        server_checks.plan_epoch(plan, replica.spec)
        server_checks.asp_lr(plan, replica.spec)
        server_checks.group_lr(plan, replica.spec, self._samples)
        renew = (slices := isinstance(self.sampler, SliceSource)) and self.sampler.follow(plan)
        self.plan = plan
        if plan.path and not plan.done and (plan.path == "allreduce") != replica.spec.allreduce:
            replica.switch_path(plan.path == "allreduce")
        if plan.batch_size > 0:
            self.sampler.batch_size = plan.batch_size
        if slices:  # the loader starts on what is newly known (renew: after dropping what is not wanted)
            self._batches.renew(plan.batch_size, drop=renew)

    def use_dataset(self, dataset: TorchDataset[Any], fingerprint: str) -> None:
        """Train on `dataset` from now on, in place of the job's (as many samples; declared at the next Join)."""
        if self._own is not None and dataset is self._own.dataset:
            return
        replica = self._replica
        self._own = OwnData.checked(dataset, len(replica.dataset.train), fingerprint)  # type: ignore[arg-type]  # common.job.splits.Splits checks __len__
        replica.member.client.declared = self._own.declared()  # for a rejoin
        self._batches.close()
        self._batches = Batches(dataset, self.sampler, self._loader, replica.device)
        self.follow(self.plan)  # the plan's slice, read from this dataset now

    def draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch at the plan's size."""
        return self._batches.next(self.sampler.batch_size)

    @property
    def wait_ms(self) -> float:
        """The last batch's wait for the loader."""
        return self._batches.wait_ms

    def drawn(self) -> tuple[StepHeader, torch.Tensor] | None:
        """The plan and the indices of the batch just drawn, where the server handed them (--sampling exact)."""
        return (self.plan, self.sampler.taken()) if isinstance(self.sampler, SliceSource) else None

    def close(self) -> None:
        self._batches.close()
