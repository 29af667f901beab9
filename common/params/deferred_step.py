"""A step deferred and applied piece by piece as its values are read (store.py's ParameterStore is one).

The optimizer steps the vector a piece at a time (common.params.stepping): SGD and Adam act value by
value, so the pieces stepped one after another equal the vector stepped whole. A step begun is
applied only as far as a reader needs (`values_into`), and a piece a step wrote straight into a
reply's message stays "resident" there until something reads the vector whole (`flat`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from common.job.spec import JobSpec
from common.params.stepping import make_stepper
from common.transport.chunked import Vector


class DeferredStep:
    """One contiguous fp32 vector, the optimizer's stepper over it in pieces, and the step it still
    owes: the gradient (`_pending`), the next piece to step and the pieces resident in sent messages.

    `before_change` callbacks run before the values change (a step begins, an update, a load), so
    a reader that is still framing the current values (common.transport.payload) can finish first.
    """

    def __init__(self, flat: torch.Tensor, spec: JobSpec, piece_values: int | None = None) -> None:
        self._spec = spec
        self._flat = flat.detach().reshape(-1).float().clone()
        self._stepper = make_stepper(self._flat, spec, piece_values)
        self.pieces = self._stepper.pieces
        self._pending: Vector | None = None  # the gradient of a step begun and not yet fully applied
        self._next_piece = 0
        self._resident: dict[int, torch.Tensor] = {}  # piece -> its values, kept where a step wrote them (a sent message)
        self.before_change: list[Callable[[], None]] = []

    @property
    def flat(self) -> torch.Tensor:
        """All values, with any deferred step applied. Change them only through this class's methods."""
        self.settle()
        self._gather()
        return self._flat

    @property
    def numel(self) -> int:
        return self._flat.numel()

    def values_into(self, start: int, stop: int, out: torch.Tensor) -> None:
        """Write values [start, stop), stepped as far as they need to be, into `out` (converted to its
        dtype). If [start, stop) is the next piece a deferred step owes and `out` is fp32, the step
        writes into `out` and the piece's values stay there: `out` must never be written again."""
        self.settle(start)
        index = self._next_piece
        if self._pending is not None and self.pieces[index] == (start, stop) and out.dtype == self._flat.dtype:
            self._step_next(out)
            self._resident[index] = out
            return
        self.settle(stop)
        self._gather(start, stop)
        out.copy_(self._flat[start:stop])

    def settle(self, stop: int | None = None) -> None:
        """Apply the deferred step to every piece that holds a value before `stop` (default: all)."""
        stop = self.numel if stop is None else stop
        while self._pending is not None and self.pieces[self._next_piece][0] < stop:
            self._step_next()

    def _step_next(self, out: torch.Tensor | None = None) -> None:
        """Step the next piece the deferred step owes, from wherever its values are, into `out`
        (default: the contiguous vector)."""
        grad = self._pending
        assert grad is not None
        index = self._next_piece
        start, stop = self.pieces[index]
        param = self._resident.pop(index, None)
        if param is None:
            param = self._flat[start:stop]
        self._stepper.step_piece(index, grad[start:stop], param, self._flat[start:stop] if out is None else out)
        self._next_piece += 1
        if self._next_piece == len(self.pieces):
            self._pending = None
            self._stepper.end()

    def _gather(self, start: int = 0, stop: int | None = None) -> None:
        """Copy the resident pieces that hold values in [start, stop) back into the contiguous vector."""
        stop = self.numel if stop is None else stop
        for index in [i for i in self._resident if self.pieces[i][0] < stop and self.pieces[i][1] > start]:
            first, last = self.pieces[index]
            self._flat[first:last].copy_(self._resident.pop(index))

    def _check_size(self, values: Vector) -> None:
        if values.numel() != self.numel:
            raise ValueError(f"{values.numel()} values for {self.numel} parameters")

    def _changing(self) -> None:
        """Before the values change: finish a deferred step, then let readers of the current values finish."""
        self.settle()
        for callback in self.before_change:
            callback()
