"""`ps-server`'s command line: every flag with its type, default and help, and the parsing of the values
that argparse's types do not cover (`--model-arg K=V`). Every value is checked here, so a bad one is
a usage error naming its flag; ps/server.py checks the flags against each other and builds the job.
The flags of a batch policy's own settings come from its declarations (ps/control/settings.py) through
the registry, one `--<policy>-<setting>` each."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ps.control.global_batch.goodput import ADAPT_THRESHOLD, DECIDE_EVERY, LR_SCALINGS, MIN_STEPS_PER_EPOCH, AdaptiveConfig
from ps.control.config import nearest_multiples
from ps.control.registry import POLICIES, policy_settings
from ps.control.settings import Setting, setting_key
from ps.ops.metrics_http import add_endpoint_flags
from ps.serving.server_options import add_call_flags, add_listen_flags
from common.job.spec import (ALLREDUCE_ALGORITHMS, BALANCE_TIMES, FAST_PATH_CHOICES, MAX_EPOCHS, MODES, OPTIMIZERS,
                             SAMPLINGS, STALENESS_LR, WIRE_DTYPES)
from common.ops.arg_types import (DefaultsHelpFormatter, epoch_or_steps, eval_interval, float_at_least, float_between,
                                  from_value_error, increasing_ints, int_at_least, int_between, positive_float, positive_int)


def parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` strings to a dict; values parse as JSON where they can (numbers, booleans)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"expected key=value, got {pair!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def round_deadline(text: str) -> str | float:
    """--round-deadline: auto, off, or a finite number of seconds > 0."""
    if text in ("auto", "off"):
        return text
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected auto, off or seconds > 0, got {text!r}")
    return seconds


def key_value(text: str) -> str:
    """A `key=value` option as given; refuses one without a key or an `=`."""
    key, sep, _ = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected K=V, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ps-server",
        description="Heterogeneity-aware parameter server: BSP/ASP training with an OmniLearn-style batch policy.",
        epilog="exit status: 0 the job finished, or SIGTERM or Ctrl-C stopped it (checkpointed); 1 it failed while "
               "running (a port, a file, a shard process); 2 bad input (nothing started); 3 it ended early, before "
               "its last epoch, for the reason its `end` line on stderr and the metrics log's end and summary records "
               "give (the workers left cannot make up --global-batch, a shard failed).",
        formatter_class=DefaultsHelpFormatter,
    )
    job = p.add_argument_group("job")
    job.add_argument("--mode", choices=MODES, default="bsp", help="synchronous rounds or asynchronous updates")
    job.add_argument("--workers", type=positive_int, default=4, help="workers to wait for before training starts")
    job.add_argument("--model", default="mlp",
                     help="built-in mlp (options hidden=128 layers=2) or cnn (width=32), or package.module:function, "
                          "a factory fn(input_shape, num_classes, **options) -> torch.nn.Module that gives each "
                          "sample one score per class (checked on two training samples when the job is set up)")
    job.add_argument("--model-arg", type=key_value, action="append", default=[], metavar="K=V", help="model option, e.g. hidden=512")
    job.add_argument("--dataset", default="digits",
                     help="built-in digits (scikit-learn's, 80/20 split), synthetic (options size=4096 image_size=32 "
                          "channels=3 num_classes=10 noise=1.0) or teacher (size=65536 features=32 hidden=32 "
                          "num_classes=10 label_noise=0.0: a task on which the batch size matters, for mlp); files on "
                          "disk: image_folder (root=PATH: one subfolder per class) or npy_arrays (root=PATH: "
                          "features.npy, labels.npy); or package.module:function, a factory fn(seed, **options) -> "
                          "common.job.datasets.Dataset or common.job.splits.Splits (docs/data.md)")
    job.add_argument("--dataset-arg", type=key_value, action="append", default=[], metavar="K=V", help="dataset option, e.g. size=8192")
    job.add_argument("--epochs", type=int_between(1, MAX_EPOCHS), default=10,
                     help=f"passes over the training split (at most {MAX_EPOCHS})")
    job.add_argument("--seed", type=int_at_least(0), default=0, help="seeds the model's initial weights and the data split")
    job.add_argument("--eval-every", type=eval_interval, default="1", metavar="EPOCHS",
                     help="evaluate the global model on the test split at every EPOCHS-th epoch's end and after the last, "
                          "or K times an epoch with EPOCHS = 1/K (0.25: a time to an accuracy then resolves a quarter "
                          "epoch); beside the rounds, on the server's own thread, but on the machine's CPU (a test pass)")
    job.add_argument("--allreduce", nargs="?", const="on", choices=FAST_PATH_CHOICES, default="auto",
                     help="BSP collective fast path: workers all-reduce their gradients with torch.distributed "
                          "(NCCL if every worker has its own GPU, else gloo); the server coordinates rounds, plan and "
                          "checkpoints. --allreduce alone is on; auto (default) takes it when the workers that start "
                          "the job all compute on GPUs of their own, in a BSP job on one server without --balance busy "
                          "or cycle; on CPU workers with --sampling independent it times both paths at one plan and keeps "
                          "the faster (docs/fast-path.md); else it stays on the PS path; off never "
                          "takes it")
    job.add_argument("--sampling", choices=SAMPLINGS, default="exact",
                     help="exact (default): the server hands every worker its slice of one permutation of the training "
                          "set per epoch, in the reply that tells its batch size, so each sample is trained on once per "
                          "epoch at any split and membership (docs/data.md); independent: each worker draws from a "
                          "permutation of its own. The --allreduce fast path always samples independently")
    job.add_argument("--allreduce-algorithm", choices=ALLREDUCE_ALGORITHMS, default="auto",
                     help="--allreduce: ring is torch.distributed.all_reduce; hub sums the buckets at the worker with "
                          "the largest batch and sends the sum back, so a slow worker takes part twice per step instead "
                          "of 2(W-1) times; auto is hub over gloo, ring over NCCL")
    opt = p.add_argument_group("optimizer")
    opt.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                     help="the job's optimizer: BSP steps it on the server, ASP on every worker, over its own updates")
    opt.add_argument("--lr", type=positive_float, default=0.1, help="learning rate (ASP: eta in eta_k = eta*b_k/B)")
    opt.add_argument("--momentum", type=float_between(0.0, 1.0, high_open=True), default=0.9, help="SGD momentum")
    opt.add_argument("--weight-decay", type=float_at_least(0.0), default=0.0, help="L2 penalty")
    opt.add_argument("--nesterov", action="store_true", help="Nesterov momentum (SGD)")
    opt.add_argument("--lr-milestones", type=increasing_ints, default=(), metavar="E1,E2,...", help="comma-separated epochs where lr is multiplied by --lr-gamma")
    opt.add_argument("--lr-gamma", type=float_between(0.0, 1.0, low_open=True), default=0.1, help="lr factor at each milestone")
    opt.add_argument("--no-lr-scaling", action="store_true", help="ASP: every worker uses lr instead of lr*b_k/B")
    ctl = p.add_argument_group("batch policy")
    ctl.add_argument("--global-batch", type=positive_int, default=128, help="B, split across the workers (at most the training set's size)")
    ctl.add_argument("--controller", dest="policy", choices=tuple(POLICIES), default="auto", help=argparse.SUPPRESS)
    ctl.add_argument("--policy", choices=tuple(POLICIES), default="auto",
                     help="the batch policy (docs/policies.md; --controller is another name for this flag): uniform "
                          "(equal batches), static (Eq. 4a from the "
                          "declared cores), dynamic (Eq. 6 proportional control of the measured times), model "
                          "(Cannikin's OptPerf: per-worker fits t = q*b + s, a one-step optimal split, parking) or "
                          "auto (default: dynamic's measured step until a worker's fit is known, model's solve "
                          "and parking after, the step again when a worker's speed changes)")
    ctl.add_argument("--no-park", dest="park", action="store_false",
                     help="--policy model or auto in BSP: never park a worker at batch 0, even when the predicted round "
                          "is shorter without it (refused with the other policies, which never park; parking is off on "
                          "the --allreduce fast path and in ASP anyway)")
    ctl.add_argument("--deadband", type=float_between(0.0, 1.0, high_open=True), default=0.1, help="relative change below which a batch stays (Eq. 7)")
    ctl.add_argument("--min-batch", type=positive_int, default=None, metavar="N",
                     help="per-worker lower bound (default: 1, or 2 for a model with BatchNorm, which cannot train on "
                          "one sample: 1 is refused for it)")
    ctl.add_argument("--max-batch", type=positive_int, default=None, help="per-worker upper bound (unset: the global batch)")
    ctl.add_argument("--micro-batch", type=positive_int, default=1, metavar="M",
                     help="BSP: every worker's batch is a whole number k of micro-batches of M samples (JABAS): the "
                          "policy plans k, a worker accumulates k micro-batch gradients into one push, and BatchNorm "
                          "always normalises over M samples; --global-batch must be a multiple of M "
                          "(docs/micro-batches.md). 1: any batch")
    ctl.add_argument("--adjust-every", type=epoch_or_steps, default=None, metavar="{epoch,N}",
                     help="batch policy decision at every epoch end (default) or every N steps")
    ctl.add_argument("--balance", choices=("auto", *BALANCE_TIMES), default="auto",
                     help="what the batch policy equalizes: compute time (fetch + forward + backward); busy time, "
                          "which adds each worker's own part of its push (sending, and receiving and loading the new "
                          "parameters, not waiting for the round): on CPU-throttled workers that part is slower too; "
                          "or (BSP) the cycle, timed by the server from a round's replies going out to each worker's "
                          "next push arrived, which also holds the transport work a worker cannot time itself. On the "
                          "--allreduce fast path a CPU worker's own part is its CPU time from its compute's end to its "
                          "next batch (the all-reduce's own work, the optimizer step, the report), at its compute's "
                          "speed; a GPU worker's is not measured. Busy time is measured with one server only (not "
                          "with --shards), the cycle on the PS path only. auto (default): busy for BSP where it is "
                          "measured, compute otherwise (ASP, --shards)")
    ctl.add_argument("--ewma-alpha", type=float_between(0.0, 1.0, low_open=True), default=0.3, help="weight of the newest compute time in the EWMA")
    ctl.add_argument("--dynamic-start", choices=["uniform", "static"], default="static",
                     help="first plan of the dynamic, model and auto policies (and the guess for a worker not "
                          "measured yet): equal batches, or in proportion to each worker's declared cores (static, "
                          "the default: a worker declares the CPUs it may use, its container's CPU quota "
                          "included, unless given --cores)")
    add_policy_settings(ctl)
    ada = p.add_argument_group("adaptive global batch (docs/adaptive-batch.md)")
    ada.add_argument("--adaptive-batch", choices=("off", "gns"), default="off",
                     help="BSP: gns measures the gradient noise scale from the pushes and moves B to the best "
                          "goodput (throughput x statistical efficiency) within the bounds below and at least "
                          f"{MIN_STEPS_PER_EPOCH} rounds an epoch; works under every --controller (without the model policy's fits it "
                          "probes a second B to fit the round time in B); a move the measured goodput "
                          "contradicts is taken back")
    ada.add_argument("--adapt-every", type=epoch_or_steps, default=DECIDE_EVERY, metavar="{N,epoch}",
                     help=f"--adaptive-batch: decide every N rounds (default {DECIDE_EVERY}: once B's round is measured) or at epoch ends")
    ada.add_argument("--min-global-batch", type=positive_int, default=None,
                     help="--adaptive-batch: the smallest B (default: --workers x --min-batch)")
    ada.add_argument("--max-global-batch", type=positive_int, default=None,
                     help="--adaptive-batch: the largest B (default: 8 x --global-batch)")
    ada.add_argument("--adapt-threshold", type=float_between(0.0, 1.0, high_open=True), default=ADAPT_THRESHOLD,
                     help="--adaptive-batch: change B only for a predicted goodput gain of at least this fraction")
    ada.add_argument("--lr-scaling", choices=LR_SCALINGS, default=LR_SCALINGS[0],
                     help="--adaptive-batch: the learning rate at B, times adascale's gain (B/B0)(phi+B0)/(phi+B), "
                          "linear B/B0 or sqrt(B/B0), B0 the --global-batch")
    asp = p.add_argument_group("asynchronous training (ASP)")
    asp.add_argument("--max-staleness", type=int_at_least(0), default=None,
                     help="refuse an update computed from a version more than this many versions old (the worker "
                          "pulls and recomputes; unset: no limit)")
    asp.add_argument("--staleness-bound", type=int_at_least(0), default=None, metavar="S",
                     help="stale-synchronous parallel: hold a worker's reply while it has applied more than S updates "
                          "beyond the slowest running worker (left, evicted and parked workers hold nobody back); 0 is "
                          "lock-step; unset: no bound")
    asp.add_argument("--staleness-lr", choices=STALENESS_LR, default="off",
                     help="scale an update by its staleness tau (versions): inverse is eta_k/tau (Zhang et al. 2016), "
                          "excess eta_k*min(1, (W-1)/tau) with W running workers; with more than four workers inverse "
                          "held the test accuracy where plain ASP dipped (docs/asp.md)")
    rob = p.add_argument_group("robust aggregation (docs/security.md)")
    rob.add_argument("--max-update-norm", type=positive_float, default=None, metavar="NORM",
                     help="clip a push (a BSP gradient, an ASP update) whose L2 norm exceeds NORM down to NORM before "
                          "it is aggregated; it keeps its samples (unset: off)")
    rob.add_argument("--clip-outliers", type=float_at_least(1.0), default=None, metavar="K",
                     help="clip a push whose L2 norm exceeds K times the median norm of the last 50 pushes (once 5 "
                          "were seen) down to that; with --max-update-norm the lower limit applies (unset: off)")
    rel = p.add_argument_group("reliability")
    rel.add_argument("--max-workers", type=positive_int, default=None,
                     help="workers allowed in the job at once, late joiners included (unset: --workers)")
    rel.add_argument("--evict-after", type=positive_float, default=10.0,
                     help="evict a worker not heard from (heartbeat or RPC) for this many seconds")
    rel.add_argument("--round-deadline", type=round_deadline, default="auto", metavar="{auto,off,SECONDS}",
                     help="BSP: evict a member whose push is not complete this long after its round opened (the round "
                          "closes over the pushes that arrived); auto: max(--round-deadline-floor, 4 x the predicted or "
                          "recent median round), at least --round-warmup until 3 rounds were timed. ASP with "
                          "--staleness-bound: the same for the slowest worker while it holds others back (see "
                          "docs/reliability.md)")
    rel.add_argument("--round-deadline-floor", type=positive_float, default=5.0, metavar="SECONDS",
                     help="the least --round-deadline auto gives")
    rel.add_argument("--round-warmup", type=positive_float, default=60.0, metavar="SECONDS",
                     help="--round-deadline auto: the least deadline of the job's first 3 rounds, of a worker name's "
                          "first round in the job, and of a round no push reached")
    rel.add_argument("--push-idle", type=positive_float, default=10.0, metavar="SECONDS",
                     help="drop a push whose stream brings no data for this long (an empty chunk is none), and cancel "
                          "a Pull's or push's reply whose caller takes none of its chunks for this long")
    rel.add_argument("--push-admit-wait", type=positive_float, default=60.0, metavar="SECONDS",
                     help="the longest a push waits for room under --push-buffer-mib; then RESOURCE_EXHAUSTED, "
                          "which a worker retries")
    rel.add_argument("--join-wait", type=positive_float, default=300.0, metavar="SECONDS",
                     help="turn away a worker that joined and waited this long for the job to start")
    rel.add_argument("--push-buffer-mib", type=positive_int, default=1024, metavar="MiB",
                     help="payload of the pushes streaming in at once; a push beyond it waits until others arrived "
                          "whole (one alone always goes)")
    add_call_flags(rel, None, "Join, Heartbeat, ...", "; unset: 16 per allowed worker (--max-workers) + 64")
    rel.add_argument("--checkpoint-dir", type=Path, default=None, help="write checkpoints here")
    rel.add_argument("--checkpoint-every", type=epoch_or_steps, default=None, metavar="{epoch,N}",
                     help="checkpoint at every epoch end (default) or every N steps")
    rel.add_argument("--keep-checkpoints", type=positive_int, default=3, help="how many checkpoints to keep")
    rel.add_argument("--resume", type=Path, default=None, metavar="DIR",
                     help="continue from the newest valid checkpoint in DIR (also checkpoints there)")
    net = p.add_argument_group("server")
    add_listen_flags(net, 50051)
    net.add_argument("--shards", type=positive_int, default=1,
                     help="BSP: split the parameters by contiguous ranges across N server processes (this one and "
                          "N-1 ps-shard processes it starts on --host); workers push and pull the ranges in parallel")
    net.add_argument("--shard-addresses", default=None, metavar="HOST:PORT,...",
                     help="use these running ps-shard servers for ranges 1.. instead of starting them (sets --shards)")
    net.add_argument("--shard-tls-ca", type=Path, default=None, metavar="PATH",
                     help="--shards with TLS: the PEM CA that signed the shard servers' certificates (the shards "
                          "--shards N starts serve --tls-cert); the coordinator checks them against it")
    net.add_argument("--wire-dtype", choices=WIRE_DTYPES, default="float32",
                     help="dtype of parameters and gradients on the wire (fp32 accumulation)")
    net.add_argument("--no-overlap", dest="overlap", action="store_false",
                     help="BSP on the PS path: workers push the whole gradient after backward (the serial path) "
                          "and take the whole reply before the next forward, instead of streaming gradient buckets while backward "
                          "runs and the parameters back while the next forward runs")
    net.add_argument("--metrics-log", type=Path, default=None, help="append JSON-lines events here (see docs/metrics.md)")
    add_endpoint_flags(net, "the job's progress and gRPC message bytes")
    net.add_argument("--threads", type=positive_int, default=1, help="torch threads for the optimizer and evaluation")
    net.add_argument("--grace", type=float_at_least(0.0), default=10.0, help="seconds to wait for workers to hear the job ended")
    net.add_argument("--quiet", action="store_true", help="no progress on stderr (a bar when stderr is a terminal, plain lines otherwise)")
    net.add_argument("--tls-cert", type=Path, default=None, metavar="PATH", help="serve TLS with this PEM certificate (chain)")
    net.add_argument("--tls-key", type=Path, default=None, metavar="PATH", help="PEM private key of --tls-cert")
    net.add_argument("--tls-client-ca", type=Path, default=None, metavar="PATH",
                     help="mutual TLS: require client certificates signed by this PEM CA")
    net.add_argument("--token", default=None,
                     help="shared token every call must carry (unset: $PS_TOKEN, else the file $PS_TOKEN_FILE names, "
                          "else no check)")
    net.add_argument("--insecure", action="store_true",
                     help="listen beyond loopback (--host) without a token or mutual TLS: refused unless given, as "
                          "anyone who reaches the port may then join, read the model and push into it")
    return p


def add_policy_settings(group: argparse._ArgumentGroup) -> None:
    """Every registered policy's own settings as `--<policy>-<setting>` flags, with their bounds or
    choices and defaults; unset, a flag leaves the policy's default (and no attribute on the namespace)."""
    for policy in POLICIES:
        for setting in policy_settings(policy):
            where = (f"one of {', '.join(setting.choices)}" if setting.choices else
                     f"in {setting.interval()}" if setting.kind in (int, float) else "")
            text = f"--policy {policy}: {setting.help}" + (f" ({where})" if where else "") + f" (default: {setting.default})"
            dest = setting_dest(policy, setting)
            if setting.kind is bool:
                group.add_argument(setting.flag(policy), dest=dest, action=argparse.BooleanOptionalAction,
                                   default=argparse.SUPPRESS, help=text)
            else:
                group.add_argument(setting.flag(policy), dest=dest, type=setting_type(setting), default=argparse.SUPPRESS,
                                   metavar=setting.kind.__name__.upper(), help=text)


