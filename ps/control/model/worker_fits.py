"""What the model policy holds of each worker's times (worker_times.py): its fitted finish time
(time_fit.py) and what a decision reports of it, how many probe decisions it had, and whether its
speed drifted during its run at its batch, in which case its history is rescaled to the new speed.
Pure."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ps.control.model.observations import Observations, fit_each
from ps.control.model.time_fit import Finish, Fit, slope_measured
from ps.control.model.worker_times import WorkerTimes
from ps.control.performance import FinishTime


class WorkerFits(WorkerTimes):
    """Every worker's observations, its fit and its probe decisions."""

    def __init__(self, min_samples: int, deadband: float) -> None:
        super().__init__(min_samples)
        self.deadband = deadband
        self.probes: dict[str, int] = {}  # probe decisions per worker
        # `finishes` with the workers' observations and their versions it is of
        self._finishes: tuple[list[tuple[str, Observations]], list[int], Mapping[str, Finish]] | None = None

    def add(self, worker_id: str) -> None:
        super().add(worker_id)
        self.probes[worker_id] = 0

    def remove(self, worker_id: str) -> None:
        super().remove(worker_id)
        self.probes.pop(worker_id, None)

    def fit(self, worker_id: str) -> Fit | None:
        return self.obs[worker_id].fit(self.min_samples)

    def measured_batches(self, worker_id: str) -> int:
        """The worker's fit's `batches` (the batch sizes measured `min_samples` times), read from its
        counts: whether a worker is identified is asked every round, and its fit would be made anew
        after every push."""
        n = self.min_samples
        return sum(1 for count in self.obs[worker_id].counts.values() if count >= n)

    def fit_all(self) -> None:
        """Fit every worker's observations that changed since their last fit, at once
        (observations.fit_each): for a decision about to read every worker's fit."""
        fit_each(list(self.obs.values()), self.min_samples)

    def finishes(self) -> Mapping[str, Finish]:
        """Every measured worker's fitted finish time (the stale fits made at once); read-only, and kept
        while every worker's observations are the same, at the same version: a decision asks for them
        several times, and no time comes in between."""
        held = list(self.obs.items())
        versions = [obs.version for _, obs in held]
        if self._finishes is not None and self._finishes[0] == held and self._finishes[1] == versions:
            return self._finishes[2]
        self.fit_all()
        out = {}
        for k in self.obs:
            fit = self.fit(k)
            if fit is not None:
                out[k] = fit.finish
        self._finishes = (held, versions, MappingProxyType(out))
        return self._finishes[2]

    def times(self, cautious: bool = False) -> dict[str, FinishTime]:
        """Each worker's finish time as a function of its batch (a worker not measured yet: the
        slowest measured per-sample time, so it is never predicted fast); `cautious`: plus the fit's
        uncertainty where a plan extrapolates (time_fit.Finish.cautious), for choosing between plans."""
        finishes = self.finishes()
        per_sample = max((f.at(1) for f in finishes.values()), default=1.0)
        return {k: ((finishes[k].cautious if cautious else finishes[k].at) if k in finishes
                    else (lambda b: per_sample * b)) for k in self.obs}

    def fit_runs_bases(self, batches: Mapping[str, int | None]) -> None:
        """Fit at once what `drifted` tests each worker's newest run at its batch in `batches` against:
        the fit of its observations before the run (observations.fit_each)."""
        n = self.min_samples
        runs = {k: self.obs[k].run(b) for k, b in batches.items() if b}
        tested = [k for k, run in runs.items() if run >= n]
        fit_each([self.obs[k] for k in tested], n, [runs[k] for k in tested])

    def drifted(self, worker_id: str, batch: int | None) -> bool:
        """Whether the worker's speed changed during its current run at `batch` (time_fit.
        Observations.drift); if so its history is rescaled to the new speed."""
        n = self.min_samples
        ratio = self.obs[worker_id].drift(batch, n, self.deadband) if batch else None
        if ratio is None:
            return False
        self.before_jump()
        self.obs[worker_id].rescale(ratio, keep=n)
        return True

    def report(self, plan: Mapping[str, int], min_batch: Mapping[str, int]) -> dict[str, dict[str, Any]]:
        """Each fitted worker's q, s, the batch sizes its fit has, whether its q is measured
        (time_fit.slope_measured), and whether it is bound by compute or
        by communication at its batch in `plan` (at `min_batch` where it has none or 0), with its
        exposed communication there where the worker reports it."""
        fits = {}
        for k, f in self.finishes().items():
            fit = self.fit(k)
            b = plan.get(k) or min_batch[k]
            entry: dict[str, Any] = {"q": round(f.line.q, 6), "s": round(f.line.s, 4),
                                     "batches": fit.batches if fit else 0, "bound": f.bound(b),
                                     "slope_measured": slope_measured(f.line)}
            if f.exposed is not None:
                entry["exposed_ms"] = round(f.exposed_at(b), 4)
            fits[k] = entry
        return fits
