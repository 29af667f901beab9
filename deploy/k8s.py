"""Kubernetes manifests from a profile: the same heterogeneity, enforced by the kubelet's cgroups.

``ps-cluster k8s --profile hl8`` renders, from the profile that also drives the cgroup emulator and
docker-compose:

* a Secret with the token every call carries (``PS_TOKEN``; generated, unless ``--token-secret``
  names an existing one);
* the parameter server as a StatefulSet of one pod with a volume for its checkpoints (a restarted
  pod resumes from the newest one), gRPC health probes (``grpc.health.v1``; TCP probes with TLS,
  which the kubelet's gRPC probes do not speak), and a Service for clients;
* a headless Service for the server pod's stable name, which the workers dial (the collective fast
  path's groups meet at the server's gRPC port too);
* one Job per worker, with the profile's CPU cores as its CPU request and limit (Guaranteed CPU)
  and its GPUs as ``nvidia.com/gpu`` limits, its settings in ``PS_*`` environment variables
  (worker/cli.py); a worker that fails is restarted, one that ends with the job completes (an early
  end too: ``PS_EARLY_END_STATUS`` 0);
* a NetworkPolicy that admits to the job's pods only traffic from the job's own pods (the server's
  gRPC port, the fast path's process group between workers); the kubelet's probes
  come from the node, which network plugins let through.

Everything here is pure: :func:`render` turns a :class:`K8sOptions` into manifest dicts.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from deploy.profiles import Profile, check_mode

APP = "hetero-ps"
CHECKPOINTS = "/var/lib/hetero-ps/checkpoints"
TLS_DIR = "/etc/hetero-ps/tls"
USER_ID = 1000
"""The image's unprivileged user (deploy/Dockerfile)."""
JOB_DEFAULTS = {"--model": "cnn", "--dataset": "synthetic", "--controller": "dynamic", "--epochs": "10",
                "--global-batch": "512"}
"""The job when ``--server-arg`` does not say otherwise: docker-compose.yml's defaults."""
SET_HERE = ("--mode", "--workers", "--host", "--port", "--port-file", "--checkpoint-dir", "--resume", "--tls-cert",
            "--tls-key", "--token")
"""ps-server flags the manifests set from the profile and the command's own options."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
_RESOURCE_NAME = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                            r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
# distribution/reference's grammar: [domain[:port]/]path[:tag][@digest], lower-case path components
_DOMAIN = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)


def check_image(image: str) -> str:
    """``image`` if it is a valid image reference (``registry.example:5000/team/hetero-ps:1.0``), else ValueError."""
    if len(image) > 512 or not _IMAGE.fullmatch(image):
        raise ValueError(
            f"--image {image!r} is not an image reference: [REGISTRY[:PORT]/]NAME[:TAG][@DIGEST], "
            "the name in lower case (e.g. registry.example:5000/hetero-ps:0.1)"
        )
    return image


def check_name(value: str, what: str, limit: int = 40) -> str:
    """A DNS label (lower-case letters, digits, '-') short enough to prefix object names."""
    if len(value) > limit or not _DNS_LABEL.fullmatch(value):
        raise ValueError(f"{what} {value!r} must be a DNS label: lower-case letters, digits and '-', "
                         f"starting and ending with a letter or digit, at most {limit} characters")
    return value


def check_quantity(value: str, what: str) -> str:
    """A Kubernetes memory/storage quantity such as ``512Mi`` or ``4Gi``."""
    if not _QUANTITY.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a quantity such as 512Mi, 4Gi or 1G")
    return value


def check_resource_name(value: str) -> str:
    """An extended resource name such as ``nvidia.com/gpu``."""
    if not _RESOURCE_NAME.fullmatch(value) or len(value) > 253:
        raise ValueError(f"--gpu-resource {value!r} is not a resource name such as nvidia.com/gpu")
    return value


MIN_CORES = 0.01
"""The smallest CPU limit that means what it says: the kubelet's quota floor is 1 ms of its 100 ms period."""


