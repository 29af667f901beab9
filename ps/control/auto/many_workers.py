"""A test asked of every worker at once keeps what it means as the workers grow in number. Pure.

The auto policy asks whether *any* worker changed speed (change.py, at every push) and whether *any*
planned worker is late (imbalance.py, at a decision); each test's standard errors were set for the
jobs of a few workers the policy was measured on. Asked of N workers, the chance that noise alone
passes one of them grows about N times: at 10,000 simulated workers the push test took a few workers
for changed speed at most decisions (each change a step that moved thousands of batches), and at
1,024 the plan in force was measured far out of balance by the noisiest worker alone. `family_sds`
raises a test's bar among more than REFERENCE_WORKERS workers so that the chance of any false alarm
stays that of a job of REFERENCE_WORKERS (Šidák's correction for a family of independent tests);
below that the test is as written."""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

REFERENCE_WORKERS = 8
"""The job size the tests' standard errors were set for."""
_NORMAL = NormalDist()


@lru_cache(maxsize=256)
def family_sds(sds: float, workers: int) -> float:
    """The standard errors each of `workers` workers' test must be off by so that noise alone passes
    it for any of them as seldom as `sds` does for any of REFERENCE_WORKERS (`sds` itself for as many
    or fewer). Normal noise: P(any of n) = 1 - (1 - p)^n, kept equal to the reference job's."""
    if workers <= REFERENCE_WORKERS:
        return sds
    miss = math.log1p(-_NORMAL.cdf(-sds)) * REFERENCE_WORKERS / workers
    return -_NORMAL.inv_cdf(-math.expm1(miss))
