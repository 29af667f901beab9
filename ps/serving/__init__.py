"""The server's side of gRPC, shared by ps-server and the shard servers: handler registration that
refuses undecodable requests (handlers.py), the status code of each service error (status_codes.py),
reading a push's chunk stream (push_stream.py), the gRPC options, event loop and stop signals of a
server process (server_options.py), the calls a server holds at once by kind and peer (call_budget.py,
pure) and the interceptor that holds every call within them (call_limits.py), the per-worker secrets
(worker_keys.py), and the blobs a shard's range is loaded and fetched as (blob.py). May import
common/ and protos, nothing else of ps/."""
