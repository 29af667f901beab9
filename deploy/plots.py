"""Plots of a run's metrics log, after OmniLearn's Fig. 8 (batch sizes) and Fig. 11 (compute times).

Every function takes parsed events (``ps.ops.metrics.read_metrics``: dicts with an ``event`` key) and
returns a matplotlib :class:`~matplotlib.figure.Figure`, saved as PNG when a path is given. They use
the object API with the Agg canvas, never pyplot, so they work headless and in threads, and leave
no global state behind. Phases (``phases.jsonl`` of ``ps-cluster run``: ``{"event": "phase",
"phase", "profile", "shares", "epoch" or "elapsed_s", "time"}``) shade the per-epoch plots.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

Events = Sequence[Mapping[str, Any]]

FIGSIZE = (8.0, 4.5)
DPI = 120
PHASE_COLORS = ("#dbe9f6", "#fde7cf")
"""Alternating background colours of schedule phases."""


def _figure() -> tuple[Figure, Any]:
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _save(fig: Figure, path: str | Path | None) -> Figure:
    if path is not None:
        fig.savefig(path)
    return fig


def _of(events: Events, kind: str) -> list[Mapping[str, Any]]:
    return [e for e in events if e.get("event") == kind]


def worker_names(events: Events) -> list[str]:
    """Workers in the order they first appear in the log, sorted by name when names sort naturally.
    Only the maps by worker count: a `probe` record's compute_ms is one worker's number."""
    seen: dict[str, None] = {}
    for event in events:
        for key in ("batch_sizes", "compute_ms"):
            value = event.get(key)
            if isinstance(value, Mapping):
                seen.update(dict.fromkeys(value))
    return sorted(seen, key=_natural)


def _natural(name: str) -> tuple[Any, ...]:
    """Sort key that puts w2 before w10."""
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return (head, int(tail) if tail else -1, name)


def _label(name: str, labels: Mapping[str, str] | None) -> str:
    return labels.get(name, name) if labels else name


def epoch_series(events: Events, key: str) -> dict[str, tuple[list[int], list[float]]]:
    """Per worker, ``(epochs, values)`` of an ``epoch`` event field (``batch_sizes`` or ``compute_ms``)."""
    series: dict[str, tuple[list[int], list[float]]] = {name: ([], []) for name in worker_names(events)}
    for event in _of(events, "epoch"):
        for name, value in (event.get(key) or {}).items():
            if value is not None:
                series.setdefault(name, ([], []))
                series[name][0].append(int(event["epoch"]))
                series[name][1].append(float(value))
    return {name: s for name, s in series.items() if s[0]}


def _per_worker_plot(
    events: Events, key: str, ylabel: str, title: str, labels: Mapping[str, str] | None
) -> tuple[Figure, Any]:
    fig, ax = _figure()
    series = epoch_series(events, key)
    for name, (epochs, values) in series.items():
        ax.plot(epochs, values, marker="o", markersize=4, linewidth=1.6, label=_label(name, labels))
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    epochs = sorted({e for s in series.values() for e in s[0]})
    if epochs:
        ax.set_xlim(min(epochs) - 0.5, max(epochs) + 0.5)
        if len(epochs) <= 20:
            ax.set_xticks(epochs)
    ax.set_ylim(bottom=0)
    return fig, ax


def _legend(ax: Any, count: int) -> None:
    if count:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small", frameon=False)


def plot_batch_sizes(
    events: Events, path: str | Path | None = None, *, phases: Sequence[Mapping[str, Any]] = (),
    labels: Mapping[str, str] | None = None, title: str = "Batch size per worker",
) -> Figure:
    """Batch size of each worker in each epoch (the plan at the epoch's end), like OmniLearn Fig. 8."""
    fig, ax = _per_worker_plot(events, "batch_sizes", "local batch size (samples)", title, labels)
    _legend(ax, len(ax.lines))
    _shade_phases(ax, events, phases)
    return _save(fig, path)


def phase_spans(events: Events, phases: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, str]]:
    """``(start, end, label)`` of each phase on the epoch axis of the per-epoch plots.

    Epoch ``e`` is plotted at ``x = e``; a phase that starts after ``b`` completed epochs covers
    ``(b + 0.5, ...)``. Phases timed in seconds are placed by interpolating their ``time`` between
    the epochs' end times (epoch 0 ends when the job starts, at the first ``adjust`` event).
    """
    epochs = _of(events, "epoch")
    last = max((int(e["epoch"]) for e in epochs), default=0)
    starts: list[tuple[float, str]] = []
    anchors = _time_anchors(events)
    for phase in sorted(phases, key=lambda p: int(p.get("phase", 0))):
        label = str(phase.get("profile", phase.get("phase", ""))).upper()
        if phase.get("epoch") is not None:
            start = float(phase["epoch"])
        elif phase.get("time") is not None and anchors:
            start = _interpolate(anchors, float(phase["time"]))
        else:
            continue
        starts.append((start + 0.5, label))
    spans = []
    for k, (start, label) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else last + 0.5
        if end > start:
            spans.append((start, end, label))
    return spans


