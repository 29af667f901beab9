"""The flat parameters: one fp32 store and its optimizer stepped a piece at a time, the optimizer's
state as a flat vector, the hyperparameters each optimizer accepts, batch-weighted aggregation of
gradients and the bound on one push's norm (norm_clip.py). The server's coordinator and shard cores drive them; a worker on the collective fast path
steps a store of its own. No gRPC and no membership. May import common.job, common.transport,
common.errors and common.number_checks."""