def setting_dest(policy: str, setting: Setting) -> str:
    return setting.flag(policy)[2:].replace("-", "_")


def setting_type(setting: Setting) -> Callable[[str], Any]:
    """The argparse type of a setting: its own parse and check, a bad value a usage error that says why."""
    parse = from_value_error(setting.parse)
    parse.__name__ = setting.kind.__name__
    return parse


def policy_options(args: argparse.Namespace) -> dict[str, Any]:
    """The values given for the chosen policy's own settings, by name (the others keep its defaults);
    ValueError for a setting's flag of another policy than --policy."""
    options = {}
    for policy in POLICIES:
        for setting in policy_settings(policy):
            if hasattr(args, setting_dest(policy, setting)):
                if policy != args.policy:
                    raise ValueError(f"{setting.flag(policy)} is for --policy {policy}, not --policy {args.policy}")
                options[setting.name] = getattr(args, setting_dest(policy, setting))
    return options


POLICY_FLAGS = {"policy": "--controller", "deadband": "--deadband", "min_batch": "--min-batch",
                "max_batch": "--max-batch", "ewma_alpha": "--ewma-alpha", "dynamic_start": "--dynamic-start",
                "park": "parking (--no-park)", "break_even": "break-even parking (--adaptive-batch)",
                "micro_batch": "--micro-batch"}
