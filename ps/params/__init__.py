"""The global parameters on a server: one flat fp32 store and its optimizer stepped a piece at a
time, the optimizer's state as a flat vector, batch-weighted aggregation of gradients, and
checkpoint files. No gRPC and no membership: the coordinator and the shard cores drive them. May
import ps.job, ps.transport and ps.errors."""
