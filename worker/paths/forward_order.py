"""Parameters back in forward order: the next forward starts while the reply still streams.

The server's reply carries the flat parameters in the layout's order, which is the order the model
registers its modules in, first layers first, and it steps and frames them a chunk at a time
(common.params.store). The model's parameters are views of the flat vector the reply is decoded into
(common.transport.layout.load_flat), so a value is in the model as soon as its chunk is decoded. Here:

- `Arrivals` (worker.transport.arrivals) says how far a streamed reply has come: per server range the
  prefix already decoded, or the error that ended it.
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
from collections.abc import Callable
from typing import Any

from torch import nn

from worker.transport.arrivals import Arrivals

log = logging.getLogger(__name__)


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

