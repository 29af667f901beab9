"""Prometheus metrics of a server process (prometheus-client): `ps-server --metrics-port`, `ps-shard
--metrics-port`.

Fed by what already flows, nothing measured twice: the metrics log's events and samples
(ps/ops/metrics.py, `MetricsLog.observe`) and the size of every gRPC message the handlers parse or send
(ps/serving/handlers.py, `on_message`). Names follow Prometheus' conventions: the `hetero_ps_` prefix, base
units in the name (`_seconds`, `_bytes`), `_total` on counters, so that `rate()` and
`histogram_quantile()` apply. Per-worker series carry a `worker` label (the worker's name) and are
removed when the worker leaves or is evicted, so the label set stays as large as the job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

PREFIX = "hetero_ps"
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Step and round times: from a millisecond (a small model on a fast worker) to a minute."""


class Endpoint:
    """A registry and the HTTP endpoint that serves it as /metrics (a daemon thread of prometheus-client)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self, host: str, port: int) -> int:
        """Serve /metrics on host:port (0: a free port); returns the port. OSError with one line if it cannot."""
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
        return int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class MessageMetrics:
    """The bytes of the gRPC messages a server parsed and sent, by method: the serialized messages,
    without gRPC's and HTTP/2's framing or TLS."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._bytes = {
            "received": Counter(f"{PREFIX}_grpc_received_bytes", "Bytes of the gRPC request messages received, by method",
                                ["method"], registry=registry),
            "sent": Counter(f"{PREFIX}_grpc_sent_bytes", "Bytes of the gRPC reply messages sent, by method",
                            ["method"], registry=registry),
        }

    def on_message(self, method: str, direction: str, nbytes: int) -> None:
        """The handlers' hook (ps.serving.handlers.register): one message of `nbytes` "received" or "sent"."""
        self._bytes[direction].labels(method).inc(nbytes)


