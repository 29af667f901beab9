"""The metrics log written from two threads at once (the server's event loop and the evaluator's thread,
whose `eval` records land between an ASP job's `epoch` records): one record at a time, so the file's
order, the records' times and the progress lines echoed agree."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from ps.ops.metrics import MetricsLog, read_metrics


def test_records_from_two_threads_keep_one_order_in_the_file_the_times_and_the_echo(tmp_path: Path) -> None:
    echoed: list[str] = []
    observed: list[str] = []
    inside = threading.Event()

    def echo(record: dict[str, Any]) -> None:
        if record["event"] == "eval":  # the evaluator's thread, slow to print (a terminal, a full pipe)
            inside.set()
            time.sleep(0.3)
        echoed.append(record["event"])

    log = MetricsLog(tmp_path / "metrics.jsonl", echo=echo)
    log.observe(lambda record: observed.append(record["event"]))
    evaluator = threading.Thread(target=lambda: log.write("eval", epoch=1, accuracy=0.5, loss=1.0, wall_s=1.0))
    evaluator.start()
    assert inside.wait(10)
    log.write("epoch", epoch=2)  # the event loop, meanwhile
    evaluator.join(10)
    log.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    in_file = [r["event"] for r in records]
    assert echoed == observed == in_file, (echoed, observed, in_file)
    times = [r["elapsed_s"] for r in records]
    assert times == sorted(times)
