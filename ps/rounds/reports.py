"""What the coordinator reports about the job: the summary at its end (and in `ps-server`'s last
line) and the status a Status call answers with."""

from __future__ import annotations

from typing import Any

from common.transport.messages import JobStatus, WorkerStatus
from ps.rounds.state import JobState


def summary(state: JobState, start_time: float | None, end_time: float | None, accuracy: float | None,
            loss: float | None, start_samples: int = 0) -> dict[str, Any]:
    """The job's totals: its rounds, updates and epochs, its last evaluation; its throughput over this
    run's wall time and the samples trained in it (a resumed job's `start_samples` were trained before)."""
    s = state
    end = end_time or s.clock()
    wall = end - (start_time or end)
    return {
        "mode": s.spec.mode,
        "controller": s.policy.config.policy,
        "balance": s.spec.balance,  # what the compute_ms the workers reported measure
        "allreduce": s.spec.allreduce,  # the collective fast path (chosen, or picked by --allreduce auto)
        "epochs": s.epoch,
        "rounds": s.round,
        "updates": s.version,
        "wall_s": round(wall, 3),
        "samples_per_s": round((s.samples - start_samples) / wall, 2) if wall > 0 else None,
        "accuracy": accuracy,
        "loss": loss,
        "adjustments": s.policy.adjustments,
        "batch_sizes": s.policy.plan(),
        "parked": s.policy.parked(),
        "update_counts": s.membership.update_counts(),
        "reason": s.reason,
    }


def status(state: JobState, path: str, path_why: str, accuracy: float | None, *, adaptive_batch: str,
           noise_scale: float | None, efficiency: float | None, lr: float) -> JobStatus:
    """Where the job is and every worker's plan, smoothed time, updates and staleness; `path` is the
    one it runs on (ps, allreduce, or auto while --allreduce auto has not chosen yet), `path_why`
    --allreduce auto's reason ("" where the command line chose); the rest is --adaptive-batch's
    (ps.rounds.adaptive_batch)."""
    s = state
    smoothed = s.policy.smoothed_ms()
    plan = s.policy.plan()
    workers = tuple(
        WorkerStatus(
            worker_id=m.worker_id,
            name=m.name,
            cores=m.cores,
            batch_size=plan.get(m.name, 0),
            compute_ms=smoothed.get(m.name) or 0.0,
            updates=m.updates,
            mean_staleness=m.staleness_sum / m.updates if m.updates else 0.0,
            parked=plan.get(m.name) == 0,
        )
        for m in s.members.values()
    )
    return JobStatus(
        mode=s.spec.mode,
        controller=s.policy.config.policy,
        round=s.round,
        version=s.version,
        epoch=s.epoch,
        epochs=s.spec.epochs,
        done=s.done,
        global_batch=sum(plan.values()),
        adjustments=s.policy.adjustments,
        last_accuracy=accuracy,
        expected_workers=s.spec.workers,
        path=path,
        path_why=path_why,
        adaptive_batch=adaptive_batch,
        noise_scale=noise_scale,
        efficiency=efficiency,
        lr=lr,
        workers=workers,
        job_json=s.spec.to_json(),
    )