class JobMetrics:
    """A training job's metrics, from the coordinator's events and samples (`observe`)."""

    def __init__(self, registry: CollectorRegistry, *, mode: str, controller: str, balance: str, path: str) -> None:
        self._mode = mode
        self._info = {"mode": mode, "controller": controller, "balance": balance, "path": path}
        self.job = Info(f"{PREFIX}_job", "The job: mode (bsp, asp), controller policy, balance (what the per-worker "
                        "step times measure: compute, busy or cycle) and path (ps, allreduce, auto until the start)",
                        registry=registry)
        self.job.info(self._info)
        self.steps = Counter(f"{PREFIX}_steps", "Steps taken: BSP rounds closed, ASP updates applied", registry=registry)
        self.samples = Counter(f"{PREFIX}_samples", "Training samples in the steps taken", registry=registry)
        self.round_duration = Histogram(
            f"{PREFIX}_round_duration_seconds", "BSP: time from one round's close to the next (the round's latency, "
            "its slowest worker included)", buckets=SECONDS_BUCKETS, registry=registry)
        self.epoch = Gauge(f"{PREFIX}_epoch", "Epochs completed", registry=registry)
        self.ended = Gauge(f"{PREFIX}_job_ended", "1 once the job has ended (finished or stopping), else 0",
                           registry=registry)
        self.accuracy = Gauge(f"{PREFIX}_test_accuracy_ratio", "Test accuracy of the last evaluation (0 to 1)",
                              registry=registry)
        self.loss = Gauge(f"{PREFIX}_test_loss", "Test loss of the last evaluation", registry=registry)
        self.joins = Counter(f"{PREFIX}_joins", "Workers admitted into the job (the first ones included)", registry=registry)
        self.leaves = Counter(f"{PREFIX}_leaves", "Workers that left the job (Leave)", registry=registry)
        self.evictions = Counter(f"{PREFIX}_evictions", "Workers evicted after --evict-after without a heartbeat, or at a deadline",
                                 registry=registry)
        self.deadline_drops = Counter(f"{PREFIX}_deadline_evictions", "Workers evicted at a deadline (a round's, "
                                      "or holding others back under --staleness-bound) while their heartbeat went on",
                                      registry=registry)
        self.checkpoint_failures = Counter(f"{PREFIX}_checkpoint_failures", "Checkpoint writes that failed "
                                           "(the metrics log's checkpoint_failed records say why)", registry=registry)
        self.workers = Gauge(f"{PREFIX}_workers", "Workers in the current plan", registry=registry)
        self.global_batch = Gauge(f"{PREFIX}_global_batch", "Samples per step over all workers (the plan's sum)",
                                  registry=registry)
        self.decisions = Counter(f"{PREFIX}_controller_decisions", "The controller's plans: decisions (epoch ends, "
                                 "--adjust-every) and re-splits at membership changes; changed=\"true\" when the plan "
                                 "changed", ["changed"], registry=registry)
        self.batch_size = Gauge(f"{PREFIX}_worker_batch_size", "A worker's batch in the current plan (samples)",
                                ["worker"], registry=registry)
        self.smoothed = Gauge(f"{PREFIX}_worker_smoothed_step_seconds", "The smoothed (EWMA) step time of a worker "
                              "that the controller's last plan used", ["worker"], registry=registry)
        self.pushes = Counter(f"{PREFIX}_worker_pushes", "Steps a worker contributed (BSP pushes, ASP updates)",
                              ["worker"], registry=registry)
        self.worker_samples = Counter(f"{PREFIX}_worker_samples", "Training samples in a worker's pushes",
                                      ["worker"], registry=registry)
        self.step_time = Histogram(
            f"{PREFIX}_worker_step_time_seconds", "A worker's time per step as the job balances it (hetero_ps_job_info's "
            "balance: compute = fetch + forward + backward, busy = compute + its own part of the push, cycle = from "
            "the round's reply to its next push, timed by the server)", ["worker"], buckets=SECONDS_BUCKETS,
            registry=registry)
        self.data_wait = Histogram(
            f"{PREFIX}_worker_data_wait_seconds", "Of a worker's compute time per step, the time it waited for its "
            "batch from its loader (ps-worker --loader-workers)", ["worker"], buckets=SECONDS_BUCKETS, registry=registry)
        self._per_worker = (self.batch_size, self.smoothed, self.pushes, self.worker_samples, self.step_time,
                            self.data_wait)
        self._workers: set[str] = set()
        self._last_step: float | None = None
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "step": self._step, "push": self._push, "adjust": self._adjust, "epoch": self._epoch, "eval": self._eval,
            "join": lambda r: self.joins.inc(), "leave": self._gone, "evict": self._gone, "path": self._path,
            "end": lambda r: self.ended.set(1), "deadline": lambda r: self.deadline_drops.inc(),
            "checkpoint_failed": lambda r: self.checkpoint_failures.inc(),
        }

    def observe(self, record: dict[str, Any]) -> None:
        """A MetricsLog observer: one event or sample."""
        handler = self._handlers.get(record["event"])
        if handler is not None:
            handler(record)

    def _step(self, record: dict[str, Any]) -> None:
        now = time.monotonic()
        self.steps.inc()
        self.samples.inc(record["batch"])
        if self._mode == "bsp" and self._last_step is not None:
            self.round_duration.observe(now - self._last_step)
        self._last_step = now

    def _push(self, record: dict[str, Any]) -> None:
        worker = record["worker"]
        self._workers.add(worker)
        self.pushes.labels(worker).inc()
        self.worker_samples.labels(worker).inc(record["batch"])
        if record["ms"] is not None:
            self.step_time.labels(worker).observe(record["ms"] / 1000.0)
        self.data_wait.labels(worker).observe(record.get("data_wait_ms", 0.0) / 1000.0)

    def _adjust(self, record: dict[str, Any]) -> None:
        plan: dict[str, int] = record["batch_sizes"]
        self.decisions.labels("true" if record["changed"] else "false").inc()
        self.workers.set(len(plan))
        self.global_batch.set(sum(plan.values()))
        for worker, batch in plan.items():
            self._workers.add(worker)
            self.batch_size.labels(worker).set(batch)
        for worker, ms in record["compute_ms"].items():
            self.smoothed.labels(worker).set(ms / 1000.0)
        for worker in self._workers - set(plan):  # out of the plan: gone, or gone from the controller
            self._forget(worker, (self.batch_size, self.smoothed))

    def _epoch(self, record: dict[str, Any]) -> None:
        self.epoch.set(record["epoch"])

    def _eval(self, record: dict[str, Any]) -> None:
        self.accuracy.set(record["accuracy"])
        self.loss.set(record["loss"])

    def _gone(self, record: dict[str, Any]) -> None:
        (self.leaves if record["event"] == "leave" else self.evictions).inc()
        self._forget(record["worker"], self._per_worker)
        self._workers.discard(record["worker"])

    def _path(self, record: dict[str, Any]) -> None:
        self._info.update(balance=record["balance"], path="allreduce" if record["allreduce"] else "ps")
        self.job.info(self._info)

    @staticmethod
    def _forget(worker: str, metrics: tuple[Any, ...]) -> None:
        for metric in metrics:
            try:
                metric.remove(worker)
            except KeyError:  # never had a series
                pass
