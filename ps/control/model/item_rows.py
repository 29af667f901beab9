"""A worker's observations as rows of one float array (`ItemRows`), kept beside the list of tuples
(model/observations.py) and changed with it in place: many workers' fits (time_fits.py) read every
worker's rows at once, where reading thousands of tuples one field at a time was a third of a
decision at a thousand workers. Pure."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Item = tuple[int, int, float, float | None]
"""One observation: (sequence number, batch, ms, exposed ms or None)."""

COLUMNS = 4
"""A row's fields: sequence number, batch, ms, exposed ms (NaN for None). Sequence numbers and batch
sizes are whole numbers far below 2**53, which a float holds exactly."""


class ItemRows:
    """The items of a list, in its order, as the first `len` rows of an array that grows as needed."""

    def __init__(self, items: Sequence[Item] = ()) -> None:
        self._rows = np.empty((0, COLUMNS), dtype=np.float64)
        self._len = 0
        self.reset(items)

    def __len__(self) -> int:
        return self._len

    def reset(self, items: Sequence[Item]) -> None:
        """Hold exactly `items`."""
        self._rows = np.empty((max(2 * len(items), 16), COLUMNS), dtype=np.float64)
        self._len = len(items)
        if items:
            self._rows[:self._len] = [(seq, b, ms, np.nan if e is None else e) for seq, b, ms, e in items]

    def append(self, item: Item) -> None:
        """Hold `item` after the others."""
        if self._len == len(self._rows):
            grown = np.empty((2 * len(self._rows), COLUMNS), dtype=np.float64)
            grown[:self._len] = self._rows[:self._len]
            self._rows = grown
        seq, b, ms, e = item
        self._rows[self._len] = (seq, b, ms, np.nan if e is None else e)
        self._len += 1

    def delete(self, index: int) -> None:
        """Drop the item at `index` (0 <= index < len), the later ones moved up by one."""
        self._rows[index:self._len - 1] = self._rows[index + 1:self._len]
        self._len -= 1

    def rows(self) -> np.ndarray:
        """The items as rows (a view, valid until the next change)."""
        return self._rows[:self._len]