"""The ps-server flag of each PolicyConfig field a resume may change, as its warning names it."""


def policy_flags() -> dict[str, str]:
    """POLICY_FLAGS and every registered policy's own settings' flags, by the name a resume's change has
    (ps.control.config.config_changes: `<policy>.<setting>`)."""
    return {**POLICY_FLAGS, **{setting_key(policy, setting.name): setting.flag(policy)
                               for policy in POLICIES for setting in policy_settings(policy)}}


def describe_policy_changes(changes: Mapping[str, tuple[Any, Any]]) -> str:
    """The warning for a resume whose batch-policy flags differ from the checkpoint's (Coordinator.restore)."""
    flags = policy_flags()
    shown = ", ".join(
        f"{flags.get(name, name)} {'unset' if old is None else old} -> {'unset' if new is None else new}"
        for name, (old, new) in changes.items()
    )
    return f"the controller settings differ from the checkpoint's ({shown}); the command line's apply"


BATCHNORM_MIN_BATCH = 2
"""The smallest batch a model with BatchNorm trains on: a layer in train mode cannot take the
variance of one sample (torch: "Expected more than 1 value per channel")."""


def settle_min_batch(args: argparse.Namespace, batchnorm: bool) -> None:
    """Set --min-batch's default (1; BATCHNORM_MIN_BATCH for a model with BatchNorm, so that no plan,
    policy or join ever gives a worker one sample), and refuse an explicit one below it for such a model."""
    if not batchnorm:
        args.min_batch = 1 if args.min_batch is None else args.min_batch
    elif args.min_batch is None:
        args.min_batch = BATCHNORM_MIN_BATCH
        why = f"the {BATCHNORM_MIN_BATCH} samples a model with BatchNorm (--model {args.model}) needs"
        if args.workers * BATCHNORM_MIN_BATCH > args.global_batch:
            raise ValueError(f"--global-batch {args.global_batch} cannot give --workers {args.workers} {why}; use "
                             f"--global-batch {args.workers * BATCHNORM_MIN_BATCH} or more")
        if args.max_batch is not None and args.max_batch < BATCHNORM_MIN_BATCH:
            raise ValueError(f"--max-batch {args.max_batch} is below {why}")
    elif args.min_batch < BATCHNORM_MIN_BATCH:
        raise ValueError(f"--min-batch {args.min_batch}: --model {args.model} has BatchNorm, which cannot train on one "
                         f"sample; give --min-batch {BATCHNORM_MIN_BATCH} or more (its default for this model)")