def cpu_quantity(cores: float) -> str:
    """Cores as a CPU quantity: whole cores as such, else millicores (``187m``)."""
    if not math.isfinite(cores) or cores < MIN_CORES:
        raise ValueError(f"a container would get {cores:.4g} cores; the kubelet enforces no less than {MIN_CORES:g} "
                         "(1 ms of its 100 ms CFS period): raise --scale")
    millis = round(cores * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


@dataclass(frozen=True)
class K8sOptions:
    """What the manifests are made of, besides the profile."""

    profile: Profile
    mode: str = "bsp"
    scale: float = 1.0
    image: str = "hetero-ps:local"
    name: str = APP
    namespace: str | None = None
    port: int = 50051
    server_args: Sequence[str] = ()
    checkpoint_size: str = "1Gi"
    storage_class: str | None = None
    memory: str | None = None
    gpu_resource: str = "nvidia.com/gpu"
    tls_secret: str | None = None
    token_secret: str | None = None
    token: str = field(default_factory=lambda: secrets.token_hex(16))


def _meta(o: K8sOptions, name: str, component: str, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {**_selector(o, component), **labels}}
    if o.namespace:
        meta["namespace"] = o.namespace
    return meta


def _selector(o: K8sOptions, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": o.name, "app.kubernetes.io/component": component}


def _token_env(o: K8sOptions) -> dict[str, Any]:
    secret = o.token_secret or f"{o.name}-token"
    return {"name": "PS_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}}


def _tls_volume(o: K8sOptions, items: Sequence[str]) -> dict[str, Any]:
    return {"name": "tls", "secret": {"secretName": o.tls_secret, "items": [{"key": k, "path": k} for k in items]}}


def _resources(cores: float | None, memory: str | None, gpus: int = 0, gpu_resource: str = "") -> dict[str, Any]:
    """Requests equal to limits, so the pod's CPU quota is the profile's share (Guaranteed QoS with memory)."""
    limits: dict[str, str] = {}
    if cores is not None:
        limits["cpu"] = cpu_quantity(cores)
    if memory is not None:
        limits["memory"] = memory
    if gpus:
        limits[gpu_resource] = str(gpus)
    return {"requests": dict(limits), "limits": limits} if limits else {}


def _security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": USER_ID, "runAsGroup": USER_ID, "fsGroup": USER_ID}


def server_address(o: K8sOptions) -> str:
    """What the workers dial: the server pod's stable name through the headless Service."""
    return f"{o.name}-server-0.{o.name}-rendezvous:{o.port}"


def server_command(o: K8sOptions, job_args: Sequence[str]) -> list[str]:
    """ps-server's command: resume from the newest checkpoint when the volume holds one (a
    restarted pod), else start the job with the volume as its checkpoint folder."""
    args = ["--mode", check_mode(o.mode), "--workers", str(len(o.profile.allocation(o.mode).workers)),
            "--host", "0.0.0.0", "--port", str(o.port), *job_args]
    if o.tls_secret:
        args += ["--tls-cert", f"{TLS_DIR}/tls.crt", "--tls-key", f"{TLS_DIR}/tls.key"]
    script = (f'if ls {CHECKPOINTS}/ckpt-*.pt >/dev/null 2>&1; then exec ps-server --resume {CHECKPOINTS} "$@"; '
              f'else exec ps-server --checkpoint-dir {CHECKPOINTS} "$@"; fi')
    return ["sh", "-c", script, "ps-server", *args]


def _probe(o: K8sOptions, **timing: int) -> dict[str, Any]:
    # the kubelet's gRPC probe speaks plaintext only: with TLS, whether the port accepts connections
    check: dict[str, Any] = {"tcpSocket": {"port": "grpc"}} if o.tls_secret else {"grpc": {"port": o.port}}
    return {**check, **timing}


def network_policy(o: K8sOptions) -> dict[str, Any]:
    """Ingress to every pod of this job only from pods of this job (its name and instance labels)."""
    job_pods = {"matchLabels": {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": o.name}}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(o, f"{o.name}-job-only", "network"),
        "spec": {"podSelector": job_pods, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": job_pods}]}]},
    }


def secret(o: K8sOptions) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(o, f"{o.name}-token", "auth"),
            "type": "Opaque", "stringData": {"token": o.token}}


def server_service(o: K8sOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(o, f"{o.name}-server", "server"),
        "spec": {"selector": _selector(o, "server"),
                 "ports": [{"name": "grpc", "port": o.port, "targetPort": "grpc", "appProtocol": "grpc"}]},
    }


def rendezvous_service(o: K8sOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(o, f"{o.name}-rendezvous", "server"),
        "spec": {
            "clusterIP": "None",
            # the name resolves before the server is ready: workers wait for the job on it
            "publishNotReadyAddresses": True,
            "selector": _selector(o, "server"),
            "ports": [{"name": "grpc", "port": o.port, "targetPort": "grpc"}],
        },
    }


def server_statefulset(o: K8sOptions, job_args: Sequence[str]) -> dict[str, Any]:
    allocation = o.profile.allocation(o.mode)
    cores = allocation.server * o.scale if o.mode == "asp" and allocation.server is not None else None
    container: dict[str, Any] = {
        "name": "ps-server",
        "image": o.image,
        "command": server_command(o, job_args),
        "ports": [{"name": "grpc", "containerPort": o.port}],
        "env": [_token_env(o)],
        "volumeMounts": [{"name": "checkpoints", "mountPath": CHECKPOINTS}],
        "startupProbe": _probe(o, periodSeconds=2, failureThreshold=90),
        "readinessProbe": _probe(o, periodSeconds=5),
        "livenessProbe": _probe(o, periodSeconds=10, failureThreshold=6),
    }
    resources = _resources(cores, o.memory)
    if resources:
        container["resources"] = resources
    volumes = []
    if o.tls_secret:
        container["volumeMounts"].append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        volumes.append(_tls_volume(o, ["tls.crt", "tls.key"]))
    claim: dict[str, Any] = {"metadata": {"name": "checkpoints"},
                             "spec": {"accessModes": ["ReadWriteOnce"],
                                      "resources": {"requests": {"storage": o.checkpoint_size}}}}
    if o.storage_class:
        claim["spec"]["storageClassName"] = o.storage_class
    pod: dict[str, Any] = {"securityContext": _security(), "containers": [container]}
    if volumes:
        pod["volumes"] = volumes
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(o, f"{o.name}-server", "server"),
        "spec": {
            "serviceName": f"{o.name}-rendezvous",
            "replicas": 1,
            "selector": {"matchLabels": _selector(o, "server")},
            "template": {"metadata": {"labels": _selector(o, "server")}, "spec": pod},
            "volumeClaimTemplates": [claim],
        },
    }


def worker_job(o: K8sOptions, index: int) -> dict[str, Any]:
    allocation = o.profile.allocation(o.mode)
    cores = allocation.workers[index] * o.scale
    gpus = allocation.gpus[index] if allocation.gpus is not None else 0
    name = f"w{index}"
    env = [
        {"name": "PS_SERVER", "value": server_address(o)},
        {"name": "PS_NAME", "value": name},
        {"name": "PS_CORES", "value": f"{cores:.6g}"},
        {"name": "PS_THREADS", "value": str(max(1, math.ceil(round(cores, 4))))},
        {"name": "PS_DEVICE", "value": "cuda" if gpus else "cpu"},
        # a job that ended early completes the worker's Job as a finished one does (restartPolicy OnFailure
        # would restart it on 3, to rejoin a server that ended the job); the server's exit status says it
        {"name": "PS_EARLY_END_STATUS", "value": "0"},
        _token_env(o),
    ]
    container: dict[str, Any] = {"name": "ps-worker", "image": o.image, "command": ["ps-worker"], "env": env,
                                 "resources": _resources(cores, o.memory, gpus, o.gpu_resource)}
    pod: dict[str, Any] = {"securityContext": _security(), "restartPolicy": "OnFailure", "containers": [container]}
    if o.tls_secret:
        env.append({"name": "PS_TLS_CA", "value": f"{TLS_DIR}/ca.crt"})
        container["volumeMounts"] = [{"name": "tls", "mountPath": TLS_DIR, "readOnly": True}]
        pod["volumes"] = [_tls_volume(o, ["ca.crt"])]
    labels = {**_selector(o, "worker"), "hetero-ps/worker": name}
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(o, f"{o.name}-worker{index}", "worker",
                                                                    **{"hetero-ps/worker": name}),
        "spec": {"backoffLimit": 6, "template": {"metadata": {"labels": labels}, "spec": pod}},
    }


def job_args(server_args: Sequence[str], given: set[str]) -> list[str]:
    """:data:`JOB_DEFAULTS` for the flags ``server_args`` does not give, then ``server_args``."""
    args = [item for flag, value in JOB_DEFAULTS.items() if flag not in given for item in (flag, value)]
    return [*args, *server_args]


def render(o: K8sOptions, job: Sequence[str]) -> list[dict[str, Any]]:
    """Every manifest, in the order ``kubectl apply`` should see them."""
    workers = len(o.profile.allocation(o.mode).workers)
    documents = [] if o.token_secret else [secret(o)]
    documents += [rendezvous_service(o), server_service(o), server_statefulset(o, job)]
    documents += [worker_job(o, k) for k in range(workers)]
    return [*documents, network_policy(o)]


def filename(document: dict[str, Any]) -> str:
    """``statefulset-hetero-ps-server.yaml``: one file per object."""
    return f"{document['kind'].lower()}-{document['metadata']['name']}.yaml"
