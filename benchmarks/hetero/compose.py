"""The heterogeneity benchmark's run in containers: the same job on docker-compose's CPU quotas.

``python -m benchmarks.hetero --controllers dynamic,dynamic_compose`` runs the job on the cgroup
emulator (:class:`deploy.launcher.LocalCluster`) and then in ``deploy/docker-compose.yml``'s
containers (:class:`deploy.compose_cluster.ComposeCluster`, host networking), both rendered from the
same profile at the same shares and CFS period, so their steady samples/s compare the two
renderings of one profile. The image is built from the working tree first (``deploy/engine.sh``).
"""

from __future__ import annotations

import time

from benchmarks.hetero.runs import Run
from benchmarks.hetero.settings import Emulation, Settings, log
from deploy.compose_env import container_limits, render_env


COMPOSE_SUFFIX = "_compose"
"""A run named ``<controller>_compose`` is that controller's run in containers."""


def compose_scale(s: Settings, emu: Emulation) -> float:
    """The profile's cores times this give the emulator's shares; ValueError where compose cannot match them."""
    allocation = s.profile.allocation(s.mode)
    scale = s.cpu_budget / sum(allocation.workers)
    limits = container_limits(s.profile, s.mode, scale)
    same_shares = all(abs(a - b) < 1e-9 for a, b in zip(limits.workers, emu.shares, strict=True))
    same_server = (limits.server is None) == (emu.server_share is None) and (
        limits.server is None or abs(limits.server - emu.server_share) < 1e-9  # type: ignore[operator]
    )
    if not (same_shares and same_server and limits.period_us == emu.period_us):
        raise ValueError(
            "the compose run takes the profile's shares and period as they are: leave out --server-share and "
            "--period-us"
        )
    return scale


def run_compose(s: Settings, emu: Emulation, name: str, controller: str, extra: list[str]) -> Run:
    """The job of ``s`` with ``controller`` in containers, to its end; its metrics as a :class:`Run`."""
    from deploy.compose_cluster import ComposeCluster, ComposeError, build_image, engine_problem

    scale = compose_scale(s, emu)
    problem = engine_problem()
    if problem is not None:
        raise RuntimeError(f"{name}: {problem}")
    log(f"{name}: building the image from the working tree (deploy/engine.sh) ...")
    build_image()
    workdir = s.workdir / "runs" / name
    workdir.mkdir(parents=True, exist_ok=True)
    env_file = workdir / "cluster.env"
    env_file.write_text(render_env(s.profile, s.mode, scale), encoding="utf-8")
    w = s.workload
    job = {"MODEL": w.model, "DATASET": w.dataset, "CONTROLLER": controller, "EPOCHS": str(s.epochs),
           "GLOBAL_BATCH": str(w.global_batch)}
    server_args = ["--seed", str(w.seed), "--lr", str(w.lr), "--momentum", str(w.momentum),
                   "--adjust-every", s.adjust_every, *s.server_args, *extra]
    for option in w.model_args:
        server_args += ["--model-arg", option]
    for option in w.dataset_args:
        server_args += ["--dataset-arg", option]
    run = Run(name)
    started = time.monotonic()
    log(f"{name}: docker compose up ({s.mode}, {controller}), CPU quotas per {emu.period_us} us ...")
    try:
        with ComposeCluster(env_file, workdir, job=job, server_args=server_args) as cluster:
            cluster.up()
            result = cluster.wait(timeout=s.run_timeout)
    except ComposeError as exc:
        raise RuntimeError(f"{name}: {exc}") from exc
    failed = {svc: end for svc, end in result.containers.items() if (end.exit_code, end.restarts) != (0, 0)}
    if failed or not result.of_kind("summary"):
        raise RuntimeError(f"{name}: the cluster did not end cleanly ({failed or 'no summary'}); logs: {workdir}")
    (summary,) = result.of_kind("summary")
    log(f"{name}: done: {summary['samples_per_s']} samples/s overall, accuracy {summary['accuracy']}")
    run.events = result.events
    run.wall_s = round(time.monotonic() - started, 2)
    run.limiting = f"docker cpu_quota per {emu.period_us} us"
    return run
