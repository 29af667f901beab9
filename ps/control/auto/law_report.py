"""Each worker's law as an auto decision reports it (its `adjust` record's `fits`). Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ps.control.model.time_fit import SLOPE_SDS, Finish, slope_measured


def reported_laws(finishes: Mapping[str, Finish], identified: Callable[[str], bool]) -> dict[str, dict[str, Any]]:
    """Each law as a decision reports it: q, s, whether it is known (`identified`) and whether q is
    measured (time_fit.slope_measured), its test taken over every law at once (numpy's sqrt is
    math.sqrt's, correctly rounded; a negative variance, which math.sqrt refuses, is left to it)."""
    lines = [f.line for f in finishes.values()]
    q, s = [line.q for line in lines], [line.s for line in lines]
    var_q = np.array([line.var_q for line in lines], dtype=np.float64)
    if (var_q >= 0).all():
        measured = (np.array(q, dtype=np.float64) > SLOPE_SDS * np.sqrt(var_q)).tolist()
    else:
        measured = [slope_measured(line) for line in lines]
    return {k: {"q": round(qk, 6), "s": round(sk, 4), "law": identified(k), "slope_measured": m}
            for k, qk, sk, m in zip(finishes, q, s, measured, strict=True)}