def _time_anchors(events: Events) -> list[tuple[float, float]]:
    """``(unix time, completed epochs)`` pairs: the job start, then every epoch end."""
    anchors: list[tuple[float, float]] = []
    adjusts = _of(events, "adjust")
    if adjusts:
        anchors.append((float(adjusts[0]["time"]), 0.0))
    anchors += [(float(e["time"]), float(e["epoch"])) for e in _of(events, "epoch")]
    return sorted(anchors)


def _interpolate(anchors: list[tuple[float, float]], t: float) -> float:
    times = [a[0] for a in anchors]
    k = bisect.bisect_right(times, t)
    if k == 0:
        return anchors[0][1]
    if k == len(anchors):
        return anchors[-1][1]
    (t0, e0), (t1, e1) = anchors[k - 1], anchors[k]
    return e0 + (e1 - e0) * (t - t0) / (t1 - t0) if t1 > t0 else e1


def plot_compute_times(
    events: Events, path: str | Path | None = None, *, phases: Sequence[Mapping[str, Any]] = (),
    labels: Mapping[str, str] | None = None, title: str = "Compute time per worker",
) -> Figure:
    """Mean compute time per step of each worker in each epoch, with schedule phases shaded (Fig. 11).
    Under --balance busy or cycle the times are those (the workers' busy times, or the cycles the
    server timed), and the axis and title say so."""
    what = next((e["balance"] for e in _of(events, "summary") if e.get("balance") in ("busy", "cycle")), "compute")
    if what != "compute":
        title = title.replace("Compute time", f"{what.capitalize()} time")
    fig, ax = _per_worker_plot(events, "compute_ms", f"{what} time per step (ms)", title, labels)
    _legend(ax, len(ax.lines))
    _shade_phases(ax, events, phases)
    return _save(fig, path)


def _shade_phases(ax: Any, events: Events, phases: Sequence[Mapping[str, Any]]) -> None:
    """Shade each phase's epochs in alternating colours, its profile's name at the top."""
    spans = phase_spans(events, phases)
    for k, (start, end, label) in enumerate(spans):
        ax.axvspan(start, end, color=PHASE_COLORS[k % len(PHASE_COLORS)], zorder=0, linewidth=0)
        ax.text(
            (start + end) / 2, 0.98, label, transform=ax.get_xaxis_transform(), ha="center", va="top",
            fontsize="small", color="#333333",
        )
    if spans:
        ax.set_ylim(top=ax.get_ylim()[1] * 1.08)


def _eval_walls(events: Events) -> list[tuple[Mapping[str, Any], float]]:
    """Each `eval` record with its wall time on one axis: a log that a `--resume` appended to holds a
    second run whose `wall_s` starts again at 0, placed after the last time the run before it logged."""
    out: list[tuple[Mapping[str, Any], float]] = []
    offset = last = 0.0
    for event in events:
        if event.get("event") == "resume":
            offset = last
        elif event.get("wall_s") is not None and event.get("event") in ("epoch", "eval", "summary"):
            last = max(last, offset + float(event["wall_s"]))
            if event.get("event") == "eval":
                out.append((event, offset + float(event["wall_s"])))
    return out


def plot_accuracy(
    runs: Events | Mapping[str, Events], path: str | Path | None = None, *, title: str = "Test accuracy",
) -> Figure:
    """Test accuracy vs training wall time: one run's events, or several runs as ``{label: events}``."""
    fig, ax = _figure()
    named = dict(runs) if isinstance(runs, Mapping) else {"": runs}
    for label, events in named.items():
        timed = sorted(_eval_walls(events), key=lambda pair: pair[1])
        if not timed:
            continue
        evals = [e for e, _ in timed]
        xs = [x for _, x in timed]
        ys = [100.0 * float(e["accuracy"]) for e in evals]
        ax.plot(xs, ys, marker="o", markersize=4, linewidth=1.6, label=label or None)
        if len(named) == 1:
            for e, x, y in zip(evals, xs, ys, strict=True):
                ax.annotate(str(e["epoch"]), (x, y), textcoords="offset points", xytext=(0, 6),
                            ha="center", fontsize="x-small", color="#555555")
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title + (" (labels: epoch)" if len(named) == 1 else ""))
    ax.set_ylim(0, 105)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    if len(named) > 1:
        _legend(ax, len(ax.lines))
    return _save(fig, path)


ASP_PANELS = (
    ("updates", "updates"),
    ("staleness_mean", "staleness (versions): mean"),
    ("staleness_max", "staleness (versions): max"),
    ("ssp_wait_s", "SSP wait (s)"),
)
"""The panels of the ASP plot: an `epoch` record field per worker, and its axis label."""


