"""The server's side of gRPC, shared by ps-server and the shard servers: handler registration that
refuses undecodable requests, the servicers' status codes and reply streams, reading a push's chunk
stream, the gRPC options and event loop of a server process, the per-worker secrets, and the blobs
a shard's range is loaded and fetched as. May import common/ and protos, nothing else of ps/."""
