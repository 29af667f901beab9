"""The worker's side of the wire: the client and its channel (client.py, channel.py), the error a refused
call raises (server_error.py), the Push and Pull calls opened on a channel (stream_calls.py), a push's
chunks in order (ordered_push.py) or in buckets (bucket_stream.py), a reply read into the worker's buffer
(reply_receiver.py), the deadline of every call (call_bounds.py) and of a reply's every message
(watchdog.py), the coordinator's and the shard servers' ranges of one call (shard_fanout.py), how
far a streamed reply has come (arrivals.py), what the worker checks of the server's replies before
acting on them (server_checks.py), the heartbeat, waiting for and rejoining a server (reconnect.py,
backoff.py) and the retry after a cancelled bucket stream (cancelled_push.py). The only room of the
worker that knows gRPC and protos. May import common, protos, worker.probes and worker.flags (the flag
names its messages cite)."""
