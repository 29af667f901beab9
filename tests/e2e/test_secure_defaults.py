"""Secure defaults: a server bound beyond loopback without authentication refuses to start unless told
(--insecure), the token can come from a mounted secret, the compose file and the Kubernetes manifests
carry a token from a secret and admit only the job's pods, and torch is one whose weights-only load
runs no code. Processes bind beyond loopback only to exit at once; no traffic leaves loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from common.transport.security import TOKEN_ENV, TOKEN_FILE_ENV, ServerSecurity, is_loopback, resolve_token
from deploy import k8s
from deploy.compose_cluster import ComposeCluster
from deploy.compose_env import DEPLOY_DIR
from deploy.profiles import load_profile
from tests.processes import ENV

REPO = DEPLOY_DIR.parent
JOB = ["--workers", "1", "--mode", "asp", "--epochs", "1", "--global-batch", "8", "--model-arg", "hidden=8",
       "--dataset", "synthetic", "--dataset-arg", "size=64", "--dataset-arg", "image_size=4"]


def server_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in ENV.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    return {**env, **extra}


def start_and_stop(tmp_path: Path, *flags: str, env: dict[str, str]) -> str:
    """ps-server with `flags` on a free port: wait until it listens, stop it; its output."""
    port_file = tmp_path / "port"
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "ps.server", "--port", "0", "--port-file", str(port_file), *JOB, *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    return out


def test_a_server_beyond_loopback_without_authentication_exits_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "ps.server", "--host", "0.0.0.0", "--port", "0", *JOB],
                          capture_output=True, text=True, env=server_env(), timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("ps-server: error: --host 0.0.0.0 listens beyond loopback without authentication")
    assert "--insecure" in line and "--token" in line


def test_it_starts_with_insecure_or_a_token_from_a_file(tmp_path: Path) -> None:
    out = start_and_stop(tmp_path, "--host", "0.0.0.0", "--insecure", env=server_env())
    assert "listening on 0.0.0.0:" in out and "plaintext)" in out.replace(", waiting", ")")
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    out = start_and_stop(tmp_path, "--host", "0.0.0.0", env=server_env(**{TOKEN_FILE_ENV: str(token_file)}))
    assert "plaintext, token" in out


def test_loopback_needs_no_flag_and_names_may_reach_anywhere() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "ps-server", ""))
    plain = ServerSecurity()
    assert plain.exposure_problem("127.0.0.5", insecure=False) is None
    assert plain.exposure_problem("ps-server", insecure=True) is None
    assert "--host ps-server listens beyond loopback" in (plain.exposure_problem("ps-server", insecure=False) or "")
    assert ServerSecurity(token="t").exposure_problem("0.0.0.0", insecure=False) is None
    assert ServerSecurity(mutual=True).exposure_problem("0.0.0.0", insecure=False) is None


def test_the_token_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc\n")
    assert resolve_token(None, {TOKEN_FILE_ENV: str(path)}) == "abc"
    assert resolve_token(None, {TOKEN_FILE_ENV: str(path), TOKEN_ENV: "env"}) == "env"  # the variable wins
    assert resolve_token("flag", {TOKEN_FILE_ENV: str(path)}) == "flag"
    with pytest.raises(ValueError, match=r"\$PS_TOKEN_FILE \(.*missing\): cannot read the token"):
        resolve_token(None, {TOKEN_FILE_ENV: str(tmp_path / "missing")})
    path.write_text("two words")
    with pytest.raises(ValueError, match="must be printable ASCII without spaces"):
        resolve_token(None, {TOKEN_FILE_ENV: str(path)})


def test_every_compose_service_reads_the_token_from_the_secret(tmp_path: Path) -> None:
    document = yaml.safe_load((DEPLOY_DIR / "docker-compose.yml").read_text(encoding="utf-8"))
    assert document["secrets"] == {"ps-token": {"environment": "PS_TOKEN"}}
    for name, service in document["services"].items():
        assert service["secrets"] == ["ps-token"], name
        assert service["environment"][TOKEN_FILE_ENV] == "/run/secrets/ps-token", name
        assert "PS_TOKEN" not in service["environment"] and "--token" not in str(service.get("command"))
    runs = [ComposeCluster(DEPLOY_DIR / "hl1.env", tmp_path / f"run{k}") for k in range(2)]
    tokens = [run.environment()["PS_TOKEN"] for run in runs]
    if not os.environ.get("PS_TOKEN"):
        assert tokens[0] != tokens[1] and all(len(t) == 32 for t in tokens)  # generated per run
    assert runs[0].environment()["PS_TOKEN"] == tokens[0]  # one token for every command of a run


def test_the_manifests_admit_only_the_jobs_pods() -> None:
    options = k8s.K8sOptions(load_profile("hl2"), namespace="team")
    documents = k8s.render(options, [])
    (policy,) = [d for d in documents if d["kind"] == "NetworkPolicy"]
    kubernetes_validate.validate(policy, kubernetes_validate.latest_version(), strict=True)
    selector: dict[str, Any] = policy["spec"]["podSelector"]["matchLabels"]
    assert policy["metadata"]["namespace"] == "team" and policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in documents if d["kind"] in ("StatefulSet", "Job")]
    assert len(pods) == 5 and all(selector.items() <= labels.items() for labels in pods)  # the server, 4 workers
    other = k8s.render(k8s.K8sOptions(load_profile("hl2"), name="other"), [])[-1]
    assert other["spec"]["podSelector"] != policy["spec"]["podSelector"]  # another job's pods are not admitted


def test_torch_is_pinned_to_a_safe_weights_only_load() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    (torch,) = [Requirement(d) for d in pyproject["project"]["dependencies"] if d.startswith("torch")]
    assert not torch.specifier.contains(Version("2.5.1")) and torch.specifier.contains(Version("2.6.0"))
