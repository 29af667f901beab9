"""A worker's gRPC channel: TLS (mutual with a client certificate) and the token on every call."""

from __future__ import annotations

from typing import Any, NamedTuple

import grpc

from common.transport.security import PathArg, bearer, read_pem, resolve_token

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # a server that comes back is reached within seconds (gRPC's default backoff grows to 120 s)
    ("grpc.max_reconnect_backoff_ms", 2000),
]


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <token>` to every call made on the channel."""

    def __init__(self, token: str) -> None:
        self._pair = bearer(token)

    def _with_token(self, details: grpc.ClientCallDetails) -> _CallDetails:
        metadata = (*(details.metadata or ()), self._pair)
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            details.wait_for_ready, getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: grpc.ClientCallDetails, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: grpc.ClientCallDetails, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)


def channel_credentials(
    tls_ca: PathArg | None, tls_cert: PathArg | None = None, tls_key: PathArg | None = None
) -> grpc.ChannelCredentials | None:
    """TLS credentials trusting `tls_ca` (None: plaintext), with a client certificate for mutual TLS.

    Raises ValueError with one clear line for a missing or unreadable file or a bad combination.
    """
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if tls_ca is None:
        if tls_cert is not None:
            raise ValueError("--tls-cert/--tls-key need --tls-ca (the CA that signed the server's certificate)")
        return None
    ca = read_pem("--tls-ca", tls_ca)
    cert = read_pem("--tls-cert", tls_cert) if tls_cert is not None else None
    key = read_pem("--tls-key", tls_key) if tls_key is not None else None
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def open_channel(
    target: str,
    *,
    token: str | None = None,
    tls_ca: PathArg | None = None,
    tls_cert: PathArg | None = None,
    tls_key: PathArg | None = None,
) -> grpc.Channel:
    """A channel to `target`: TLS when `tls_ca` is given, the token on every call when given."""
    credentials = channel_credentials(tls_ca, tls_cert, tls_key)
    if token is not None:
        token = resolve_token(token)
    if credentials is None:
        channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    else:
        channel = grpc.secure_channel(target, credentials, options=CHANNEL_OPTIONS)
    if token is not None:
        channel = grpc.intercept_channel(channel, _TokenInterceptor(token))
    return channel