def check_micro_batch_flags(args: argparse.Namespace) -> None:
    """--micro-batch against the other flags: BSP only, B a multiple of M, room for every worker's
    one micro-batch, and --max-batch at least M."""
    m = args.micro_batch
    if args.mode != "bsp":
        raise ValueError(f"--micro-batch is for --mode bsp (ASP updates do not add up to one global batch), not --mode {args.mode}")
    if args.global_batch % m:
        raise ValueError(f"--global-batch {args.global_batch} is not a multiple of --micro-batch {m}; use "
                         f"{nearest_multiples(args.global_batch, m)}")
    if args.workers * m > args.global_batch:
        raise ValueError(f"--workers {args.workers} x --micro-batch {m} exceeds --global-batch {args.global_batch}")
    if args.max_batch is not None and args.max_batch < m:
        raise ValueError(f"--max-batch {args.max_batch} is below --micro-batch {m}")


def adaptive_config(args: argparse.Namespace) -> AdaptiveConfig | None:
    """--adaptive-batch and its bounds, checked against the job's other flags (ValueError naming them);
    None when it is off."""
    given = [f for f, v, default in (("--min-global-batch", args.min_global_batch, None),
                                     ("--max-global-batch", args.max_global_batch, None),
                                     ("--adapt-every", args.adapt_every, DECIDE_EVERY),
                                     ("--adapt-threshold", args.adapt_threshold, ADAPT_THRESHOLD),
                                     ("--lr-scaling", args.lr_scaling, LR_SCALINGS[0])) if v != default]
    if args.adaptive_batch == "off":
        if given:
            raise ValueError(f"{given[0]} needs --adaptive-batch gns")
        return None
    if args.mode != "bsp":
        raise ValueError("--adaptive-batch gns is for --mode bsp: the noise scale is measured from a round's pushes, "
                         "and ASP has no rounds")
    if args.shards > 1:
        raise ValueError("--adaptive-batch gns runs with one server: not with --shards (each shard holds part of a gradient)")
    if args.micro_batch > 1:
        raise ValueError("--adaptive-batch gns does not run with --micro-batch: a new B would have to stay a multiple of "
                         "the micro-batch, which the adaptive choice does not keep")
    floor = args.workers * args.min_batch
    lower = floor if args.min_global_batch is None else args.min_global_batch
    upper = 8 * args.global_batch if args.max_global_batch is None else args.max_global_batch
    if lower < floor:
        raise ValueError(f"--min-global-batch {lower} is below --workers {args.workers} x --min-batch {args.min_batch}")
    return AdaptiveConfig(args.global_batch, lower, upper, args.adapt_threshold, args.lr_scaling)
