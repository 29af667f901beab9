"""The benchmark's pictures, from its report: per seed, every arm's test accuracy against its seconds
of training in one plot (`accuracy-seed<N>.png`), and the adaptive arm's global batch over time, one
line a seed (`global_batch.png`); written to ``--out`` (deploy/plots.py draws them)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_plots(report: Mapping[str, Any], out: Path) -> list[Path]:
    """The plots of `report` (benchmarks.tta's) in `out`; their paths."""
    from deploy import plots  # matplotlib is slow to import; only needed here

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    arms: Mapping[str, Mapping[str, Any]] = report.get("arms") or {}
    seeds = sorted({seed for arm in arms.values() for seed in (arm.get("seeds") or {})}, key=int)
    for seed in seeds:
        runs = {name: [{"event": "eval", "wall_s": p["seconds"], "accuracy": p["accuracy"], "epoch": p["epoch"]}
                       for p in arm["seeds"][seed].get("curve") or []]
                for name, arm in arms.items() if seed in (arm.get("seeds") or {})}
        paths.append(out / f"accuracy-seed{seed}.png")
        plots.plot_accuracy(runs, paths[-1], title=f"Test accuracy, every arm (seed {seed})")
    adaptive = {f"{name}, seed {seed}": [(float(p["seconds"]), int(p["global_batch"])) for p in run["global_batch_curve"]]
                for name, arm in arms.items() for seed, run in (arm.get("seeds") or {}).items()
                if run.get("global_batch_curve")}
    if adaptive:
        paths.append(out / "global_batch.png")
        plots.plot_global_batch(adaptive, paths[-1], title="The adaptive arm's global batch")
    return paths
