"""Transport benchmark: our push+pull against raw gRPC, torch RPC and gloo, on loopback, in one run.

``python -m benchmarks.transport --json`` measures, for flat models of ``--sizes`` float32 parameters
(default 1 M, 25 M, 100 M), every server in its own process:

- ``grpc_stream_echo``: a raw gRPC stream-stream echo (``benchmarks.echo``: bytes messages, no protobuf,
  the same ``grpc.aio`` server stack and channel options as ours) of the same bytes in 1 MiB chunks:
  the client streams the payload up, the server streams it back once it is all in. The ceiling for
  our transport. ``grpc_unary_echo`` (one message each way) where the payload fits the 8 MiB limit.
- ``torch_rpc``: ``torch.distributed.rpc`` (TensorPipe, 127.0.0.1) round trip of the same tensor, two
  processes (OmniLearn's transport): TensorPipe's defaults (may pick shared memory / CMA on one host)
  and ``torch_rpc_tcp`` (uv transport, basic channel: what two hosts or containers would use).
- ``ps_push_pull``: a real ``ps-server`` process (BSP, ``--momentum 0``, uniform batches, a job that
  cannot end mid-measure) serving ``flat_model`` (one parameter of exactly N values), driven by W
  client processes using ``worker.transport.client.PSClient`` (join, pull, then per step: push a random
  gradient for the open round and receive the new parameters), fp32 and bf16 on the wire. Each row
  has ``shards``: 1 is one server process; with ``--shards`` counts above 1 (default 1,2) the fp32 runs
  are repeated with ``ps-server --shards S`` (the server keeps range 0 and starts S-1 ``ps-shard``
  children; the workers push and pull every range in parallel), right after the matching 1-shard run,
  and ``ratio_to_one_shard`` compares them. ``report["shards"]["note"]`` says what the machine's
  CPU count means for those rows: clients, coordinator and shards all share it.
- ``gloo_allreduce``: ``torch.distributed.all_reduce`` (gloo) over 2 and 4 processes.
- ``server_overhead``: the server's per-step cost for a small model with 4 workers (see
  ``measure_overhead_inprocess`` and ``measure_overhead_outside``).

``--rounds R`` repeats the whole sweep R times; each row then reports the round with the median MB/s
and, for each ratio, the median of the R ratios taken within a round (``combine_rounds``), so a slow
spell of the shared machine moves both sides of a ratio.

Definitions: MB = 10^6 bytes. Round trips (echo, torch RPC, push+pull) count the bytes moved both
ways: MB/s = (bytes up + bytes down) / wall time, in the wire dtype. A multi-worker row's ``mb_per_s``
is the aggregate (all workers' bytes over the common window); ``mb_per_s_per_worker`` is their mean.
gloo rows report bus bandwidth, 2(n-1)/n * bytes / time (NCCL-tests' definition), and ``algbw_mb_per_s``
= bytes / time. ``params_per_s`` = parameters moved per second (up + down), so bf16 rows compare the
useful work with torch RPC's fp32. Ratios are taken against the same size in the same run.

Every process (servers, echo, clients, this one) calls ``common.ops.memory.tune_malloc`` first, as ``ps-server``,
``ps-shard`` and ``ps-worker`` do, so the ceiling and our path run with the same glibc malloc settings.

Progress goes to stderr; stdout gets the JSON report (with ``--json``) followed by a markdown table.
Every process the benchmark starts is killed on every exit path (also when the benchmark itself is
killed: children get SIGKILL from the kernel when their parent dies).

The modules, by concern: ``cli`` (flags, defaults, the sweep), ``job`` (the server's model, dataset
and flags), ``processes`` (the child processes and their servers), ``measures`` (echo, torch RPC,
push+pull, gloo), ``overhead`` (the server's per-step cost), ``profiling`` (``--profile``), ``stats``
and ``report`` (ratios, rounds, targets, the table); ``child`` is the clients' and ranks' process.
"""
