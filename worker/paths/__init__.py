"""The two paths a worker's step takes: the PS path's gradient pushed in buckets during backward
(overlap.py) and the reply taken in forward order during the next forward (forward_order.py); the
collective fast path's all-reduce (collective.py; its process group in process_group.py, the sum of a
bucket in bucket_sum.py), the store its groups meet at (group_store.py) and a regroup after a failed
one (regroup.py); ASP's optimizer on the worker (local_optimizer.py); and the parts a path needs,
built at the start and at a switch (path_parts.py). May import common, worker.transport and
worker.probes; never protos."""
