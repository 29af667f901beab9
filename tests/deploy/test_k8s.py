"""Kubernetes manifests from the profiles: valid against the Kubernetes schemas, limits as in the profile."""

from __future__ import annotations

import shlex
import stat
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from deploy import k8s
from tests.cluster_cli import run_cli
from deploy.compose_env import DEPLOY_DIR
from deploy.profiles import builtin_profiles, load_profile
from deploy.server_args import server_parser
from worker import flags as worker_cli

VERSION = kubernetes_validate.latest_version()
CASES = [(name, mode) for name in builtin_profiles() for mode in ("bsp", "asp")]


def manifests(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    code, out, err = run_cli(capsys, "k8s", *argv)
    assert code == 0, err
    return list(yaml.safe_load_all(out))


def by_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in documents if d["kind"] == kind]


def cores(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def validate(document: dict[str, Any]) -> None:
    kubernetes_validate.validate(document, VERSION, strict=True)


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_every_manifest_validates_and_limits_match_the_profile(
    capsys: pytest.CaptureFixture[str], name: str, mode: str
) -> None:
    documents = manifests(capsys, "--profile", name, "--mode", mode, "--scale", "0.25")
    for document in documents:
        validate(document)
    assert [d["kind"] for d in documents] == ["Secret", "Service", "Service", "StatefulSet", *["Job"] * 4, "NetworkPolicy"]
    allocation = load_profile(name).allocation(mode)
    jobs = by_kind(documents, "Job")
    for k, (job, share) in enumerate(zip(jobs, allocation.workers, strict=True)):
        (container,) = job["spec"]["template"]["spec"]["containers"]
        resources = container["resources"]
        assert resources["requests"] == resources["limits"]  # the quota is the share, floor and cap
        assert cores(resources["limits"]["cpu"]) == pytest.approx(share * 0.25, abs=5e-4)
        env = env_of(container)
        assert (env["PS_NAME"], float(env["PS_CORES"]), env["PS_DEVICE"]) == (f"w{k}", pytest.approx(share * 0.25), "cpu")
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
        assert env["PS_EARLY_END_STATUS"] == "0"  # an early end completes the Job: OnFailure would restart it on 3
    (server,) = by_kind(documents, "StatefulSet")
    (container,) = server["spec"]["template"]["spec"]["containers"]
    if mode == "asp":
        assert cores(container["resources"]["limits"]["cpu"]) == allocation.server * 0.25  # type: ignore[operator]
    else:
        assert "resources" not in container  # BSP: the server is not limited, as in compose and the emulator


def test_table_i_cores_at_scale_1(capsys: pytest.CaptureFixture[str]) -> None:
    jobs = by_kind(manifests(capsys, "--profile", "hl8"), "Job")
    assert [j["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] for j in jobs] == [
        "6", "6", "4", "32"]
    small = by_kind(manifests(capsys, "--profile", "hl8", "--scale", str(1.5 / 48)), "Job")
    assert [j["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] for j in small] == [
        "188m", "188m", "125m", "1"]


def test_server_statefulset_services_and_probes(capsys: pytest.CaptureFixture[str]) -> None:
    documents = manifests(capsys)
    secret, headless, service, server, *_ = documents
    assert headless["metadata"]["name"] == "hetero-ps-rendezvous"
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == {"grpc": 50051}  # the fast path's store is on it
    assert service["spec"]["ports"][0]["port"] == 50051 and "clusterIP" not in service["spec"]
    spec = server["spec"]
    assert spec["serviceName"] == "hetero-ps-rendezvous" and spec["replicas"] == 1
    assert spec["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
    (container,) = spec["template"]["spec"]["containers"]
    assert container["volumeMounts"] == [{"name": "checkpoints", "mountPath": k8s.CHECKPOINTS}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": 50051}  # grpc.health.v1, the server's overall health
    assert env_of(container)["PS_TOKEN"] == {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "token"}}
    assert len(secret["stringData"]["token"]) == 32
    # every worker dials the server pod's stable name and carries the same token
    for job in by_kind(documents, "Job"):
        env = env_of(job["spec"]["template"]["spec"]["containers"][0])
        assert env["PS_SERVER"] == "hetero-ps-server-0.hetero-ps-rendezvous:50051"
        assert env["PS_TOKEN"] == env_of(container)["PS_TOKEN"]


def test_the_server_command_is_ps_servers_and_resumes_from_the_volume(capsys: pytest.CaptureFixture[str]) -> None:
    (server,) = by_kind(manifests(capsys, "--server-arg=--epochs 3 --lr 0.05"), "StatefulSet")
    command = server["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["sh", "-c"] and command[3] == "ps-server"
    args = command[4:]
    parsed = server_parser().parse_args(args)
    assert (parsed.mode, parsed.workers, parsed.host, parsed.port) == ("bsp", 4, "0.0.0.0", 50051)
    assert (parsed.epochs, parsed.lr, parsed.model, parsed.policy) == (3, 0.05, "cnn", "dynamic")
    assert args.count("--epochs") == 1  # a default the job gives is left out, not repeated
    script = command[2]
    assert f"--resume {k8s.CHECKPOINTS}" in script and f"--checkpoint-dir {k8s.CHECKPOINTS}" in script
    # the script picks the flag and passes the rest through: sh -c SCRIPT ps-server ARGS...
    assert shlex.split(script.split("then ")[1].split(";")[0]) == ["exec", "ps-server", "--resume", k8s.CHECKPOINTS, "$@"]


def test_job_defaults_are_the_compose_files() -> None:
    compose = yaml.safe_load((DEPLOY_DIR / "docker-compose.yml").read_text(encoding="utf-8"))
    command = compose["services"]["ps-server"]["command"]
    for flag, value in k8s.JOB_DEFAULTS.items():
        assert f"{flag} ${{" in command and f":-{value}}}" in command.split(flag, 1)[1].split()[0]


def test_every_job_exposes_the_grpc_port_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """The collective fast path's groups meet at the server's gRPC service: no port of their own."""
    for argv in ([], ["--server-arg=--allreduce on"], ["--mode", "asp"], ["--server-arg=--allreduce off"]):
        documents = manifests(capsys, *argv)
        headless, service, server = documents[1:4]
        assert [p["name"] for p in headless["spec"]["ports"]] == [p["name"] for p in service["spec"]["ports"]] == ["grpc"]
        assert [p["name"] for p in server["spec"]["template"]["spec"]["containers"][0]["ports"]] == ["grpc"]


def test_tls_token_secret_namespace_memory(capsys: pytest.CaptureFixture[str]) -> None:
    documents = manifests(capsys, "--tls-secret", "ps-tls", "--token-secret", "ps-token", "--namespace", "training",
                          "--memory", "4Gi", "--name", "exp1", "--checkpoint-size", "5Gi", "--storage-class", "fast")
    for document in documents:
        validate(document)
        assert document["metadata"]["namespace"] == "training"
        assert document["metadata"]["name"].startswith("exp1-")
    assert by_kind(documents, "Secret") == []  # the token comes from the existing Secret
    (server,) = by_kind(documents, "StatefulSet")
    pod = server["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["startupProbe"]["tcpSocket"] == {"port": "grpc"}  # the kubelet's gRPC probe has no TLS
    assert "--tls-cert" in container["command"] and "--tls-key" in container["command"]
    assert pod["volumes"][0]["secret"]["secretName"] == "ps-tls"
    assert env_of(container)["PS_TOKEN"]["secretKeyRef"]["name"] == "ps-token"
    assert container["resources"]["limits"] == {"memory": "4Gi"}
    assert server["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast"
    for job in by_kind(documents, "Job"):
        (worker,) = job["spec"]["template"]["spec"]["containers"]
        assert env_of(worker)["PS_TLS_CA"] == f"{k8s.TLS_DIR}/ca.crt"
        assert env_of(worker)["PS_SERVER"] == "exp1-server-0.exp1-rendezvous:50051"
        assert worker["resources"]["limits"]["memory"] == "4Gi"


def test_tls_paths_are_the_pods_and_not_read_here(capsys: pytest.CaptureFixture[str]) -> None:
    """The shards' TLS flags are checked together, but their files are the server pod's (the Secret's
    mount): none is read where the manifests are written."""
    documents = manifests(capsys, "--tls-secret", "ps-tls", "--server-arg", f"--shards 2 --shard-tls-ca {k8s.TLS_DIR}/tls.crt")
    (server,) = by_kind(documents, "StatefulSet")
    (container,) = server["spec"]["template"]["spec"]["containers"]
    assert f"{k8s.TLS_DIR}/tls.crt" in container["command"]


def test_gpus_from_the_profile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("bsp:\n  workers: [4, 4]\n  gpus: [0, 1]\n", encoding="utf-8")
    documents = manifests(capsys, "--profile", str(path))
    jobs = by_kind(documents, "Job")
    for document in documents:
        validate(document)
    cpu, gpu = (j["spec"]["template"]["spec"]["containers"][0] for j in jobs)
    assert "nvidia.com/gpu" not in cpu["resources"]["limits"] and env_of(cpu)["PS_DEVICE"] == "cpu"
    assert gpu["resources"]["limits"] == {"cpu": "4", "nvidia.com/gpu": "1"} and env_of(gpu)["PS_DEVICE"] == "cuda"
    other = by_kind(manifests(capsys, "--profile", str(path), "--gpu-resource", "amd.com/gpu"), "Job")
    assert other[1]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "1"


def test_worker_settings_are_ps_workers(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (job, *_) = by_kind(manifests(capsys, "--scale", "0.25"), "Job")
    env = env_of(job["spec"]["template"]["spec"]["containers"][0])
    assert set(env) <= {*worker_cli.ENVIRONMENT.values(), "PS_TOKEN"}
    for variable in worker_cli.ENVIRONMENT.values():
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        if isinstance(value, str):
            monkeypatch.setenv(variable, value)
    args = worker_cli.parse_args([])
    assert (args.server, args.name, args.cores, args.threads, args.device) == (
        "hetero-ps-server-0.hetero-ps-rendezvous:50051", "w0", 1.5, 2, "cpu")


def test_out_writes_one_file_per_object(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "k8s" / "hl8"
    code, stdout, err = run_cli(capsys, "k8s", "--profile", "hl8", "--out", str(out))
    assert (code, stdout) == (0, "")
    assert err == f"ps-cluster: wrote 9 manifests to {out}: kubectl apply -f {out}\n"
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted([
        "secret-hetero-ps-token.yaml", "service-hetero-ps-rendezvous.yaml", "service-hetero-ps-server.yaml",
        "statefulset-hetero-ps-server.yaml", *[f"job-hetero-ps-worker{k}.yaml" for k in range(4)],
        "networkpolicy-hetero-ps-job-only.yaml"])
    for path in out.iterdir():
        validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    assert stat.S_IMODE((out / "secret-hetero-ps-token.yaml").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--profile", "hl3"], "unknown profile 'hl3'; known profiles: hl1, hl2, hl4, hl8"),
        (["--image", "Hetero-PS:latest"], "--image 'Hetero-PS:latest' is not an image reference"),
        (["--image", "hetero ps"], "is not an image reference"),
        (["--image", ""], "is not an image reference"),
        (["--server-arg=--port 1"], "--server-arg --port is set by ps-cluster k8s"),
        (["--server-arg=--work 3"], "--server-arg --work (that is --workers) is set by ps-cluster k8s"),
        (["--server-arg=--lr nan"], "ps-server would refuse these arguments"),
        (["--mode", "asp", "--server-arg=--adaptive-batch gns"], "ps-server would refuse these arguments: --adaptive-batch gns is for --mode bsp"),
        (["--mode", "asp", "--server-arg=--allreduce on"], "ps-server would refuse these arguments: --allreduce is the BSP collective fast path"),
        (["--server-arg=--shards 2 --balance busy"], "ps-server would refuse these arguments: --balance busy is measured with one server only"),
        (["--server-arg=--allreduce off --allreduce-algorithm hub"], "ps-server would refuse these arguments: --allreduce-algorithm needs --allreduce"),
        (["--server-arg=--shard-addresses=10.0.0.7:50061,10.0.0.8"],
         "ps-server would refuse these arguments: --shard-addresses: expected HOST:PORT with a port in 1-65535, got '10.0.0.8'"),
        (["--server-arg=--shard-tls-ca=/etc/ca.crt"], "ps-server would refuse these arguments: --shard-tls-ca is for --shards"),
        (["--tls-secret", "ps-tls", "--server-arg=--shards 2"], "ps-server would refuse these arguments: --shards with TLS needs --shard-tls-ca"),
        (["--name", "Bad_Name"], "--name 'Bad_Name' must be a DNS label"),
        (["--namespace=-x"], "--namespace '-x' must be a DNS label"),
        (["--memory", "lots"], "--memory 'lots' is not a quantity"),
        (["--gpu-resource", "a b"], "--gpu-resource 'a b' is not a resource name"),
        (["--rendezvous-port", "29500"], "unrecognized arguments: --rendezvous-port 29500"),
        (["--port", "70000"], "expected a port in 1-65535"),
        (["--scale", "0.0001"], "the kubelet enforces no less than 0.01"),
        (["--profile", "dynamic"], "'dynamic' is a schedule"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str
) -> None:
    out = tmp_path / "out"
    code, stdout, err = run_cli(capsys, "k8s", *argv, "--out", str(out))
    assert (code, stdout) == (2, "")
    assert err.count("\n") == 1 and err.startswith("ps-cluster"), err
    assert message in err
    assert not out.exists()


def test_an_unwritable_out_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    code, stdout, err = run_cli(capsys, "k8s", "--out", str(blocker / "k8s"))
    assert (code, stdout) == (2, "")
    assert err == f"ps-cluster: error: --out {blocker / 'k8s'}: cannot write there (Not a directory)\n"


@pytest.mark.parametrize(
    "image",
    ["hetero-ps", "hetero-ps:0.1", "registry.example:5000/team/hetero-ps:0.1-cpu", "localhost/hetero_ps",
     "ghcr.io/a/b@sha256:" + "a" * 64, "Registry.Example/x:TAG"],
)
def test_image_references(image: str) -> None:
    assert k8s.check_image(image) == image


@pytest.mark.parametrize(("value", "quantity"), [(6.0, "6"), (0.1875, "188m"), (1.0, "1"), (0.125, "125m"), (2.5, "2500m")])
def test_cpu_quantity(value: float, quantity: str) -> None:
    assert k8s.cpu_quantity(value) == quantity
