"""docker-compose cluster: the compose file, the generated env files, the Dockerfile, the CLI."""

from __future__ import annotations

import functools
import json
import re
import shlex
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import cli
from deploy.compose_env import DEPLOY_DIR, container_limits, env_filename, format_cpus, parse_env, render_env
from deploy.profiles import builtin_profiles, load_profile, quota_period_us
from tests.cluster_cli import run_cli

COMPOSE = DEPLOY_DIR / "docker-compose.yml"
HOST_OVERRIDE = DEPLOY_DIR / "docker-compose.host.yml"
HOST_ENV = DEPLOY_DIR / "host-network.env"
REPO = DEPLOY_DIR.parent
WORKERS = [f"worker{k}" for k in range(4)]
ENV_FILES = [(name, mode) for name in builtin_profiles() for mode in ("bsp", "asp")]
_VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:-|:\?)(?P<arg>[^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` substitution, recursively."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        if env.get(name):
            return env[name]
        if op == ":?":
            raise KeyError(f"{name}: {arg}")
        return arg if op == ":-" else ""

    return _VARIABLE.sub(substitute, value)


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def resolved(name: str, mode: str) -> dict[str, Any]:
    """The compose file with an env file's values substituted, as ``docker compose --env-file``."""
    env = parse_env((DEPLOY_DIR / env_filename(name, mode)).read_text(encoding="utf-8"))
    return interpolate(compose(), env)


def test_every_service_is_present() -> None:
    services = compose()["services"]
    assert set(services) == {"ps-server", *WORKERS}
    for service in services.values():
        assert service["image"] == "hetero-ps:local"
        assert service["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}


def test_commands() -> None:
    services = compose()["services"]
    server = shlex.split(services["ps-server"]["command"])
    assert server[0] == "ps-server"
    assert server[server.index("--workers") + 1] == "4"
    assert server[server.index("--port") + 1] == "${PS_PORT:-50051}"
    assert server[server.index("--host") + 1] == "${PS_HOST:-0.0.0.0}"
    for flag in ("--mode", "--model", "--dataset", "--controller", "--epochs", "--global-batch"):
        assert flag in server
    assert server[-1] == "${SERVER_ARGS:-}"
    for k, worker in enumerate(WORKERS):
        service = services[worker]
        assert service["command"] == "ps-worker"  # every setting from the environment (worker/cli.py ENVIRONMENT)
        env = service["environment"]
        assert env["PS_SERVER"] == "${PS_SERVER:-ps-server:50051}"
        assert env["PS_NAME"] == f"w{k}"
        assert env["PS_CORES"].startswith(f"${{W{k}_CPUS")
        assert env["PS_THREADS"] == f"${{W{k}_THREADS:-1}}"
        assert service["cpu_quota"].startswith(f"${{W{k}_CPU_QUOTA:?")
        assert service["cpu_period"].startswith("${CPU_PERIOD:?")
        assert "cpus" not in service  # docker refuses cpus beside cpu_period


def test_worker_environment_names_are_ps_workers() -> None:
    from common.transport.security import TOKEN_FILE_ENV
    from worker.flags import ENVIRONMENT

    for worker in WORKERS:
        assert set(compose()["services"][worker]["environment"]) <= {*ENVIRONMENT.values(), TOKEN_FILE_ENV}


def test_a_worker_restarted_on_failure_exits_0_after_an_early_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """restart: on-failure restarts a worker on any status but 0: one that exited 3 after an early end
    would rejoin a server that ended the job (and exits 3 itself), again and again."""
    from worker.flags import parse_args

    for worker in WORKERS:
        service = compose()["services"][worker]
        assert service["restart"] == "on-failure"
        monkeypatch.setenv("PS_EARLY_END_STATUS", service["environment"]["PS_EARLY_END_STATUS"])
        assert parse_args(["--server", "127.0.0.1:1"]).early_end_status == 0


def test_top_comment_documents_one_command_per_env_file() -> None:
    header = COMPOSE.read_text(encoding="utf-8").split("\nname:")[0]
    for name, mode in ENV_FILES:
        assert (
            f"docker compose -f deploy/docker-compose.yml --env-file deploy/{env_filename(name, mode)} up"
            in header
        )


@pytest.mark.parametrize(("name", "mode"), ENV_FILES)
def test_env_files_are_fresh(name: str, mode: str) -> None:
    committed = (DEPLOY_DIR / env_filename(name, mode)).read_text(encoding="utf-8")
    assert committed == render_env(load_profile(name), mode), (
        f"deploy/{env_filename(name, mode)} is stale: regenerate it with "
        f"ps-cluster compose-env --profile {name} --mode {mode} -o deploy/{env_filename(name, mode)}"
    )


def test_no_env_file_without_a_profile() -> None:
    expected = {env_filename(name, mode) for name, mode in ENV_FILES}
    assert {p.name for p in DEPLOY_DIR.glob("*.env")} == expected | {HOST_ENV.name}


@pytest.mark.parametrize(("name", "mode"), ENV_FILES)
def test_every_container_gets_the_profile_allocation(name: str, mode: str) -> None:
    services = resolved(name, mode)["services"]
    allocation = load_profile(name).allocation(mode)
    period = int(services["ps-server"]["cpu_period"])
    limited = [*allocation.workers, *([allocation.server] if allocation.server else [])]
    assert period == quota_period_us(limited) == 1000  # Table I's cores: a core or more each
    for worker, cores in zip(WORKERS, allocation.workers, strict=True):
        service = services[worker]
        assert int(service["cpu_period"]) == period
        assert int(service["cpu_quota"]) / period == pytest.approx(cores)
        assert float(service["environment"]["PS_CORES"]) == pytest.approx(cores)
        assert int(service["environment"]["PS_THREADS"]) >= 1
    server = shlex.split(services["ps-server"]["command"])
    assert server[server.index("--mode") + 1] == mode
    expected_server = allocation.server * period if allocation.server is not None else 0
    assert int(services["ps-server"]["cpu_quota"]) == expected_server


def test_a_small_share_gets_a_short_period() -> None:
    values = parse_env(render_env(load_profile("hl8"), "bsp", 1.5 / 48))
    assert values["CPU_PERIOD"] == "8000"  # 1 ms / (1/8 core): the design brief's period for HL8 on 2 cores
    assert [values[f"W{k}_CPU_QUOTA"] for k in range(4)] == ["1500", "1500", "1000", "8000"]
    limits = container_limits(load_profile("hl8"), "asp", 1.5 / 48)
    assert (limits.period_us, limits.quota_us(limits.server)) == (8000, 2000)  # type: ignore[arg-type]


def test_host_network_override() -> None:
    override = yaml.safe_load(HOST_OVERRIDE.read_text(encoding="utf-8"))["services"]
    assert set(override) == {"ps-server", *WORKERS}
    assert {s["network_mode"] for s in override.values()} == {"host"}
    host_env = parse_env(HOST_ENV.read_text(encoding="utf-8"))
    assert host_env == {"PS_HOST": "127.0.0.1", "PS_PORT": "50051"}
    merged = interpolate(override, {**parse_env((DEPLOY_DIR / "hl8.env").read_text(encoding="utf-8")), **host_env})
    for worker in WORKERS:
        assert merged[worker]["environment"]["PS_SERVER"] == "127.0.0.1:50051"
    assert merged["ps-server"]["labels"]["hetero-ps.listen"] == "127.0.0.1:50051"
    server = shlex.split(interpolate(compose(), host_env | parse_env((DEPLOY_DIR / "hl8.env").read_text()))
                         ["services"]["ps-server"]["command"])
    assert server[server.index("--host") + 1] == "127.0.0.1"  # loopback only, not every interface of the host
    with pytest.raises(KeyError, match="PS_HOST: with host networking pass --env-file deploy/host-network.env"):
        interpolate(override, {})


def test_missing_env_file_is_an_error_not_an_unlimited_worker() -> None:
    with pytest.raises(KeyError, match="W0_CPUS: pass an env file"):
        interpolate(compose()["services"]["worker0"], {})


def test_job_defaults() -> None:
    server = shlex.split(resolved("hl1", "bsp")["services"]["ps-server"]["command"])
    assert server[server.index("--host") + 1] == "0.0.0.0" and server[server.index("--port") + 1] == "50051"
    assert server[server.index("--model") + 1] == "cnn"
    assert server[server.index("--dataset") + 1] == "synthetic"
    assert server[server.index("--controller") + 1] == "dynamic"
    assert server[server.index("--epochs") + 1] == "10"
    assert server[server.index("--global-batch") + 1] == "512"


@functools.cache
def compose_schema() -> dict[str, Any]:
    """The compose specification's JSON schema, as vendored by check-jsonschema."""
    pytest.importorskip("check_jsonschema", reason="pip install check-jsonschema for the compose schema")
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads(vendor.joinpath("compose-spec.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(("name", "mode"), [(None, None), ("override", None), *ENV_FILES])
def test_compose_file_matches_the_compose_specification(name: str | None, mode: str | None) -> None:
    import jsonschema

    if name == "override":
        document = yaml.safe_load(HOST_OVERRIDE.read_text(encoding="utf-8"))
    else:
        document = compose() if name is None else resolved(name, mode)  # type: ignore[arg-type]
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]
    assert errors == []


def test_dockerfile_pins_torch_like_pyproject() -> None:
    dockerfile = (DEPLOY_DIR / "Dockerfile").read_text(encoding="utf-8")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    torch = next(d for d in pyproject["project"]["dependencies"] if d.startswith("torch"))
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", dockerfile, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", dockerfile, re.M)
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu$", dockerfile, re.M)
    assert re.search(r"^ARG TORCH_FIND_LINKS=$", dockerfile, re.M)
    assert dockerfile.count(f'"{torch}"') == 2  # from the wheel folder, then from the index
    assert "pip install --no-deps --no-build-isolation ." in dockerfile


@pytest.mark.parametrize(
    ("cores", "text"), [(6.0, "6"), (0.1875, "0.1875"), (1.0, "1"), (0.125, "0.125"), (2 / 3, "0.6667")]
)
def test_format_cpus(cores: float, text: str) -> None:
    assert format_cpus(cores) == text


def test_compose_env_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run_cli(capsys, "compose-env", "--profile", "hl8", "--mode", "asp")
    assert code == 0
    assert out == (DEPLOY_DIR / "hl8-asp.env").read_text(encoding="utf-8")
    target = tmp_path / "small.env"
    assert run_cli(capsys, "compose-env", "--profile", "hl8", "--scale", "0.03125", "-o", str(target))[0] == 0
    values = parse_env(target.read_text(encoding="utf-8"))
    assert [float(values[f"W{k}_CPUS"]) for k in range(4)] == [0.1875, 0.1875, 0.125, 1.0]
    assert [values[f"W{k}_THREADS"] for k in range(4)] == ["1"] * 4
    assert values["MODE"] == "bsp" and values["PS_CPU_QUOTA"] == "0" and values["CPU_PERIOD"] == "8000"
    assert "--scale 0.03125" in target.read_text(encoding="utf-8").splitlines()[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compose-env", "--profile", "hl3"], "unknown profile 'hl3'; known profiles: hl1, hl2, hl4, hl8"),
        (["compose-env", "--profile", "hl8", "--scale", "0"], "expected a number > 0"),
        (["compose-env", "--profile", "hl8", "--scale", "0.00001"], "over the kernel's 1 s limit; give the smallest worker at least 0.001 core (raise --scale)"),
        (["compose-env", "--profile", "hl8", "--mode", "ssp"], "invalid choice"),
        (["compose-env"], "--profile"),
        (["docker-schedule", "--schedule", "dynamic", "--dry-run"], "pass --every-seconds N"),
        (["docker-schedule", "--schedule", "hl8", "--every-seconds", "5", "--dry-run"], "'hl8' is a profile"),
        ([], "COMMAND"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    try:
        code: object
        code, out, err = run_cli(capsys, *argv)
    except SystemExit as exc:
        code, (out, err) = exc.code, capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("ps-cluster")
    assert message in err


def test_a_small_server_share_is_a_quota_not_written_as_no_limit(tmp_path: Path) -> None:
    path = tmp_path / "tiny-server.yaml"
    path.write_text("asp:\n  workers: [1, 1, 1, 1]\n  server: 0.5\n", encoding="utf-8")
    values = parse_env(render_env(load_profile(path), "asp", 0.01))
    # the server's 0.005 core sets the period: its quota is the kernel's 1 ms minimum, never 0 (no limit)
    assert (values["CPU_PERIOD"], values["PS_CPU_QUOTA"], values["W0_CPU_QUOTA"]) == ("200000", "1000", "2000")


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["compose-env"], ["docker-schedule"], ["list"]):
        with pytest.raises(SystemExit) as info:
            cli.main([*argv, "--help"])
        assert info.value.code == 0
    assert "docker-schedule" in capsys.readouterr().out


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "list")
    assert code == 0
    assert "hl8      asp: workers 4, 4, 4, 28, server 8 (HL 7)" in out
    assert "dynamic  every 5 epochs: hl1 -> hl2 -> hl4 -> hl8 -> hl8 -> hl4 -> hl2 -> hl1" in out


ENGINE = DEPLOY_DIR / "engine.sh"


def test_engine_script_parses_and_refuses_unknown_commands() -> None:
    import subprocess

    assert subprocess.run(["bash", "-n", str(ENGINE)], capture_output=True).returncode == 0
    done = subprocess.run([str(ENGINE), "bogus"], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "engine.sh: error: unknown command 'bogus' (all, engine, status)\n"
    usage = subprocess.run([str(ENGINE), "--help"], capture_output=True, text=True, timeout=30).stdout
    for needle in ("deploy/engine.sh engine", '"bridge": "none"', "debootstrap", "PS_TORCH_FIND_LINKS"):
        assert needle in usage
