"""The report's environment record and the markdown table printed after the JSON."""

from __future__ import annotations

import os
import platform
from typing import Any

from benchmarks import analysis
from benchmarks.hetero.settings import Emulation, Settings


def environment(s: Settings, emu: Emulation) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "limiter": emu.limiting,
        "cpu_budget": round(s.cpu_budget, 4),
        "shares": {n: round(x, 4) for n, x in zip(emu.names, emu.shares)},
        "server_share": None if emu.server_share is None else round(emu.server_share, 4),
        "period_us": emu.period_us,
        "slowdowns": {n: round(f, 4) for n, f in zip(emu.names, emu.slowdowns)} if emu.backend is None else None,
        "torch": version("torch"),  # not imported here: this process only drives the others
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0)),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "threads_per_worker": 1,
    }


def render_table(report: dict) -> str:
    """The short markdown summary printed after the JSON."""
    runs = report.get("runs", {})
    parts = []
    if report.get("ideal") or report.get("ddp_uniform"):
        ideal = report.get("ideal") or {}
        base = [["ideal (solo sum)", ideal.get("samples_per_s")],
                ["ideal, solos all at once (sum)", (ideal.get("together") or {}).get("samples_per_s")],
                ["ddp_uniform", (report.get("ddp_uniform") or {}).get("samples_per_s")],
                ["ddp_split (per-rank batches = dynamic's final plan)",
                 (report.get("ddp_split") or {}).get("samples_per_s")]]
        if report.get("ddp_fast_split"):
            base.append(["ddp_fast_split (per-rank batches = dynamic_allreduce's final plan)",
                         report["ddp_fast_split"].get("samples_per_s")])
        parts.append(analysis.markdown_table(["baseline", "samples/s"], base))
    if report["kind"] == "tta":
        rows = [[n, r.get("time_to_accuracy_s"), r.get("epochs_to_accuracy"), r.get("best_accuracy"), r.get("samples_per_s")]
                for n, r in runs.items()]
        parts.append(analysis.markdown_table(["controller", "time to target (s)", "epochs", "best acc", "samples/s"], rows))
    elif report["kind"] == "schedule":
        for n, r in runs.items():
            rows = [[f"{c['from_profile']}->{c['profile']}", c["after_epoch"], c["adjustments_to_steady"],
                     c["plan_changes_to_steady"], c["steady_epoch"]] for c in r.get("phase_changes", [])]
            parts.append(f"{n}: {r.get('samples_per_s_overall')} samples/s overall, accuracy {r.get('accuracy')}\n\n"
                         + analysis.markdown_table(["phase change", "after epoch", "adjustments", "plan changes",
                                                    "steady epoch"], rows))
    else:
        header = ["controller", "samples/s", "overall", "vs ideal", "vs ideal (all at once)", "vs DDP", "vs DDP split",
                  "exposed ms", "spread", "adj to steady", "accuracy"]
        if report["mode"] == "asp":
            header.append("update skew")
        header.append("batches")
        rows = []
        for n, r in runs.items():
            row = [n, r.get("samples_per_s"), r.get("samples_per_s_overall"), r.get("ratio_to_ideal"),
                   r.get("ratio_to_ideal_together"), r.get("ratio_to_ddp_uniform"), r.get("ratio_to_ddp_split"),
                   r.get("exposed_ms_mean"), r.get("compute_spread"), r.get("adjustments_to_steady"), r.get("accuracy")]
            if report["mode"] == "asp":
                row.append(r.get("update_skew"))
            row.append(r.get("batch_sizes"))
            rows.append(row)
        parts.append(analysis.markdown_table(header, rows))
        if report.get("compose_vs_emulator"):
            parts.append("in containers vs on the cgroup emulator, steady samples/s: " + ", ".join(
                f"{name} {ratio}" for name, ratio in report["compose_vs_emulator"].items()))
    targets = report.get("targets", [])
    if targets:
        rows = [[t["name"], t["value"], f"{t['op']} {t['threshold']}",
                 "PASS" if t["pass"] else "FAIL" if t["pass"] is False else "n/a"] for t in targets]
        parts.append(analysis.markdown_table(["target", "value", "needs", "result"], rows))
    env = report["environment"]
    parts.append(f"limiter {env['limiter']}, cpu budget {env['cpu_budget']}, period {env['period_us']} us, "
                 f"load average at start {env['loadavg_start']}, torch {env['torch']}")
    return "\n\n".join(parts)
