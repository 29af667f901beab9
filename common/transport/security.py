"""Transport security and authentication for `ps-server`: TLS / mutual TLS and a shared bearer token.

The token travels as call metadata (`authorization: Bearer <token>`) and is checked by a server
interceptor before any RPC reaches the servicer, so a refused call changes nothing (and is not counted
against the calls a server holds at once: ps/serving/call_limits.py). Health probes need no token; a
health Watch, which stays open, needs it beyond loopback. Without TLS the token crosses the network
in clear; `ps-server` warns about it. A server that listens beyond loopback with neither a token nor
mutual TLS lets anyone who reaches it join, read the model and push into it: it refuses to start
unless told that is intended (`--insecure`).
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import grpc

from common.transport.handler_scope import HandlerInterceptor, scoped

PathArg = str | os.PathLike[str]

TOKEN_ENV = "PS_TOKEN"
TOKEN_FILE_ENV = "PS_TOKEN_FILE"
"""A file that holds the token (a mounted secret: /run/secrets/..., a Kubernetes Secret volume), read
when neither --token nor $PS_TOKEN gives it."""
METADATA_KEY = "authorization"
SCHEME = "Bearer"
OPEN_SERVICES = ("grpc.health.v1.Health",)
"""Services every caller may use without the token: health probes (Kubernetes' `grpc:` probes,
load balancers, grpc_health_probe) carry no metadata. Reflection is not among them."""
_OPEN_PREFIXES = tuple(f"/{service}/" for service in OPEN_SERVICES)  # the start of their method paths
LOOPBACK_OPEN = ("/grpc.health.v1.Health/Watch",)
"""Open methods that hold a stream for as long as the caller likes: without the token, served to
callers on loopback only (probes ask Check, which answers at once)."""


def resolve_token(flag: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """The token from `--token`, else from $PS_TOKEN, else from the file $PS_TOKEN_FILE names (its
    text without the line end); None when none is set. ValueError if unusable.

    A token must be printable ASCII without spaces: it travels as a gRPC metadata value.
    """
    token: str | None
    if flag is not None:
        token, source = flag, "--token"
    else:
        token, source = secret_from_environment(env, TOKEN_ENV, TOKEN_FILE_ENV, "token")
    if token is None:
        return None
    if not token:
        raise ValueError(f"{source} is empty")
    if not all("!" <= c <= "~" for c in token):
        raise ValueError(f"{source} must be printable ASCII without spaces")
    return token


def secret_from_environment(env: Mapping[str, str], variable: str, file_variable: str,
                            what: str) -> tuple[str | None, str]:
    """A credential from $`variable`, else the text (without the line end) of the file $`file_variable`
    names (a mounted secret), and where it came from; (None, "") when neither is set. ValueError
    (one line) for a file that cannot be read."""
    if env.get(variable):
        return env[variable], f"${variable}"
    if not env.get(file_variable):
        return None, ""
    source = f"${file_variable} ({env[file_variable]})"
    try:
        return Path(env[file_variable]).read_text(encoding="ascii").strip(), source
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{source}: cannot read the {what} ({getattr(exc, 'strerror', None) or exc})") from None


def bearer(token: str) -> tuple[str, str]:
    """The metadata pair a client sends with every call."""
    return (METADATA_KEY, f"{SCHEME} {token}")


def read_pem(flag: str, path: PathArg) -> bytes:
    """The bytes of a PEM file named by `flag`; ValueError with one clear line if it is not one."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot read ({exc.strerror or exc})") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{flag} {path}: not a PEM file")
    return data


