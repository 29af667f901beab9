"""The wire format, knowing nothing of rounds or policies: the model's flat layout, the codec that
moves flat vectors as chunks and the receivers that check them, a push kept as the chunks it arrived
in, messages built and read without copies, one plain type per message the server and the worker
exchange (messages.py) and the one boundary where they become protobuf messages and back
(proto_convert.py, and chunk_frames.py for the chunk messages), TLS and tokens (security.py), and a
server handler whose calls run inside a scope (handler_scope.py). May import
common.errors and protos only."""
