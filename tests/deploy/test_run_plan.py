"""``ps-cluster run``'s plan, resolved before anything starts (deploy/run_plan.py): the default
policy, a schedule's shares scaled alike, and a bad output folder, mixed server shares or ps-server
flags that do not go together (a malformed --shard-addresses entry, a shard TLS flag set ps-server
refuses) refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.tls_certs import Certs, certs  # noqa: F401 (a fixture)


def test_the_default_policy_is_auto_on_a_profile_and_on_a_schedule(tmp_path: Path) -> None:
    """Without --policy: the auto policy (ps-server's default), for fixed speeds and where a schedule
    changes them; a named one is kept either way, and is what the server is started with."""
    from deploy.emulator import RunConfig, resolve

    def policy(**config: object) -> str:
        plan = resolve(RunConfig(out=tmp_path / f"run{len(list(tmp_path.iterdir()))}", quick=True, **config))  # type: ignore[arg-type]
        args = plan.server_args
        assert args[args.index("--controller") + 1] == plan.config.policy
        return str(plan.config.policy)

    assert policy() == "auto"
    assert policy(schedule="dynamic") == "auto"
    assert policy(schedule="dynamic", policy="model") == "model"
    assert policy(policy="uniform") == "uniform"


def test_a_schedule_keeps_a_halved_worker_halved(tmp_path: Path) -> None:
    """ps-cluster run scales every phase of a schedule alike: the tenant's w3 gets half its HL8 quota;
    swap in epochs (--every-epochs 2) trains 2 epochs a phase."""
    from deploy.emulator import RunConfig, resolve

    plan = resolve(RunConfig(schedule="tenant", cpu_budget=1.5, mode="asp", out=tmp_path / "a"))
    assert [phase[3] for phase in plan.shares] == pytest.approx([1.05, 0.525, 1.05])
    assert plan.server_shares == pytest.approx([0.3] * 3)
    swap = resolve(RunConfig(schedule="swap", every_epochs=2, quick=True, cpu_budget=1.5, out=tmp_path / "b"))
    assert swap.epochs == 8 and swap.shares[1] == pytest.approx([0.1875, 0.1875, 1.0, 0.125])


def test_bad_output_folder_and_mixed_server_shares_are_refused_when_planned(tmp_path: Path) -> None:
    from deploy.emulator import RunConfig, resolve

    afile = tmp_path / "afile"
    afile.write_text("keep")
    with pytest.raises(ValueError, match="--out .*afile exists and is not a folder"):
        resolve(RunConfig(out=afile, quick=True))
    assert afile.read_text() == "keep"
    (tmp_path / "plain-asp.yaml").write_text("bsp:\n  workers: [6, 6, 4, 32]\nasp:\n  workers: [4, 4, 4, 28]\n")  # no server share
    (tmp_path / "mixed.yaml").write_text("kind: schedule\nevery_epochs: 1\nphases: [plain-asp.yaml, hl8]\n")
    with pytest.raises(ValueError, match="in asp every phase must give the server a share of cores, or none must: plain-asp give none"):
        resolve(RunConfig(schedule=str(tmp_path / "mixed.yaml"), mode="asp", out=tmp_path / "y"))
    assert not (tmp_path / "y").exists()
    assert resolve(RunConfig(schedule=str(tmp_path / "mixed.yaml"), mode="bsp", out=tmp_path / "y")).server_shares == [None, None]


@pytest.mark.parametrize(("config", "needle"), [
    ({"mode": "asp", "server_args": ["--adaptive-batch=gns"]}, "--adaptive-batch gns is for --mode bsp"),
    ({"server_args": ["--min-batch=200"]}, "--workers 4 x --min-batch 200 exceeds --global-batch 256"),
    ({"server_args": ["--staleness-bound=2"]}, "--staleness-bound and --staleness-lr are for --mode asp"),
    ({"mode": "asp", "server_args": ["--allreduce=on"]}, "--allreduce is the BSP collective fast path; it cannot run with --mode asp"),
    ({"server_args": ["--shards=2", "--balance=busy"]}, "--balance busy is measured with one server only"),
    ({"mode": "asp", "server_args": ["--shards=2"]}, "--shards serves BSP jobs without --allreduce"),
    ({"server_args": ["--balance=busy", "--allreduce-algorithm=hub"]}, "--allreduce-algorithm needs --allreduce (on, or auto"),
])
def test_server_flags_that_do_not_go_together_are_refused_when_planned(
        tmp_path: Path, config: dict[str, object], needle: str) -> None:
    """ps-server's checks of flags against each other run on the server's command line at planning, as
    its parser does: the error comes before any quota is set or process started."""
    from deploy.emulator import RunConfig, resolve

    with pytest.raises(ValueError, match="ps-server would refuse these arguments: ") as refused:
        resolve(RunConfig(out=tmp_path / "x", quick=True, **config))  # type: ignore[arg-type]
    assert needle in str(refused.value)
    assert not (tmp_path / "x").exists()


def test_a_run_that_ends_before_a_schedule_phase_starts_says_which_at_the_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from deploy import emulator

    monkeypatch.setattr(emulator.Emulation, "run", lambda self: {})
    emulator.run(emulator.RunConfig(schedule="swap", every_epochs=10, epochs=2, quick=True, out=tmp_path / "x"))
    err = capsys.readouterr().err
    assert err == ("ps-cluster: warning: --epochs 2 ends the job before phases 1 (hl8-swap), 2 (hl1), 3 (hl8) of "
                   "schedule swap (10 epochs a phase) start; --epochs 40 runs every phase\n")
    emulator.run(emulator.RunConfig(schedule="swap", every_epochs=10, epochs=31, quick=True, out=tmp_path / "x"))
    assert capsys.readouterr().err == ""


def test_the_phases_an_epoch_count_leaves_out_are_named() -> None:
    """Phase k of an epoch schedule starts after k intervals: a job that ends before is told which it misses;
    on the wall clock the schedule's end stops the job, so nothing is missed."""
    from deploy.profiles import load_schedule
    from deploy.run_plan import unreached

    dynamic = load_schedule("dynamic").every(epochs=10)
    assert unreached(dynamic, 80) is None and unreached(dynamic, 71) is None
    assert unreached(dynamic, 70) == ("--epochs 70 ends the job before phase 7 (hl1) of schedule dynamic (10 epochs "
                                      "a phase) start; --epochs 80 runs every phase")
    assert "before phases 1 (hl2), 2 (hl4), 3 (hl8)," in str(unreached(dynamic, 2))
    assert unreached(load_schedule("swap"), 1) is None


SHARD_FLAGS: list[tuple[Callable[[Certs], list[str]], str]] = [
    (lambda c: ["--shard-addresses=10.0.0.7"], "--shard-addresses: expected HOST:PORT with a port in 1-65535, got '10.0.0.7'"),
    (lambda c: ["--shard-addresses=10.0.0.7:50061,:50062"], "--shard-addresses: expected HOST:PORT, got ':50062'"),
    (lambda c: ["--shard-addresses=,"], "--shard-addresses lists no address"),
    (lambda c: ["--shards=3", "--shard-addresses=10.0.0.7:50061"],
     "--shards 3 disagrees with the 1 --shard-addresses (+1: this server)"),
    (lambda c: [f"--shard-tls-ca={c.ca}"], "--shard-tls-ca is for --shards or --shard-addresses"),
    (lambda c: ["--shards=2", f"--shard-tls-ca={c.ca}"], "--shard-tls-ca needs --tls-cert and --tls-key"),
    (lambda c: ["--shards=2", f"--tls-cert={c.server_cert}"], "--tls-cert and --tls-key go together"),
    (lambda c: ["--shards=2", f"--tls-cert={c.server_cert}", f"--tls-key={c.server_key}"],
     "--shards with TLS needs --shard-tls-ca"),
    (lambda c: ["--shards=2", f"--tls-cert={c.server_cert}", f"--tls-key={c.server_key}", f"--shard-tls-ca={c.ca}.gone"],
     "--shard-tls-ca {dir}/ca.crt.gone: cannot read (No such file or directory)"),
    (lambda c: ["--shards=2", f"--tls-cert={c.server_cert}.gone", f"--tls-key={c.server_key}", f"--shard-tls-ca={c.ca}"],
     "--tls-cert {dir}/server.crt.gone: cannot read (No such file or directory)"),
]
"""Shard flags ps-server refuses, built from the test certificates ({dir}: their folder), and the line it
refuses them with."""


@pytest.mark.parametrize(("flags", "needle"), SHARD_FLAGS)
def test_shard_flags_ps_server_refuses_are_refused_when_planned_in_its_words(
        tmp_path: Path, certs: Certs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        flags: Callable[[Certs], list[str]], needle: str) -> None:
    """A malformed --shard-addresses entry or a shard TLS flag set (a file that is not there, a certificate
    without its key) is refused at planning, before anything starts, with the line ps-server gives (and
    ps-server refuses it before it starts a shard)."""
    from deploy.emulator import RunConfig, resolve
    from ps.server import main as server_main
    from ps.shards import setup

    def no_shards(*args: object, **kwargs: object) -> None:
        raise AssertionError("ps-server started its shards before refusing")

    monkeypatch.setattr(setup, "LocalShards", no_shards)

    args = flags(certs)
    assert server_main(["--port", "0", "--quiet", *args]) == 2
    server_line = capsys.readouterr().err.strip()
    assert server_line.startswith("ps-server: error: ") and needle.format(dir=certs.ca.parent) in server_line, server_line
    with pytest.raises(ValueError) as refused:
        resolve(RunConfig(out=tmp_path / "x", quick=True, server_args=args))
    assert str(refused.value) == f"ps-server would refuse these arguments: {server_line.removeprefix('ps-server: error: ')}"
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("flag", "why"), [
    ("--workers=3", "--server-arg --workers is set by the emulator (one worker per worker of the profile)"),
    ("--port=5000", "--server-arg --port is set by the emulator (it picks a free port and tells the workers)"),
    ("--port-file=p", "--server-arg --port-file is set by the emulator (it picks a free port and tells the workers)"),
    ("--host=0.0.0.0", "--server-arg --host is set by the emulator (the server listens on loopback, beside its workers)"),
    ("--metrics-log=m.jsonl", "--server-arg --metrics-log is set by the emulator (metrics.jsonl in --out)"),
])
def test_a_flag_the_emulator_sets_is_refused_with_its_own_reason(tmp_path: Path, flag: str, why: str) -> None:
    """Each flag the emulator sets says why it does: --port's refusal does not speak of the profile's workers."""
    from deploy.emulator import RunConfig, resolve

    with pytest.raises(ValueError) as refused:
        resolve(RunConfig(out=tmp_path / "x", quick=True, server_args=[flag]))
    assert str(refused.value) == why
