"""The coordinator, the one core the servicer talks to: membership and admission, BSP rounds and
ASP updates, epochs, evaluation and checkpoint state, and the collective fast path's rendezvous.
May import ps.control, ps.params, ps.shards, ps.job, ps.transport, ps.ops and ps.errors; never
protos (the servicer translates)."""
