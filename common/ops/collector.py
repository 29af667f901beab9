"""Python's cyclic garbage collector tuned for a long-lived server that holds many small objects
(`tune_collector`).

The batch policy keeps every worker's recent times as tuples, lists and dicts: tens of objects a
worker, millions at ten thousand workers. With the collector's defaults (a young collection every
700 net allocations, an old one every 100 young ones) a decision at many workers triggers young
collections by the hundred and, now and then, a full one that walks every object the process holds:
at 10,000 simulated workers a full collection took up to 156 ms of a decision's 474 ms median, and
a server's event loop, which serves every push, stalls for as long. Nearly all of these objects are
freed by reference counting the moment they are dropped; the collector only finds cycles, which
the policy and the rounds seldom make.

`tune_collector` first collects what is garbage now and freezes the rest (the job built at start:
model, data, the parsed flags) out of the collector's reach for good (`gc.freeze`), then collects
the young generation every YOUNG allocations, and so every generation about seventy times less
often. The cost is cyclic garbage kept longer, up to YOUNG container objects: a few MiB.
"""

from __future__ import annotations

import gc

YOUNG = 50_000
"""Net container allocations between young collections (the default is 700)."""
MIDDLE = 10
"""Young collections between collections of the middle generation (the default's)."""
OLD = 10
"""Middle collections between full ones, which the collector makes only where the objects that
survived since the last full one are a quarter of those it would walk (the default's)."""


def tune_collector() -> None:
    """Collect, freeze what survives, and set the thresholds above; for a process that runs a job after
    building it once (ps-server, and the simulator that prices its policy's decisions)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
