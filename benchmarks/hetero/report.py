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
        parts += [_schedule_table(name, r, report) for name, r in runs.items()]
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
                 ("PASS" if t["pass"] else "FAIL" if t["pass"] is False else "n/a")
                 + (f" ({t['note']})" if t.get("note") else "")] for t in targets]
        parts.append(analysis.markdown_table(["target", "value", "needs", "result"], rows))
    env = report["environment"]
    parts.append(f"limiter {env['limiter']}, cpu budget {env['cpu_budget']}, period {env['period_us']} us, "
                 f"load average at start {env['loadavg_start']}, torch {env['torch']}")
    return "\n\n".join(parts)


def _schedule_table(name: str, run: dict[str, Any], report: dict[str, Any]) -> str:
    """One run through a schedule: per phase its samples/s (and DDP's), the re-balance after its change."""
    ddp = report.get("ddp") or {}
    asp = report["mode"] == "asp"
    header = ["phase", "profile", "samples/s", *(["DDP equal", "DDP tuned once", "DDP re-tuned"] if ddp else []),
              "s to re-balance", "window s", "plan changes to re-balance", "plan changes in phase", "accuracy at end",
              *(["update skew"] if asp else [])]
    rows = []
    for p in run.get("phases", []):
        row = [p["phase"], p["profile"], p["samples_per_s"]]
        if ddp:
            row += [ddp[b]["phases"][p["phase"]]["samples_per_s"] for b in ("ddp_equal", "ddp_tuned_once", "ddp_retuned")]
        row += [p["rebalance_s"], p["window_s"], p["plan_changes_to_rebalance"], p["plan_changes"], p["accuracy_at_end"]]
        if asp:
            row.append(p.get("update_skew"))
        rows.append(row)
    whole = run.get("over_schedule") or {}
    total = ["all", "", whole.get("samples_per_s")]
    if ddp:
        total += [ddp[b]["samples_per_s"] for b in ("ddp_equal", "ddp_tuned_once", "ddp_retuned")]
    total += [whole.get("max_rebalance_s"), "", whole.get("max_plan_changes_to_rebalance"), "", run.get("accuracy")]
    if asp:
        total.append("")
    rows.append(total)
    ratios = whole.get("ratio_to")
    line = f"{name}: samples/s over the schedule {whole.get('samples_per_s')}"
    if ratios:
        line += ", over DDP " + ", ".join(f"{k.removeprefix('ddp_')} {v}" for k, v in ratios.items())
    return line + " (the 'all' row: the worst change's re-balance)\n\n" + analysis.markdown_table(header, rows)
