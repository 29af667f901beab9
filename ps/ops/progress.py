"""A job's progress for a person: on a terminal a tqdm bar over the epochs, with the rounds, samples/s,
test accuracy and an estimate of the time left, other lines printed above it; elsewhere (pipes, log
files, CI) plain lines, one per event a person watches, which a bar's carriage returns would garble.
`progress_echo` is the metrics log's echo that picks one or the other.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm

from common.job.endings import STOPPING, ended_early


def on_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal (a bar there; plain lines elsewhere)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class EpochBar:
    """The bar: advanced by `epoch` records, its accuracy by `eval` records."""

    def __init__(self, epochs: int, stream: TextIO, start: int = 0) -> None:
        self._stream = stream
        self._bar = tqdm(total=epochs, initial=start, file=stream, unit="epoch", desc="epoch", dynamic_ncols=True,
                         bar_format="{desc} {n_fmt}/{total_fmt} |{bar}| {elapsed}<{remaining}{postfix}")
        self._postfix: dict[str, Any] = {}

    def update(self, record: dict[str, Any]) -> bool:
        """Show `record` on the bar; False for a record the bar does not show (print it as a line)."""
        event = record.get("event")
        if event == "epoch":
            self._postfix["rounds"] = record.get("step")
            if record.get("samples_per_s") is not None:
                self._postfix["samples/s"] = f"{record['samples_per_s']:.0f}"
            self._bar.update(max(0, int(record["epoch"]) - self._bar.n))
        elif event == "eval":
            self._postfix["acc"] = f"{record['accuracy']:.4f}"
        elif event == "resume":
            self._bar.update(max(0, int(record["epoch"]) - self._bar.n))
            return False
        else:
            return False
        self._bar.set_postfix(self._postfix, refresh=True)
        return True

    def write(self, line: str) -> None:
        """A line above the bar."""
        self._bar.write(line, file=self._stream)

    def close(self) -> None:
        self._bar.close()


def trained_alongside(record: dict[str, Any]) -> str | None:
    """What an `epoch` record that ended with the one before it says of itself (its `with_epoch`), None
    for any other record: every view of the epochs words it alike."""
    if record.get("event") != "epoch" or "with_epoch" not in record:
        return None
    return f"ended with epoch {record['with_epoch']}, which trained alongside it"


NO_WORKER_LEFT = "no worker is left: the job waits for one to join"
"""What a leave or eviction's line adds when it left a running job without workers, which waits (nothing
ends it but a join or a stop)."""


def adapt_line(record: dict[str, Any]) -> str:
    """An `adapt` record's line where B moved (--adaptive-batch gns): from, to, why, and φ (unknown while
    it is not measured)."""
    phi = record.get("phi")
    noise = "unknown" if phi is None else f"{phi:.4g}"
    return f"global batch {record['current']} -> {record['global_batch']} ({record['reason']}; noise scale {noise})"


def progress_line(record: dict[str, Any]) -> str | None:
    """The human progress line of a record a person watches (None for the others). An epoch line names what its
    times measure: the record's `balance` (compute, busy or cycle time; the job's, which --allreduce
    auto may change at the start)."""
    event = record["event"]
    if (along := trained_alongside(record)) is not None:
        line = f"epoch {record['epoch']}: {along}"
    elif event == "epoch":
        batches = " ".join(f"{k}={v}" for k, v in record["batch_sizes"].items())
        times = " ".join(f"{k}={v:.1f}" for k, v in record["compute_ms"].items())
        line = f"epoch {record['epoch']}: {record['samples_per_s']} samples/s | batch {batches} | {record['balance']} ms {times}"
        if any(record.get("data_wait_ms", {}).values()):  # of those times, the wait for the loader's batches
            line += " | data wait ms " + " ".join(f"{k}={v:.1f}" for k, v in record["data_wait_ms"].items())
    elif event == "eval":
        line = f"epoch {record['epoch']}: test accuracy {record['accuracy']:.4f} loss {record['loss']:.4f}"
    elif event == "adapt" and record.get("changed"):
        line = adapt_line(record)
    elif event == "adjust" and record.get("changed"):
        line = "plan: " + " ".join(f"{k}={v}" for k, v in record["batch_sizes"].items())
    elif event in ("evict", "leave"):
        line = f"{record['worker']} left: {record['why']}" if record.get("why") else f"{record['worker']}: {record['reason']}"
        if record.get("workers_left") == 0 and not record.get("done"):
            line += f" ({NO_WORKER_LEFT})"
    elif event == "end" and ended_early(record["reason"]):  # the one line that says why (not the summary's)
        line = f"job ended at epoch {record['epoch']}, step {record['step']}: {record['reason']}"
    elif event == "join_refused":
        line = f"{record['worker']}: refused at join: {record['reason']}"
        if record.get("unlogged"):
            line += f" ({record['unlogged']} more refusals since the last line went unlogged)"
    elif event == "join_wait":
        line = f"{record['worker']}: turned away after waiting {record['waited_s']:g} s for the job to start (--join-wait)"
    elif event == "regroup":
        line = f"group generation {record['generation']}: {record['world_size']} workers over {record['backend']}"
        if record.get("algorithm"):
            line += f", {record['algorithm']} all-reduce"
        if record.get("why"):
            line += f" ({record['why']})"
    elif event == "path":
        path = "collective fast path" if record["allreduce"] else "PS path"
        line = f"--allreduce auto: the {path} ({record['why']}; the controller balances {record['balance']} time)"
    elif event == "resume":
        line = f"resumed at epoch {record['epoch']}, step {record['step']} (params sha256 {record['params_sha256'][:12]})"
    elif event == "summary":
        shown = {k: record[k] for k in ("mode", "controller", "epochs", "wall_s", "samples_per_s", "accuracy")}
        if record.get("reason") == STOPPING:  # an early end's reason has its own line already (the `end` record's)
            shown["reason"] = record["reason"]
        line = "summary: " + json.dumps(shown)
    else:
        return None
    return line


def print_progress(record: dict[str, Any]) -> None:
    """Plain progress lines on stderr (pipes, logs, CI)."""
    line = progress_line(record)
    if line is not None:
        print(line, file=sys.stderr, flush=True)


def progress_echo(epochs: int, stream: TextIO | None = None) -> Callable[[dict[str, Any]], None]:
    """The metrics log's echo: a bar on `stream` (stderr) when it is a terminal, plain lines otherwise."""
    stream = stream or sys.stderr
    if not on_terminal(stream):
        return print_progress
    bar = EpochBar(epochs, stream)

    def echo(record: dict[str, Any]) -> None:
        if record["event"] == "summary":
            bar.close()
        if bar.update(record):
            return
        line = progress_line(record)
        if line is not None:
            bar.write(line)

    return echo
