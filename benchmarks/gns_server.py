"""`python -m benchmarks.gns_server`: the server's own online noise scale, from real pushes of
workers with unequal batches, against brute force (benchmarks/gns_check.py's truth).

For each point P (epochs of training), a real ps-server and N real workers (static split by the
--shares as declared cores: B = 256 over 6/6/4/32 gives 32/32/21/171) train P epochs at --lr, then
the LR drops by 1e-9 (--lr-milestones P) and `--freeze-epochs` more epochs hold the weights still
while the server's estimator (`--adaptive-batch gns` with B held: min = max = B) forgets the moving
rounds (its smoothing 0.98 leaves 0.98^400 ≈ 3e-4 of them). The final checkpoint holds the weights
and the estimator: its φ against the brute-force B_noise of those weights (every training sample's
own gradient). The comparison is at a point, with no window to average over, as the weights hold
still. Takes benchmarks.gns_check's flags (its workload, --global-batch, --shares, --points,
--frozen-rounds, --tolerance) and prints JSON (--json) and a table."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import gns_check
from benchmarks.report_output import save_result
from benchmarks.workload import CHILD_ENV


def server_point(args: argparse.Namespace, epochs: int, workdir: Path) -> dict[str, Any]:
    """Train `epochs`, freeze, and read the server's estimate and the weights from its checkpoint."""
    from ps.control.global_batch.gns import NoiseScaleEstimator
    from ps.ops.metrics import read_metrics
    from ps.checkpoint import latest_checkpoint

    B = args.global_batch
    job = ["--workers", str(len(args.shares)), "--controller", "static", "--model", args.model, "--dataset", args.dataset,
           *[a for kv in args.model_arg for a in ("--model-arg", kv)],
           *[a for kv in args.dataset_arg for a in ("--dataset-arg", kv)],
           "--seed", str(args.seed), "--global-batch", str(B), "--lr", str(args.lr), "--momentum", str(args.momentum),
           "--lr-milestones", str(epochs), "--lr-gamma", "1e-9", "--epochs", str(epochs + args.freeze_epochs),
           "--adaptive-batch", "gns", "--min-global-batch", str(B), "--max-global-batch", str(B),
           "--checkpoint-dir", str(workdir / "ckpt"), "--metrics-log", str(workdir / "metrics.jsonl"), "--quiet",
           "--port", "0", "--port-file", str(workdir / "port"), "--grace", "5"]
    with open(workdir / "server.log", "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "ps.server", *job], stdout=log, stderr=subprocess.STDOUT,
                                  env=CHILD_ENV)
    workers: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 60
        while not ((workdir / "port").exists() and (workdir / "port").read_text().strip()):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ps-server did not start: {(workdir / 'server.log').read_text()[-800:]}")
            time.sleep(0.1)
        target = f"127.0.0.1:{(workdir / 'port').read_text().strip()}"
        for k, share in enumerate(args.shares):
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "worker.cli", "--server", target, "--name", f"w{k}", "--cores", str(share), "--quiet"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=CHILD_ENV))
        if server.wait(timeout=args.run_timeout) != 0:
            raise RuntimeError(f"ps-server failed: {(workdir / 'server.log').read_text()[-800:]}")
    finally:
        for proc in [*workers, server]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    found = latest_checkpoint(workdir / "ckpt", warn=lambda msg: print(f"gns_server: {msg}", file=sys.stderr))
    if found is None:
        raise RuntimeError("the server wrote no checkpoint")
    _, state = found
    estimate = NoiseScaleEstimator.from_state_dict(state["adaptive"]["gns"]).estimate()
    events = read_metrics(workdir / "metrics.jsonl")
    split = next(e["batch_sizes"] for e in events if e["event"] == "adjust")
    evals = [e for e in events if e["event"] == "eval" and e["epoch"] == epochs]
    return {"phi": estimate.phi, "rounds": estimate.rounds, "model": state["model"], "split": split,
            "test_accuracy": evals[0]["accuracy"] if evals else None}


def server_check(args: argparse.Namespace) -> dict[str, Any]:
    """Every point: the server's φ and the brute-force B_noise at the same weights; the target is
    |φ/B_noise − 1| <= --tolerance at every point."""
    trainer = gns_check.Trainer(args)
    points = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gns-server-") as tmp:
        for epochs in args.points:
            workdir = Path(tmp) / f"p{epochs}"
            workdir.mkdir()
            got = server_point(args, epochs, workdir)
            trainer.model.load_state_dict(got.pop("model"))
            truth = trainer.true_noise_scale()
            split = list(got["split"].values())
            frozen = gns_check.frozen_estimate(trainer, split, args.frozen_rounds)
            r = gns_check.ratio(got["phi"], truth["b_noise"])
            points.append({"epoch": epochs, **got, "true_b_noise": truth["b_noise"], "server_ratio": r,
                           "one_process_frozen_phi": frozen["phi"],
                           "one_process_frozen_ratio": gns_check.ratio(frozen["phi"], truth["b_noise"]),
                           "within_tolerance": r is not None and abs(r - 1.0) <= args.tolerance})
    return {"benchmark": "gns_check", "kind": "server", "date": time.strftime("%Y-%m-%d"),
            "workload": {"model": args.model, "model_args": args.model_arg, "dataset": args.dataset,
                         "dataset_args": args.dataset_arg, "lr": args.lr, "momentum": args.momentum, "seed": args.seed},
            "global_batch": args.global_batch, "shares": args.shares, "freeze_epochs": args.freeze_epochs,
            "tolerance": args.tolerance, "points": points,
            "all_within_tolerance": all(p["within_tolerance"] for p in points),
            "wall_s": round(time.perf_counter() - started, 1)}


def table(report: dict[str, Any]) -> str:
    head = ["epoch", "acc", "split", "server φ", "true B_noise", "ratio", "one-process frozen φ", "ratio"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda v: "unknown" if v is None else f"{v:.1f}"  # noqa: E731
    for p in report["points"]:
        rows.append("| " + " | ".join([
            str(p["epoch"]), str(p["test_accuracy"]), "/".join(map(str, p["split"].values())), fmt(p["phi"]),
            fmt(p["true_b_noise"]), str(p["server_ratio"]), fmt(p["one_process_frozen_phi"]),
            str(p["one_process_frozen_ratio"])]) + " |")
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    """`python -m benchmarks.gns_server`'s command line: gns_check's and the server runs' own."""
    parser = gns_check.build_parser()
    parser.prog = "python -m benchmarks.gns_server"
    parser.add_argument("--freeze-epochs", type=int, default=2, help="epochs at a 1e-9 LR before the comparison")
    parser.add_argument("--run-timeout", type=float, default=600.0, help="seconds per server run")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(args.shares) < 2 or args.freeze_epochs < 1 or args.frozen_rounds < 1:
        parser.error("need two or more --shares, --freeze-epochs >= 1 and --frozen-rounds >= 1")
    if not all(float(e).is_integer() for e in args.points):  # the server's --lr-milestones are whole epochs
        parser.error(f"--points must be whole epochs here (the server freezes at an epoch's end), got {args.points}")
    args.points = [int(e) for e in args.points]
    import torch

    torch.set_num_threads(1)
    report = server_check(args)
    gns_check.show(report, table(report), args.json)
    save_result(args, "gns_server", report, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
