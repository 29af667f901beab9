"""--allreduce: the worker's side of its group's store, a `torch.distributed.Store` whose keys the
parameter server keeps (its Rendezvous RPC, ps.rounds.group_store) for one group generation: gloo and
NCCL build the process group on it as on a TCPStore, and only the job's members reach it; a key is its
setter's (the others read it, or add to a counter), and each member has its share of the keys.

`call` (worker.transport.client.PSClient.rendezvous, bound to the worker's id) makes one RPC; a get or wait is a
long poll the server holds for a few seconds, asked again until the store's timeout. Everything that
goes wrong (the generation replaced, a refusal, the server out of reach, the timeout) is a
CollectiveError: the worker then waits for the server's next group (worker.paths.regroup), where a server
that is really gone or has forgotten this worker shows as such."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from common.transport.messages import StoreAnswer, StoreCall
from worker.transport.client import ServerError
from worker.paths.process_group import CollectiveError

LONG_POLL_S = 10.0  # what the server holds a get or wait for at most (ps.rounds.group_store.StoreLimits)
MIN_STORE_POLL_S = 1.0
"""The least time between a get's or wait's long polls (at most the call's wait_s): a server answers
"not set yet" once wait_s has passed; one that answers at once is asked again after the rest of this,
not in a busy loop of calls until the store's timeout."""


class ServerStore(dist.Store):
    """Group `generation`'s keys at the parameter server. Keep a reference to this object while a
    process group built on it lives: torch calls back into its Python methods."""

    def __init__(self, call: Callable[[StoreCall], StoreAnswer], generation: int, timeout: timedelta) -> None:
        """`call`: one Rendezvous RPC as this worker (the server may hold it for the call's wait_s)."""
        super().__init__()
        self._call = call
        self.generation = generation
        self.set_timeout(timeout)
        self._set_sizes: dict[str, int] = {}  # the size of what this rank set, by the key's parent

    def set(self, key: str, value: str | bytes) -> None:
        data = _bytes(value)
        self._ask("set", (key,), value=data)
        self._set_sizes[_parent(key)] = len(data)

    def get(self, key: str) -> bytes:
        """`key`'s value, never empty: no rank of a group sets one (gloo's addresses, NCCL's id, the
        barrier's "1"), and gloo reads an empty address by crashing the process (a segfault), where
        a CollectiveError only ends this group."""
        value = self._until_ready("get", (key,), self.timeout).value  # type: ignore[attr-defined]  # torch's stubs omit Store.timeout
        if not value:
            raise CollectiveError(f"group generation {self.generation}'s store: the server answers {key[:80]!r} with an "
                                  "empty value, which no rank of a group sets")
        size = self._set_sizes.get(_parent(key))
        if size is not None and len(value) != size:  # gloo reads a peer's address as long as its own
            raise CollectiveError(f"group generation {self.generation}'s store: the server answers {key[:80]!r} with "
                                  f"{len(value)} bytes, where this rank set {size} under the same prefix")
        return value

    def add(self, key: str, amount: int) -> int:
        return self._ask("add", (key,), amount=amount).number

    def check(self, keys: list[str]) -> bool:
        return self._ask("check", tuple(keys)).ready

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._until_ready("wait", tuple(keys), self.timeout if timeout is None else timeout)  # type: ignore[attr-defined]

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        return self._ask("compare_set", (key,), value=_bytes(desired), expected=_bytes(expected)).value

    def delete_key(self, key: str) -> bool:
        return self._ask("delete", (key,)).ready

    def num_keys(self) -> int:
        return self._ask("num_keys", ()).number

    def _ask(self, op: str, keys: tuple[str, ...], *, value: bytes = b"", expected: bytes = b"", amount: int = 0,
             wait_s: float = 0.0) -> StoreAnswer:
        try:
            return self._call(StoreCall(self.generation, op, keys, value, expected, amount, wait_s))
        except ServerError as exc:
            raise CollectiveError(f"group generation {self.generation}'s store: {exc}") from None

    def _until_ready(self, op: str, keys: tuple[str, ...], timeout: timedelta) -> StoreAnswer:
        """Long polls until the keys are set; CollectiveError once `timeout` has passed without them."""
        deadline = time.monotonic() + timeout.total_seconds()
        while True:
            asked = time.monotonic()
            wait_s = max(0.0, min(LONG_POLL_S, deadline - asked))
            answer = self._ask(op, keys, wait_s=wait_s)
            if answer.ready:
                return answer
            if time.monotonic() >= deadline:
                shown = ", ".join(repr(k) for k in keys[:3]) + (", ..." if len(keys) > 3 else "")
                raise CollectiveError(f"group generation {self.generation}: no peer set {shown} in the group's store "
                                      f"within {timeout}")
            time.sleep(max(0.0, min(asked + min(wait_s, MIN_STORE_POLL_S), deadline) - time.monotonic()))


def _parent(key: str) -> str:
    """The key without its last part: gloo sets each rank's address under the same prefix."""
    return key.rpartition("/")[0]


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
