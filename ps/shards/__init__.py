"""--shards: the flat parameters cut into contiguous ranges, each stepped on a shard server of its
own. The shard's core, its gRPC servicer and the ps-shard CLI, the coordinator's client for the
shard servers, the local shard processes, how ranges and optimizer state are cut and merged, and the
shards' flags' light parts (flags.py: their security checks, which the launchers run too, and the
defaults ps-shard's parser shows).
May import common.params, common.job, common.transport, ps.ops, common.errors and protos; never ps.rounds (the
coordinator drives the shards, not the other way)."""
