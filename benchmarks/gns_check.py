"""The GNS estimator (ps.control.global_batch.gns) against brute force, on one process.

``python -m benchmarks.gns_check`` trains the workload as a BSP job would with a heterogeneous split
(default: B = 256 split 6/6/4/32, HL8's core shares): every step, each simulated worker computes the
mean gradient g_k over its b_k samples, the step applies g = Σ (b_k/B) g_k, and the estimator is fed
|g_k|² and |g|², as the server will be (the "online" estimate, smoothed over steps). At a few epochs
it computes the truth: the per-sample gradient of every training sample (torch.func), G their mean
and tr(Σ) their variance, so B_noise = tr(Σ)/|G|² of sampling from the training set. It also
freezes the model there and feeds a fresh estimator R rounds of fresh batches, once with the
heterogeneous split and once with equal batches: the estimator's own bias and spread, without the
lag of smoothing. Prints JSON and a table; the target is the online estimate within 25% of the truth.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.cli_types import ints
from benchmarks.report_output import add_result_options, save_result
from benchmarks.workload import add_child_workload_arguments, build, tune_like_a_worker


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gns_check",
        description="Compare the N-worker GNS estimate from a heterogeneous split with the brute-force noise scale.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_child_workload_arguments(p)
    p.set_defaults(model="mlp", dataset="teacher", lr=0.1)
    p.add_argument("--global-batch", type=int, default=256, help="B, split across the simulated workers")
    p.add_argument("--shares", type=ints, default=[6, 6, 4, 32], help="the workers' shares of B (HL8: 6,6,4,32)")
    p.add_argument("--points", type=epochs, default=[1, 2, 5, 10, 20],
                   help="epochs after which to compare; a fraction is a part of an epoch (0.25: a quarter of its "
                        "steps), for the first steps, where the noise scale moves fastest")
    p.add_argument("--smoothing", type=float, default=0.98, help="the online estimator's EWMA smoothing")
    p.add_argument("--frozen-rounds", type=int, default=200, help="rounds fed to the frozen-model estimates")
    p.add_argument("--tolerance", type=float, default=0.25, help="target: |online/true - 1| <= this")
    p.add_argument("--json", action="store_true", help="print the JSON report before the table")
    add_result_options(p)
    return p


class Trainer:
    """The model, its data and SGD, stepping with batch-weighted per-worker gradients."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.model, self.data = build(args)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.SGD(self.params, lr=args.lr, momentum=args.momentum)
        self.rng = torch.Generator().manual_seed(args.seed)

    def worker_gradients(self, idx: Any, batches: Sequence[int]) -> list[Any]:
        """Each worker's mean gradient (flat, float64) over its slice of the indices `idx`."""
        import torch
        import torch.nn.functional as F

        grads, start = [], 0
        for b in batches:
            part = idx[start:start + b]
            start += b
            self.model.zero_grad(set_to_none=False)
            F.cross_entropy(self.model(self.data.train_x[part]), self.data.train_y[part]).backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in self.params]).double())
        return grads

    def draw(self, total: int) -> Any:
        """`total` training indices without replacement, as an epoch's batch takes them."""
        import torch

        return torch.randperm(len(self.data.train_x), generator=self.rng)[:total]

    def step(self, grad: Any) -> None:
        """SGD step with the flat gradient `grad`."""
        offset = 0
        for p in self.params:
            p.grad.copy_(grad[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.optimizer.step()

    def full_signal(self, chunk: int = 4096) -> float:
        """|G|², G the mean gradient over every training sample (one chunked pass, no per-sample work)."""
        import torch
        import torch.nn.functional as F

        x_all, y_all = self.data.train_x, self.data.train_y
        self.model.zero_grad(set_to_none=False)
        for start in range(0, len(x_all), chunk):
            loss = F.cross_entropy(self.model(x_all[start:start + chunk]), y_all[start:start + chunk], reduction="sum")
            loss.backward()
        mean = torch.cat([p.grad.reshape(-1) for p in self.params]).double() / len(x_all)
        return float(mean @ mean)

    def true_noise_scale(self, chunk: int = 128) -> dict[str, float]:
        """|G|², tr(Σ) and B_noise over every training sample's own gradient (torch.func.vmap)."""
        import torch
        import torch.nn.functional as F
        from torch.func import functional_call, grad, vmap

        weights = {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}

        def loss(params: dict, x: Any, y: Any) -> Any:
            return F.cross_entropy(functional_call(self.model, params, (x.unsqueeze(0),)), y.unsqueeze(0))

        per_sample = vmap(grad(loss), in_dims=(None, 0, 0))
        x_all, y_all = self.data.train_x, self.data.train_y
        totals = {n: torch.zeros(w.shape, dtype=torch.float64) for n, w in weights.items()}
        squares = 0.0
        for start in range(0, len(x_all), chunk):
            grads = per_sample(weights, x_all[start:start + chunk], y_all[start:start + chunk])
            for name, g in grads.items():
                totals[name] += g.sum(0, dtype=torch.float64)
                squares += float((g * g).sum(dtype=torch.float64))
        signal = sum(float((t * t).sum()) for t in totals.values()) / len(x_all) ** 2
        noise = squares / len(x_all) - signal
        return {"signal": signal, "noise": noise, "b_noise": noise / signal}


def round_norms(grads: Sequence[Any], batches: Sequence[int]) -> tuple[list[float], float, Any]:
    """(|g_k|², |g|², g) of one round's worker gradients, g their batch-weighted mean."""
    total = sum(batches)
    g = sum(b / total * gk for b, gk in zip(batches, grads))
    return [float(gk @ gk) for gk in grads], float(g @ g), g


def frozen_estimate(trainer: Trainer, batches: Sequence[int], rounds: int) -> dict[str, Any]:
    """A fresh estimator over `rounds` fresh batches at the current weights (equal weight per round)."""
    from ps.control.global_batch.gns import NoiseScaleEstimator

    est = NoiseScaleEstimator(smoothing=1.0 - 1.0 / rounds)
    for _ in range(rounds):
        grads = trainer.worker_gradients(trainer.draw(sum(batches)), batches)
        local, overall, _ = round_norms(grads, batches)
        est.observe(batches, local, overall)
    return described(est)


def described(est: Any) -> dict[str, Any]:
    got = est.estimate()
    return {"phi": got.phi, "signal": got.signal, "noise": got.noise, "reason": got.reason}


def ratio(value: float | None, truth: float) -> float | None:
    return None if value is None else round(value / truth, 4)


class WindowTruth:
    """The truth over the rounds an EWMA estimate covers: per round s before a point, |G(θ_s)|² (full
    gradient, every round) and tr(Σ(θ_s)) (per-sample, on `passes` rounds spread over the window,
    interpolated: it drifts slowly, while |G|² swings from one step to the next), averaged with the
    estimator's weights over the last rounds that hold all but `left_out` of them."""

    def __init__(self, smoothing: float, point_steps: Sequence[int], passes: int = 8, left_out: float = 0.05) -> None:
        self.smoothing, self.point_steps = smoothing, sorted(point_steps)
        self.length = 1 if smoothing == 0 else math.ceil(math.log(left_out) / math.log(smoothing))
        self.every = max(1, math.ceil(self.length / passes))
        self.signals: dict[int, float] = {}  # step -> |G(θ_step)|²
        self.noises: dict[int, float] = {}  # step -> tr(Σ(θ_step)), on some steps

    def record(self, trainer: Trainer, step: int) -> None:
        """Measure the weights that round `step` is about to use, if the next point's window holds it
        (a later point's window then holds nothing older: the windows have one length)."""
        upcoming = next(p for p in self.point_steps if p > step)
        age, oldest = upcoming - 1 - step, max(0, upcoming - self.length)
        if step < oldest:
            return
        if age % self.every == 0 or step == oldest:
            truth = trainer.true_noise_scale()
            self.signals[step], self.noises[step] = truth["signal"], truth["noise"]
        else:
            self.signals[step] = trainer.full_signal()

    def result(self, point: int) -> dict[str, Any]:
        """The weighted truths over the window of the point after `point` rounds."""
        steps = np.arange(max(0, point - self.length), point)
        weights = self.smoothing ** (point - 1 - steps)
        known = sorted(k for k in self.noises if steps[0] <= k < point)
        noise = np.interp(steps, known, [self.noises[k] for k in known])
        signal = np.array([self.signals[int(k)] for k in steps])
        s, n = float(weights @ signal / weights.sum()), float(weights @ noise / weights.sum())
        return {"signal": s, "noise": n, "b_noise": n / s, "rounds": len(steps),
                "signal_min": float(signal.min()), "signal_max": float(signal.max())}


def epochs(text: str) -> list[float]:
    """Comma-separated epochs > 0, fractions allowed (`--points`)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated epochs, e.g. 0.25,1,2; got {text!r}") from None
    if not values or not all(0.0 < v < math.inf for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated epochs > 0, e.g. 0.25,1,2; got {text!r}")
    return values


def point_steps(points: Sequence[float], steps_per_epoch: int) -> dict[int, float]:
    """The step after which each point is compared (an epoch's fraction of its steps, at least one),
    with the epoch it names; two points that fall on one step are one."""
    return {max(1, round(e * steps_per_epoch)): (int(e) if float(e).is_integer() else e) for e in sorted(points)}


def compared(trainer: Trainer, epoch: float, step: int, window: WindowTruth, online: Any, batches: list[int],
             equal: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """One point: the online estimate after `step` rounds against the truth over its window and at the
    point, and the frozen model's estimates from the split and from equal batches."""
    from ps.rounds.evaluator import evaluate

    smoothed = window.result(step)
    truth = trainer.true_noise_scale()
    now = described(online)
    hetero = frozen_estimate(trainer, batches, args.frozen_rounds)
    homo = frozen_estimate(trainer, equal, args.frozen_rounds)
    accuracy = evaluate(trainer.model, trainer.data.test)[0]
    trainer.model.train()  # evaluate() left it in eval mode
    error = None if now["phi"] is None else abs(now["phi"] / smoothed["b_noise"] - 1.0)
    return {
        "epoch": epoch, "step": step, "test_accuracy": round(accuracy, 4),
        "true_window": smoothed, "online": now, "online_ratio": ratio(now["phi"], smoothed["b_noise"]),
        "true_point": truth, "frozen_split": hetero, "frozen_split_ratio": ratio(hetero["phi"], truth["b_noise"]),
        "frozen_equal": homo, "frozen_equal_ratio": ratio(homo["phi"], truth["b_noise"]),
        "within_tolerance": error is not None and error <= args.tolerance,
    }

def check(args: argparse.Namespace) -> dict[str, Any]:
    """Train with the heterogeneous split and compare the estimates with the truth at each point."""
    import torch

    from ps.control.global_batch.gns import NoiseScaleEstimator
    from ps.control.split import largest_remainder

    trainer = Trainer(args)
    shares = {str(k): float(s) for k, s in enumerate(args.shares)}
    batches = list(largest_remainder(shares, args.global_batch).values())
    equal = list(largest_remainder({k: 1.0 for k in shares}, args.global_batch).values())
    if min(batches) < 1:
        raise ValueError(f"--global-batch {args.global_batch} leaves a worker no sample at shares {args.shares}")
    steps_per_epoch = len(trainer.data.train_x) // args.global_batch
    if steps_per_epoch < 1:
        raise ValueError(f"--global-batch {args.global_batch} exceeds the {len(trainer.data.train_x)} training samples")
    online = NoiseScaleEstimator(smoothing=args.smoothing)
    at = point_steps(args.points, steps_per_epoch)
    window = WindowTruth(args.smoothing, list(at))
    points, step = [], 0
    started = time.perf_counter()
    while step < max(at):
        order = torch.randperm(len(trainer.data.train_x), generator=trainer.rng)
        for s in range(min(steps_per_epoch, max(at) - step)):
            window.record(trainer, step)
            grads = trainer.worker_gradients(order[s * args.global_batch:(s + 1) * args.global_batch], batches)
            local, overall, g = round_norms(grads, batches)
            online.observe(batches, local, overall)
            trainer.step(g.float())
            step += 1
            if step in at:
                points.append(compared(trainer, at[step], step, window, online, batches, equal, args))
    return {
        "benchmark": "gns_check", "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "workload": {"model": args.model, "model_args": args.model_arg, "dataset": args.dataset,
                     "dataset_args": args.dataset_arg, "lr": args.lr, "momentum": args.momentum, "seed": args.seed},
        "global_batch": args.global_batch, "split": batches, "equal_split": equal, "smoothing": args.smoothing,
        "frozen_rounds": args.frozen_rounds, "tolerance": args.tolerance, "points": points,
        "all_within_tolerance": all(p["within_tolerance"] for p in points),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def table(report: dict[str, Any]) -> str:
    head = ["epoch", "acc", "true B_noise (window)", "online φ", "ratio", "true B_noise (point)", "frozen split φ",
            "ratio", "frozen equal φ", "ratio"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda v: "unknown" if v is None else f"{v:.1f}"  # noqa: E731
    for p in report["points"]:
        rows.append("| " + " | ".join([
            str(p["epoch"]), f"{p['test_accuracy']:.3f}", fmt(p["true_window"]["b_noise"]), fmt(p["online"]["phi"]),
            str(p["online_ratio"]), fmt(p["true_point"]["b_noise"]), fmt(p["frozen_split"]["phi"]),
            str(p["frozen_split_ratio"]), fmt(p["frozen_equal"]["phi"]), str(p["frozen_equal_ratio"]),
        ]) + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0.0 <= args.smoothing < 1.0:
        parser.error(f"--smoothing must be in [0, 1), got {args.smoothing}")
    if args.frozen_rounds < 1 or args.global_batch < 2 or not args.tolerance > 0:
        parser.error("need --frozen-rounds >= 1, --global-batch >= 2 and --tolerance > 0")
    if len(args.shares) < 2:
        parser.error("--shares needs two or more workers")
    if not tune_like_a_worker(parser.prog):  # the workers' allocator settings: far fewer page faults
        return 2
    import torch

    torch.set_num_threads(1)
    try:
        report = check(args)
    except ValueError as exc:  # a bad --model/--dataset option, or a B the data or shares cannot take
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    show(report, table(report), args.json)
    save_result(args, "gns_check", report, argv)
    return 0


def show(report: dict[str, Any], text: str, as_json: bool) -> None:
    """The JSON report (with --json) and a blank line, then the table."""
    if as_json:
        print(json.dumps(report))
        print()
    print(text)


if __name__ == "__main__":
    sys.exit(main())