def server_credentials(cert: PathArg, key: PathArg, client_ca: PathArg | None = None) -> grpc.ServerCredentials:
    """TLS credentials from PEM files; with `client_ca`, clients must present a certificate it signed.

    Checks with the standard library that the certificate and key load and match, so a bad pair is
    an error at startup rather than a failed handshake later.
    """
    cert_pem, key_pem = read_pem("--tls-cert", cert), read_pem("--tls-key", key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as exc:
        raise ValueError(f"--tls-cert {cert} / --tls-key {key}: not a matching certificate and unencrypted private key ({exc.reason or exc})") from None
    ca_pem = None
    if client_ca is not None:
        ca_pem = read_pem("--tls-client-ca", client_ca)
        try:
            context.load_verify_locations(cafile=str(client_ca))
        except ssl.SSLError as exc:
            raise ValueError(f"--tls-client-ca {client_ca}: not a PEM CA certificate ({exc.reason or exc})") from None
    return grpc.ssl_server_credentials([(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=ca_pem is not None)


class MetadataCheck(HandlerInterceptor):
    """Refuses with UNAUTHENTICATED every RPC that `checks(method)` and whose metadata `_problem` finds
    fault with; a refused call is answered by a handler of the same kind that aborts at once (`refusal`)."""

    def checks(self, method: str) -> bool:
        raise NotImplementedError

    def _problem(self, metadata: Any) -> str | None:
        raise NotImplementedError

    def wrap(self, method: str, metadata: Any, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if not self.checks(method):
            return handler
        problem = self._problem(metadata)
        return handler if problem is None else self._refused(method, handler, problem)

    def _refused(self, method: str, handler: grpc.RpcMethodHandler, problem: str) -> grpc.RpcMethodHandler:
        """What answers a call of `method` whose metadata has `problem`: a refusal."""
        return refusal(handler, problem)


class TokenInterceptor(MetadataCheck):
    """Refuses every RPC whose `authorization` metadata is not `Bearer <token>` with UNAUTHENTICATED,
    but those of OPEN_SERVICES.

    A refused call is answered by a handler of the same kind that aborts at once: the servicer is
    never called and request streams are not read. The comparison runs in constant time. A method of
    LOOPBACK_OPEN without the token is served to callers on loopback and refused to the others.
    """

    def __init__(self, token: str) -> None:
        self._expected = token.encode()

    def checks(self, method: str) -> bool:
        return method in LOOPBACK_OPEN or not method.startswith(_OPEN_PREFIXES)

    def _refused(self, method: str, handler: grpc.RpcMethodHandler, problem: str) -> grpc.RpcMethodHandler:
        if method in LOOPBACK_OPEN:
            return scoped(handler, functools.partial(_loopback_only, f"{problem} (without it, {method} is served on loopback only)"))
        return refusal(handler, problem)

    def _problem(self, metadata: Any) -> str | None:
        values = [v for k, v in (metadata or ()) if k == METADATA_KEY]
        if not values:
            return f"no token: this server requires '{METADATA_KEY}: {SCHEME} <token>' metadata (ps-worker --token or ${TOKEN_ENV})"
        value = values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")
        scheme, _, presented = value.partition(" ")
        if len(values) != 1 or scheme.lower() != SCHEME.lower():
            return f"malformed '{METADATA_KEY}' metadata: expected exactly one '{SCHEME} <token>'"
        if not hmac.compare_digest(presented.strip().encode(errors="replace"), self._expected):
            return "invalid token"
        return None


@asynccontextmanager
async def _loopback_only(message: str, context: grpc.aio.ServicerContext, request: Any) -> AsyncIterator[Any]:
    """A scope (common/transport/handler_scope.py) that lets the call through from loopback only."""
    if not is_loopback(peer_host(context.peer())):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
    yield request


def refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s kind that answers UNAUTHENTICATED without touching the request."""

    async def abort(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


@dataclass(frozen=True)
class ServerSecurity:
    """What `serve()` needs: TLS credentials (None: plaintext) and the token (None: no check)."""

    credentials: grpc.ServerCredentials | None = None
    token: str | None = None
    mutual: bool = False

    @property
    def warning(self) -> str | None:
        if self.token is not None and self.credentials is None:
            return "a token without --tls-cert crosses the network in clear; use TLS outside a trusted network"
        return None

    @property
    def description(self) -> str:
        transport = "mutual TLS" if self.mutual else "TLS" if self.credentials is not None else "plaintext"
        return transport + (", token" if self.token is not None else "")

    def exposure_problem(self, host: str, insecure: bool) -> str | None:
        """Why listening on `host` as configured is refused (one line), None if it is not: beyond
        loopback, neither a token nor mutual TLS, and no `--insecure`."""
        if insecure or is_loopback(host) or self.token is not None or self.mutual:
            return None
        return (f"--host {host} listens beyond loopback without authentication: anyone who reaches it may join, read "
                f"the model and push into it; give a token (--token, ${TOKEN_ENV} or ${TOKEN_FILE_ENV}) or mutual TLS "
                "(--tls-client-ca), or --insecure if that is intended")

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        return [TokenInterceptor(self.token)] if self.token is not None else []

    def add_port(self, server: grpc.aio.Server, address: str) -> int:
        """Bind `address` (TLS when configured); returns the port. OSError with one line when it cannot
        (grpc raises a RuntimeError for a port in use or a host it cannot resolve, or returns 0)."""
        bound: int
        try:
            if self.credentials is None:
                bound = server.add_insecure_port(address)
            else:
                bound = server.add_secure_port(address, self.credentials)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address}: {str(exc).split(';')[0]}") from None
        if bound == 0:
            raise OSError(f"cannot listen on {address}")
        return bound


def peer_host(peer: str) -> str:
    """The address of a gRPC peer, without its port: "ipv4:10.0.0.2:5000" -> "10.0.0.2",
    "ipv6:[::1]:5000" -> "::1" (an IPv4-mapped one as its IPv4 address); a unix socket's peer, which is
    on this machine, -> "localhost"; anything else as it is."""
    scheme, _, rest = unquote(peer).partition(":")
    if scheme.startswith("unix"):
        return "localhost"
    if scheme not in ("ipv4", "ipv6"):
        return peer
    host = rest.rsplit(":", 1)[0].strip("[]")
    try:
        mapped = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(mapped, ipaddress.IPv6Address) and mapped.ipv4_mapped is not None:
        return str(mapped.ipv4_mapped)
    return host


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine's loopback only (127.0.0.0/8, ::1, localhost)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to any interface
        return False


def check_tls_pairs(cert: PathArg | None, key: PathArg | None, client_ca: PathArg | None) -> None:
    """The server's TLS flags given together as they must be (ValueError naming them); reads no file."""
    if (cert is None) != (key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if client_ca is not None and cert is None:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS runs over TLS)")


def load_server_security(
    cert: PathArg | None, key: PathArg | None, client_ca: PathArg | None, token_flag: str | None
) -> ServerSecurity:
    """Validate the server's security flags; ValueError with one clear line on any problem."""
    check_tls_pairs(cert, key, client_ca)
    token = resolve_token(token_flag)
    credentials = server_credentials(cert, key, client_ca) if cert is not None and key is not None else None
    return ServerSecurity(credentials, token, mutual=client_ca is not None)
