"""The server's side of gRPC, shared by ps-server and the shard servers: handler registration that
refuses undecodable requests (handlers.py), the status code of each service error (status_codes.py),
reading a push's chunk stream (push_stream.py), the gRPC options, event loop and stop signals of a
server process (server_options.py), the per-worker secrets (worker_keys.py), and the blobs a shard's
range is loaded and fetched as (blob.py). May import common/ and protos, nothing else of ps/."""