def plot_asp_updates(
    events: Events, path: str | Path | None = None, *, labels: Mapping[str, str] | None = None,
    title: str = "ASP updates per worker",
) -> Figure:
    """Per worker and epoch (ASP): updates applied, their mean and largest staleness in versions, and
    the time --staleness-bound held its replies."""
    fig = Figure(figsize=(FIGSIZE[0], FIGSIZE[1] * 1.6), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2, sharex=True).flat
    for ax, (key, ylabel) in zip(axes, ASP_PANELS, strict=True):
        series = epoch_series(events, key)
        for name, (epochs, values) in series.items():
            ax.plot(epochs, values, marker="o", markersize=3, linewidth=1.4, label=_label(name, labels))
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    for ax in fig.axes[2:]:
        ax.set_xlabel("epoch")
    handles, names = fig.axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="outside right upper", fontsize="small", frameon=False)
    fig.suptitle(title)
    return _save(fig, path)


ADAPTIVE_PANELS = (
    ("batch", "global batch B, noise scale φ"),
    ("efficiency", "statistical efficiency (φ+B₀)/(φ+B)"),
    ("lr", "learning rate"),
    ("accuracy", "test accuracy (%)"),
)
"""The panels of the --adaptive-batch plot, against the server's elapsed time."""


def plot_adaptive_batch(events: Events, path: str | Path | None = None, *, title: str = "Adaptive global batch") -> Figure:
    """--adaptive-batch: B (a step at each change) and φ at every decision, the efficiency of B, the
    learning rate, and the test accuracy, over the server's elapsed time (s)."""
    fig = Figure(figsize=(FIGSIZE[0], FIGSIZE[1] * 1.6), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(2, 2, sharex=True).flat)
    decisions = sorted(_of(events, "adapt"), key=lambda e: float(e["elapsed_s"]))
    xs = [float(e["elapsed_s"]) for e in decisions]
    axes[0].step(xs, [e["global_batch"] for e in decisions], where="post", marker="o", markersize=3, label="B")
    known = [(x, e["phi"]) for x, e in zip(xs, decisions, strict=True) if e.get("phi") is not None]
    axes[0].plot([x for x, _ in known], [p for _, p in known], marker="x", linewidth=1.2, label="φ")
    axes[0].set_yscale("log")
    axes[0].legend(fontsize="small", frameon=False)
    for ax, key in ((axes[1], "efficiency"), (axes[2], "lr")):
        pts = [(x, e[key]) for x, e in zip(xs, decisions, strict=True) if e.get(key) is not None]
        ax.step([x for x, _ in pts], [v for _, v in pts], where="post", marker="o", markersize=3)
    evals = sorted(_of(events, "eval"), key=lambda e: float(e["elapsed_s"]))
    axes[3].plot([float(e["elapsed_s"]) for e in evals], [100.0 * float(e["accuracy"]) for e in evals], marker="o", markersize=3)
    for ax, (_, ylabel) in zip(axes, ADAPTIVE_PANELS, strict=True):
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    for ax in axes[2:]:
        ax.set_xlabel("elapsed time (s)")
    fig.suptitle(title)
    return _save(fig, path)


def plot_global_batch(runs: Mapping[str, Sequence[tuple[float, int]]], path: str | Path | None = None, *,
                      title: str = "Global batch over time") -> Figure:
    """Several --adaptive-batch runs' global batch B against time (s), as ``{label: [(seconds, B), ...]}``:
    a step at each decision."""
    fig, ax = _figure()
    for label, points in runs.items():
        if points:
            ax.step([x for x, _ in points], [b for _, b in points], where="post", marker="o", markersize=3,
                    linewidth=1.4, label=label)
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("global batch B")
    ax.set_yscale("log", base=2)
    ax.set_title(title)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    if ax.lines:
        _legend(ax, len(ax.lines))
    return _save(fig, path)


def write_plots(
    events: Events, out_dir: str | Path, *, phases: Sequence[Mapping[str, Any]] = (),
    labels: Mapping[str, str] | None = None, title: str | None = None,
) -> list[Path]:
    """Write ``batch_sizes.png``, ``compute_times.png`` and ``accuracy.png`` to ``out_dir``,
    ``asp.png`` for an ASP run (its epochs record staleness) and ``adaptive_batch.png`` for an
    --adaptive-batch run; their paths."""
    out = Path(out_dir)
    suffix = f" ({title})" if title else ""
    paths = [out / "batch_sizes.png", out / "compute_times.png", out / "accuracy.png"]
    plot_batch_sizes(events, paths[0], phases=phases, labels=labels, title="Batch size per worker" + suffix)
    plot_compute_times(events, paths[1], phases=phases, labels=labels, title="Compute time per worker" + suffix)
    plot_accuracy(events, paths[2], title="Test accuracy" + suffix)
    if epoch_series(events, "staleness_max"):
        paths.append(out / "asp.png")
        plot_asp_updates(events, paths[-1], labels=labels, title="ASP updates per worker" + suffix)
    if _of(events, "adapt"):
        paths.append(out / "adaptive_batch.png")
        plot_adaptive_batch(events, paths[-1], title="Adaptive global batch" + suffix)
    return paths
