"""A worker's observations as rows of floats (`ItemRows`), kept beside the list of tuples
(model/observations.py) and changed with it in place, and many workers' rows joined into one array
(`joined`): many workers' fits (time_fits.py) read every worker's rows at once, where reading
thousands of tuples one field at a time was a third of a decision at a thousand workers. A row is
written into a flat `array.array` of doubles, a push's cost a fraction of a microsecond. Pure."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

import numpy as np

Item = tuple[int, int, float, float | None]
"""One observation: (sequence number, batch, ms, exposed ms or None)."""

COLUMNS = 4
"""A row's fields: sequence number, batch, ms, exposed ms (NaN for None). Sequence numbers and batch
sizes are whole numbers far below 2**53, which a float holds exactly."""


class ItemRows:
    """The items of a list, in its order, as consecutive rows of COLUMNS doubles."""

    def __init__(self, items: Sequence[Item] = ()) -> None:
        self.data = array("d")
        self.reset(items)

    def __len__(self) -> int:
        return len(self.data) // COLUMNS

    def reset(self, items: Sequence[Item]) -> None:
        """Hold exactly `items`."""
        self.data = array("d", [x for seq, b, ms, e in items for x in (seq, b, ms, math.nan if e is None else e)])

    def append(self, item: Item) -> None:
        """Hold `item` after the others."""
        seq, b, ms, e = item
        self.data.extend((seq, b, ms, math.nan if e is None else e))

    def delete(self, index: int) -> None:
        """Drop the item at `index` (0 <= index < len), the later ones moved up by one."""
        del self.data[index * COLUMNS:(index + 1) * COLUMNS]

    def rows(self, count: int | None = None) -> np.ndarray:
        """The first `count` items (all of them unless given; list slicing's meaning) as rows, a copy."""
        return joined([self], None if count is None else [count])


def joined(rows: Sequence[ItemRows], counts: Sequence[int] | None = None) -> np.ndarray:
    """The rows of each of `rows` in turn, of each only the first `counts[i]` where given (list
    slicing's meaning: a negative count leaves out that many of the newest), as one read-only array."""
    if counts is None:
        buffer = b"".join([r.data for r in rows])
    else:
        buffer = b"".join([r.data[:prefix_length(len(r), n) * COLUMNS] for r, n in zip(rows, counts, strict=True)])
    return np.frombuffer(buffer, dtype=np.float64).reshape(-1, COLUMNS) if buffer else np.empty((0, COLUMNS))


def prefix_length(length: int, count: int) -> int:
    """len(items[:count]) for a list of `length` items."""
    return len(range(length)[:count])
