"""ps-server's job built from its parsed flags: the flags checked against each other, the model, data,
batch policy, coordinator, shards and checkpoints made, and a resume's checkpoint loaded, so that
ps/server.py only serves what this returns (and the tests build a job without a process)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import Any, cast
from pathlib import Path

import torch

from common.job.batchnorm import batchnorm_layers
from common.job.datasets import TrainingData, build_dataset
from common.job.models import build_model, check_takes
from common.job.splits import sample_batch
from common.job.spec import JobSpec, default_balance
from common.ops.available_memory import available_cpu_bytes
from common.params.norm_clip import NormLimits
from ps.checkpoint import Checkpointer, check_no_other_job
from ps.control.config import PolicyConfig
from ps.control.global_batch.goodput import MIN_STEPS_PER_EPOCH, epoch_bound
from ps.control.policy import build_policy
from ps.control.registry import policy_class
from ps.ops.metrics import MetricsLog
from ps.ops.progress import progress_echo
from ps.rounds.adaptive_batch import AdaptiveSettings
from ps.rounds.asp import AspSettings
from ps.rounds.checkpoint_state import describe_resume_changes
from ps.rounds.coordinator import Coordinator
from ps.rounds.deadlines import Limits
from ps.rounds.evaluator import BackgroundEvaluator
from ps.rounds.fast_path import PARKING_OFF
from ps.rounds.rendezvous import Rendezvous
from ps.rounds.resume import NOT_LOADABLE, ResumeSearch, checkpoint_failed
from ps.flag_checks import check_flags_together, check_paths_together, may_take_fast_path, parse_shard_addresses
from ps.server_flags import (adaptive_config, describe_policy_changes, parse_options, policy_options,
                             settle_min_batch)
from ps.serving.call_budget import CallBounds, calls_for_workers
from ps.shards.client import RemoteShards
from ps.shards.processes import LocalShards
from ps.shards.flags import read_shard_ca
from ps.shards.setup import open_shards


@dataclass
class Job:
    """A built job: what ps-server serves and closes at its end."""

    spec: JobSpec
    coordinator: Coordinator
    evaluator: BackgroundEvaluator
    metrics: MetricsLog
    checkpointer: Checkpointer | None = None
    rendezvous: Rendezvous | None = None
    local_shards: LocalShards | None = None
    calls: CallBounds | None = None  # the calls held at once, by kind and peer (None: the default for --workers)

    def close_shards(self) -> None:
        """Stop the shard processes this server started (if any)."""
        if self.local_shards is not None:
            self.local_shards.stop()
            self.local_shards = None

    def final_checkpoint(self) -> Path | None:
        """Checkpoint at shutdown (after any queued write)."""
        if self.checkpointer is None:
            return None
        return self.checkpointer.save(self.coordinator.checkpoint_state(), self.coordinator.step)


def build_job(args: argparse.Namespace) -> Job:
    """Validate every argument and build the job; raises ValueError with one clear message."""
    allreduce = args.allreduce == "on"
    check_paths_together(args)  # again in check_flags_together, which the launchers run: here before the data loads
    shard_addresses = parse_shard_addresses(args)  # first: a --shard-addresses list sets args.shards
    read_shard_ca(args)  # a file that cannot be read: refused before the data loads and a shard starts
    may_switch = may_take_fast_path(args, args.shards)
    # the model first: one with BatchNorm sets --min-batch's default (server_flags.settle_min_batch)
    dataset = build_dataset(args.dataset, parse_options(args.dataset_arg), args.seed, memory_bytes=available_cpu_bytes())
    model = build_model(args.model, dataset.input_shape, dataset.num_classes, parse_options(args.model_arg), args.seed, memory_bytes=available_cpu_bytes())
    samples = len(cast(Sized, dataset.train))  # a factory's split is Sized (Splits checks)
    check_takes(model, args.model, sample_batch(dataset.train, list(range(min(2, samples))))[0], dataset.num_classes)
    settle_min_batch(args, bool(batchnorm_layers(model)))
    check_flags_together(args)
    check_fits_training_set(args.global_batch, args.workers, samples)
    check_adaptive_epoch(args, samples)
    calls = CallBounds.serving(args.max_concurrent_rpcs or calls_for_workers(args.max_workers or args.workers),
                               args.max_rpcs_per_peer)
    spec = JobSpec(
        mode=args.mode,
        workers=args.workers,
        model=args.model,
        model_options=parse_options(args.model_arg),
        dataset=args.dataset,
        dataset_options=parse_options(args.dataset_arg),
        global_batch=args.global_batch,
        optimizer=args.optimizer,
        lr=args.lr,
        momentum=args.momentum,
        weight_decay=args.weight_decay,
        nesterov=args.nesterov,
        lr_milestones=args.lr_milestones,
        lr_gamma=args.lr_gamma,
        epochs=args.epochs,
        seed=args.seed,
        wire_dtype=args.wire_dtype,
        lr_scaling=not args.no_lr_scaling,
        allreduce=allreduce,
        allreduce_algorithm=args.allreduce_algorithm,
        balance=default_balance(args.mode, args.shards) if args.balance == "auto" else args.balance,
        micro_batch=args.micro_batch,
        overlap=args.overlap,
        sampling=args.sampling,
        gradient_norms=args.adaptive_batch != "off",
    )
    config = PolicyConfig(
        policy=args.policy,
        global_batch=args.global_batch,
        deadband=args.deadband,
        min_batch=args.min_batch,
        max_batch=args.max_batch,
        ewma_alpha=args.ewma_alpha,
        keep_global_sum=args.mode == "bsp",
        dynamic_start=args.dynamic_start,
        park=args.park and args.mode == "bsp" and not allreduce,
        break_even=args.adaptive_batch != "off",
        micro_batch=args.micro_batch,
        options=policy_options(args),
    )
    checkpoint_dir = args.checkpoint_dir or args.resume
    if checkpoint_dir is not None:
        check_no_other_job(checkpoint_dir, args.resume)
    numel = sum(p.numel() for p in model.parameters())
    search = ResumeSearch(args.resume, spec, numel) if args.resume is not None else None
    resume_from = search.next() if search is not None else None
    eval_model = build_model(spec.model, dataset.input_shape, dataset.num_classes, spec.model_options, spec.seed)
    try:
        metrics = MetricsLog(args.metrics_log, echo=None if args.quiet else progress_echo(spec.epochs))
    except OSError as exc:
        raise OSError(f"--metrics-log {args.metrics_log}: cannot write there ({exc.strerror or exc})") from None
    if allreduce and args.park and policy_class(args.policy).parks:
        metrics.write("parking", on=False, why=PARKING_OFF)
        print(f"ps-server: note: parking is off: {PARKING_OFF}", file=sys.stderr)
    evaluator = BackgroundEvaluator(eval_model, dataset, bn_batch=bn_batch(spec), seed=spec.seed,
                                    every=args.eval_every.every, per_epoch=args.eval_every.per_epoch)
    checkpointer = Checkpointer(checkpoint_dir, args.keep_checkpoints, checkpoint_failed(metrics)) if checkpoint_dir else None
    rendezvous = Rendezvous() if allreduce else None  # the group's store: served by the Rendezvous RPC
    fast_path_on_gpus = Rendezvous if may_switch else None
    if search is not None:  # the files skipped so far, as events
        search.report_to(metrics)
    if args.shards > numel:
        raise ValueError(f"--shards {args.shards} exceeds the model's {numel} parameters")
    local_shards, shards = open_shards(args, shard_addresses, numel)
    try:
        while True:  # a checkpoint that passes its checks but does not load is skipped like a corrupt one: the next older
            coordinator = build_coordinator(args, spec, config, model, dataset, metrics, evaluator, checkpointer,
                                            rendezvous, shards, fast_path_on_gpus)
            if resume_from is None or search is None:
                break
            path, state, job_changes = resume_from
            check_resumed_batch(args, state, samples)  # before the restore records the resume
            try:
                changes = coordinator.restore(state)
                break
            except NOT_LOADABLE as exc:
                search.skip(path, exc)
                resume_from = search.next()
        if resume_from is not None:
            print(f"ps-server: resuming from {path} (epoch {coordinator.epoch}, step {coordinator.step})", file=sys.stderr)
            if job_changes:
                print(f"ps-server: warning: the job's settings differ from the checkpoint's ({describe_resume_changes(job_changes)}); "
                      "the command line's apply", file=sys.stderr, flush=True)
            if changes:
                print(f"ps-server: warning: {describe_policy_changes(changes)}", file=sys.stderr, flush=True)
    except BaseException:
        if local_shards is not None:
            local_shards.stop()
        raise
    return Job(spec, coordinator, evaluator, metrics, checkpointer, rendezvous, local_shards, calls)


def check_fits_training_set(global_batch: int, workers: int, samples: int) -> None:
    """--global-batch at most the training set's `samples` (a ValueError naming the flags otherwise): a
    larger B trains some samples twice in one step, ends several epochs at that step, and can ask more
    of the job's last epoch than is left, so that workers are told smaller batches than the plan's."""
    if global_batch <= samples:
        return
    if workers > samples:
        raise ValueError(f"--global-batch {global_batch} exceeds the training set's {samples} samples, and no global "
                         f"batch can give --workers {workers} a sample each within them: use a larger dataset or "
                         f"--workers {samples} or fewer")
    raise ValueError(f"--global-batch {global_batch} exceeds the training set's {samples} samples (a step would train "
                     f"samples more than once and end epochs together): use --global-batch {samples} or less, or a "
                     "larger dataset")


def check_resumed_batch(args: argparse.Namespace, checkpoint: dict[str, Any], samples: int) -> None:
    """The B an --adaptive-batch gns resume goes on at, the checkpoint's (its `adaptive` decider's
    `batch`), at most the training set's `samples`, as check_fits_training_set holds --global-batch,
    and at least --workers x --min-batch, as check_flags_together holds it (else no worker past the B-th
    could join, and the job would wait for them): ValueError naming both otherwise. A state the
    restore would refuse is left to it."""
    saved = checkpoint.get("adaptive") if args.adaptive_batch != "off" else None
    decider = saved.get("decider") if isinstance(saved, dict) else None
    batch = decider.get("batch") if isinstance(decider, dict) else None
    if not isinstance(batch, int) or isinstance(batch, bool):
        return
    if batch < args.workers * args.min_batch:
        raise ValueError(f"--resume {args.resume}: the checkpoint's adaptive global batch B = {batch} cannot give "
                         f"--workers {args.workers} x --min-batch {args.min_batch} their minimum batches: resume "
                         f"with a lower --min-batch, or without --adaptive-batch gns to restart at --global-batch "
                         f"{args.global_batch}")
    if batch > samples:
        raise ValueError(f"--resume {args.resume}: the checkpoint's adaptive global batch B = {batch} exceeds the "
                         f"training set's {samples} samples (the data holds fewer since it was written): restore "
                         f"the training set, or resume without --adaptive-batch gns to restart at --global-batch "
                         f"{args.global_batch}")


def bn_batch(spec: JobSpec) -> int:
    """The batch the server recomputes BatchNorm statistics over (common/job/batchnorm.py): the micro-batch,
    else a uniform split's batch B/n."""
    return spec.micro_batch if spec.micro_batch > 1 else max(1, spec.global_batch // spec.workers)


def build_coordinator(args: argparse.Namespace, spec: JobSpec, config: PolicyConfig, model: torch.nn.Module,
                      dataset: TrainingData, metrics: MetricsLog, evaluator: BackgroundEvaluator,
                      checkpointer: Checkpointer | None, rendezvous: Rendezvous | None,
                      shards: RemoteShards | None, fast_path_on_gpus: Callable[[], Rendezvous] | None = None) -> Coordinator:
    return Coordinator(
        spec,
        build_policy(config),
        model,
        dataset,
        adjust_every=args.adjust_every,
        asp=AspSettings(args.max_staleness, args.staleness_bound, args.staleness_lr),
        adaptive=AdaptiveSettings(adaptive_config(args), args.adapt_every),
        max_workers=args.max_workers,
        evict_after=args.evict_after,
        checkpoint_every=args.checkpoint_every,
        on_checkpoint=checkpointer.save_async if checkpointer else None,
        metrics=metrics,
        evaluator=evaluator,
        rendezvous=rendezvous,
        shards=shards,
        fast_path_on_gpus=fast_path_on_gpus,
        limits=Limits(args.round_deadline, args.round_deadline_floor, args.push_idle, args.join_wait,
                      args.push_buffer_mib << 20, warmup_s=args.round_warmup, admit_wait_s=args.push_admit_wait),
        norms=NormLimits(args.max_update_norm, args.clip_outliers),
    )


def check_adaptive_epoch(args: argparse.Namespace, train_samples: int) -> None:
    """--adaptive-batch gns against the training set's size: ValueError where its smallest B leaves an
    epoch fewer than MIN_STEPS_PER_EPOCH rounds, which no decision would choose (goodput.epoch_bound).
    A range of one B (min = max) is B held on purpose, φ measured at it, and passes."""
    config = adaptive_config(args)
    if config is None or config.min_batch == config.max_batch:
        return
    most = epoch_bound(config.max_batch, train_samples)
    if config.min_batch > most:
        smallest = (f"--min-global-batch {config.min_batch}" if args.min_global_batch is not None
                    else f"its smallest B, --workers {args.workers} x --min-batch {args.min_batch} = {config.min_batch},")
        raise ValueError(f"--adaptive-batch gns: {smallest} leaves no batch to choose from: an epoch of the training "
                         f"set's {train_samples} samples holds {MIN_STEPS_PER_EPOCH} rounds only up to B = {most}")
