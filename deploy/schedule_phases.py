"""A schedule's phases applied to a running cluster: when a phase boundary is crossed (every N epochs or
every N seconds, OmniLearn Fig. 10), the workers' and server's quotas are rewritten and the phase is
recorded in ``phases.jsonl`` and announced."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from deploy.launcher import LocalCluster
from deploy.run_plan import Plan

POLL_S = 0.1
"""How often the run reads the metrics log, checks its processes and the clock of a schedule in seconds."""


def format_shares(names: Sequence[str], shares: Sequence[float]) -> str:
    """``w0=1 w1=0.25``: each worker's share of cores."""
    return " ".join(f"{n}={s:.3g}" for n, s in zip(names, shares, strict=True))


class SchedulePhases:
    """The phase a run is in and the phases it went through; a run without a schedule has one, unlogged."""

    def __init__(self, plan: Plan, say: Callable[[str], None]) -> None:
        self.plan = plan
        self.say = say
        self.path = plan.out / "phases.jsonl"
        self.records: list[dict[str, Any]] = []
        self.index = 0

    def after_epoch(self, cluster: LocalCluster, event: dict[str, Any]) -> None:
        """At an epoch-based schedule's boundary (not after the last epoch), switch to the next phase."""
        schedule = self.plan.schedule
        if schedule is None or schedule.every_epochs is None:
            return
        epoch = int(event["epoch"])
        if epoch < self.plan.epochs and epoch % schedule.every_epochs == 0:
            index = schedule.phase_index(epoch)
            if index != self.index:
                self.switch(cluster, index, event)

    def on_clock(self, cluster: LocalCluster, job_start: float | None, events: Sequence[dict[str, Any]]) -> None:
        """Under a seconds-based schedule, switch when the job's elapsed time enters another phase."""
        schedule = self.plan.schedule
        if schedule is None or schedule.every_seconds is None or job_start is None:
            return
        if any(e.get("event") == "summary" for e in events[-3:]):
            return
        elapsed = time.time() - job_start
        index = schedule.phase_index(elapsed)
        if index != self.index:
            self.switch(cluster, index, None, elapsed)

    def switch(self, cluster: LocalCluster, index: int, epoch_event: dict[str, Any] | None,
               elapsed: float | None = None) -> None:
        """Rewrite the quotas to phase ``index``'s shares and record the phase."""
        cluster.set_shares(self.plan.shares[index])
        server = self.plan.server_shares[index]
        if server is not None and server != cluster.server_share:
            cluster.set_server_share(server)
        self.index = index
        self.log(index, epoch_event, elapsed)

    def log(self, index: int, epoch_event: dict[str, Any] | None, elapsed: float | None = None) -> None:
        """Append phase ``index`` to ``phases.jsonl`` and announce it (nothing without a schedule)."""
        schedule = self.plan.schedule
        if schedule is None:
            return
        profile = self.plan.profiles[index]
        record: dict[str, Any] = {"event": "phase", "phase": index, "profile": profile.name, "shares": self.plan.shares[index]}
        if self.plan.server_shares[index] is not None:
            record["server_share"] = self.plan.server_shares[index]
        if schedule.every_epochs is not None:
            record["epoch"] = index * schedule.every_epochs
            where = f"after epoch {record['epoch']}"
        else:
            record["elapsed_s"] = round(elapsed if elapsed is not None else 0.0, 3)
            where = f"at {record['elapsed_s']:g} s"
        record["time"] = round(time.time(), 3)
        self.records.append(record)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        heterogeneity = profile.allocation(self.plan.config.mode).heterogeneity
        self.say(
            f"phase {index + 1}/{len(self.plan.profiles)} {profile.name} (HL {heterogeneity:g}) {where}: "
            f"shares {format_shares(self.plan.names, self.plan.shares[index])} cores"
        )

    def clear(self) -> None:
        """Remove a previous run's ``phases.jsonl`` from the output folder."""
        self.path.unlink(missing_ok=True)
