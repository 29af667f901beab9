"""Errors a service core raises (server or shard); the servicers map each to one gRPC status code."""


PUSH_IN_FLIGHT = "already has a push in flight"
"""What the server says of a worker's second push while its first is in flight (ps.rounds.inflight):
a worker that has just cancelled its first retries on it (worker.transport.cancelled_push)."""


class ServiceError(Exception):
    """A request the core refused; the message says what was expected."""


class InvalidArgument(ServiceError, ValueError):
    """Malformed input: wrong length, bad chunk order, non-finite values, bad sizes."""


class NotFound(ServiceError):
    """An unknown worker id."""


class FailedPrecondition(ServiceError):
    """A well-formed request that does not fit the server's state (wrong round, stale version, job full)."""


class AlreadyExists(ServiceError):
    """A name that an active worker already holds."""


class Unauthenticated(ServiceError):
    """A call as a worker that carries no secret."""


class PermissionDenied(ServiceError):
    """A call as a worker whose secret is not that worker's."""


class ResourceExhausted(ServiceError):
    """A request the server cannot take now, at one of its bounds (room for pushes, rejoins of a name);
    the message says when to try again."""
