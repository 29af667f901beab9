"""Parameters back in forward order: the next forward starts while the reply still streams.

The server's reply carries the flat parameters in the layout's order, which is the order the model
registers its modules in, first layers first, and it steps and frames them a chunk at a time
(common.params.store). The model's parameters are views of the flat vector the reply is decoded into
(common.transport.layout.load_flat), so a value is in the model as soon as its chunk is decoded. Here:

- `Arrivals` says how far a streamed reply has come: per server (the coordinator's range, and each
  shard's with --shards) the prefix of its range already decoded, or the error that ended it.
- `ForwardOrder` puts a pre-forward hook on every module that holds parameters of its own: the hook
  waits until those parameters' values are in, so the first layers compute while the last ones
  still arrive. A module that never runs in forward (or a parameter whose gradient is None) waits
  for nothing: the whole reply is waited for only at the next step() (`Arrivals.wait_all`).

A parameter read outside its own module's forward (a parent module's forward that uses a child's
weight directly, a frozen parameter) would be read before its hook ran. The first step's forward runs
on parameters already complete (the pull at Join), and every step() compares the parameters that
got a gradient with the modules whose forward ran: a parameter read elsewhere is from then on
waited for before the model's forward begins (a warning names the ones found only after a
streamed step: that step's forward may have read the previous step's values of them). Parameters
that do not require a gradient are always waited for before the forward begins.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from torch import nn

log = logging.getLogger(__name__)


class Arrivals:
    """How far the streamed reply of one step has come, per server range (a "lane")."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._lanes: list[list[int]] = []  # [start, stop, values in]
        self._open = 0  # lanes still receiving
        self._error: BaseException | None = None
        self.complete = True  # no reply streaming: every value is in (read without the lock: a hint)
        self.waited_s = 0.0  # time forwards waited for values since the last take_waited_ms

    def begin(self, ranges: list[tuple[int, int]]) -> list[int]:
        """A reply starts streaming values into these ranges of the flat vector; the lanes' numbers."""
        with self._cond:
            if self._open:
                raise RuntimeError("a reply is already streaming: wait_all() first")
            self._lanes = [[start, stop, 0] for start, stop in ranges]
            self._open, self._error = len(ranges), None
            self.complete = not ranges
            return list(range(len(ranges)))

    def advance(self, lane: int, filled: int) -> None:
        """Values [0, filled) of `lane`'s range are in."""
        with self._cond:
            self._lanes[lane][2] = filled
            self._cond.notify_all()

    def end(self, lane: int, error: BaseException | None = None) -> None:
        """`lane`'s reply is over: all its values are in, or `error` ended it (the first error is kept)."""
        with self._cond:
            if error is not None and self._error is None:
                self._error = error
            self._open -= 1
            if self._open == 0:
                self.complete = True
            self._cond.notify_all()

    def _has(self, start: int, stop: int) -> bool:
        for first, last, filled in self._lanes:
            lo, hi = max(start, first), min(stop, last)
            if lo < hi and first + filled < hi:
                return False
        return True

    def wait(self, start: int, stop: int) -> None:
        """Block until values [start, stop) are in, or the reply failed (the step then drops its
        gradient: `wait_all` raises). The time waited counts towards `waited_s`."""
        if self.complete:
            return
        with self._cond:
            if self._error is not None or self._has(start, stop):
                return
            began = time.perf_counter()
            self._cond.wait_for(lambda: self._error is not None or self._open == 0 or self._has(start, stop))
            self.waited_s += time.perf_counter() - began

    def wait_over(self) -> None:
        """Block until the reply is over (its error, if any, is kept for `wait_all`)."""
        with self._cond:
            if self._open:
                began = time.perf_counter()
                self._cond.wait_for(lambda: self._open == 0)
                self.waited_s += time.perf_counter() - began

    def wait_all(self) -> None:
        """Block until the reply is over; its error (a ServerError, or the decoder's) if it failed."""
        self.wait_over()
        with self._cond:
            error, self._error = self._error, None
            self._lanes = []
        if error is not None:
            raise error

    def take_waited_ms(self) -> float:
        """Milliseconds waited for values since the last call."""
        with self._cond:
            waited, self.waited_s = self.waited_s, 0.0
        return waited * 1000.0


class ForwardOrder:
    """Pre-forward hooks that hold each module until its own parameters' values are in (`arrivals`)."""

    def __init__(self, model: nn.Module, arrivals: Arrivals) -> None:
        self._arrivals = arrivals
        self._params = list(model.parameters())  # the flat layout's order
        index = {id(p): i for i, p in enumerate(self._params)}
        self._ranges: list[tuple[int, int]] = []
        offset = 0
        for p in self._params:
            self._ranges.append((offset, offset + p.numel()))
            offset += p.numel()
        self._holders: list[set[int]] = [set() for _ in self._params]  # the modules holding each parameter
        self._ran: set[int] = set()  # modules whose forward ran since the last check
        self.eager = {i for i, p in enumerate(self._params) if not p.requires_grad}  # waited for at the model's forward
        self.warned: set[int] = set()
        self._handles = [model.register_forward_pre_hook(self._before_model)]
        for number, module in enumerate(model.modules()):
            own = [index[id(p)] for p in module.parameters(recurse=False)]
            for i in own:
                self._holders[i].add(number)
            if own:
                self._handles.append(module.register_forward_pre_hook(self._hook(number, own)))
        self._handles.append(model.register_state_dict_pre_hook(lambda *_: arrivals.wait_over()))

    def _hook(self, number: int, own: list[int]) -> Callable[[nn.Module, Any], None]:
        ranges = self._ranges

        def before(module: nn.Module, args: Any) -> None:
            self._ran.add(number)
            for i in own:
                self._arrivals.wait(*ranges[i])

        return before

    def _before_model(self, module: nn.Module, args: Any) -> None:
        for i in self.eager:
            self._arrivals.wait(*self._ranges[i])

    def check_step(self, streamed: bool) -> None:
        """After backward: a parameter that got a gradient though no module holding it ran its forward
        is read elsewhere; wait for it before the model's forward from now on (`streamed`: this step's
        forward ran while a reply streamed, so it may have read old values: warn)."""
        late = [i for i, p in enumerate(self._params)
                if p.grad is not None and i not in self.eager and not (self._holders[i] & self._ran)]
        self._ran.clear()
        if not late:
            return
        self.eager.update(late)
        if streamed:
            self.warned.update(late)
            log.warning("parameters %s are read outside their own modules' forward; from now on they are waited for "
                        "before the model's forward (this step may have used their previous values)",
                        [self._ranges[i] for i in late])

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

