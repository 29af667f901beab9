"""The worker's side of the wire: the client and its channel (client.py, channel.py), a push's
buckets as chunks (bucket_stream.py), how far a streamed reply has come (arrivals.py), what the worker
checks of the server's replies before acting on them (server_checks.py), the heartbeat, waiting for
and rejoining a server (reconnect.py, backoff.py) and the retry after a cancelled bucket stream
(cancelled_push.py). The only room of the worker that knows gRPC and protos. May import common,
protos and worker.probes."""
