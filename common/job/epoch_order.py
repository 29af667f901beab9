"""The order of an epoch's samples: one permutation π_e of the N training indices per epoch, a pure
function of (seed, epoch, N) that the server and every worker compute alike. The server hands out
ranges of it (ps.rounds.epoch_slices); a worker turns a range into the indices it trains on.

numpy's PCG64 seeded from SeedSequence([seed, epoch]) is used because its stream is fixed across
numpy versions and platforms, so processes on different machines agree on every epoch's order."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import numpy as np
import torch

from common.transport.messages import SliceRange


@functools.lru_cache(maxsize=4)  # the open epoch and the next (a slice may wrap into it), on both sides
def _permutation(seed: int, epoch: int, num_samples: int) -> torch.Tensor:
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
    return torch.from_numpy(rng.permutation(num_samples).astype(np.int64))


def epoch_permutation(seed: int, epoch: int, num_samples: int) -> torch.Tensor:
    """π_epoch: the N = `num_samples` training indices in the order of `epoch` (read-only: shared)."""
    if num_samples < 1 or seed < 0 or epoch < 0:
        raise ValueError(f"need num_samples >= 1, seed >= 0 and epoch >= 0, got {num_samples}, {seed}, {epoch}")
    return _permutation(int(seed), int(epoch), int(num_samples))


def slice_indices(seed: int, num_samples: int, ranges: Iterable[SliceRange]) -> torch.Tensor:
    """The dataset indices of `ranges`, in order (a step's batch)."""
    parts = [epoch_permutation(seed, r.epoch, num_samples)[r.offset : r.stop] for r in ranges]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
