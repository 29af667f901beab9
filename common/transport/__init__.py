"""The wire format and the gRPC plumbing, knowing nothing of rounds or policies: the model's flat
layout, the codec that moves flat vectors as chunks and the receivers that check them, a push kept
as the chunks it arrived in, messages built and read without copies, the values the cores exchange
with their transport (messages.py), the servicers' shared replies and handler registration, TLS
and tokens, what every server process shares. May import common.errors and protos only."""
