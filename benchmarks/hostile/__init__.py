"""Hostile-load benchmark: a real job beside each attack of issue 49, against the same job left alone.

``python -m benchmarks.hostile --json`` starts ``ps-cluster run``'s quick job (a small CNN on generated
16x16 images, B = 256) for 30 epochs (about 150 rounds, half a minute of training on two cores) under
the dynamic policy, on an emulated heterogeneous cluster (HL4 by default, ``--profile hl8``: one
CPU-quota cgroup per worker, or ``--slowdown`` factors where cgroups are not writable;
deploy.launcher.LocalCluster), with a token, once clean and once per attack. Each attack begins when
the job starts (its first plan) and runs from this process beside it, from clients written from
protos/ alone (``load``: streams held open; ``peers``: members that join):

1. ``watches``: 90 health Watch streams without the token, each opened again when it ends;
2. ``silent_pushes``: 100 Push streams that never send a chunk, carrying the token (so past
   authentication, as any caller of a job without one);
3. ``stalled_pushes``: 3 joined ids, heartbeating, each pushing its header and then an empty chunk
   every 5 s; each joins again when evicted;
4. ``rejoin_loop``: one name that joins, heartbeats, never pushes and joins again when evicted;
5. ``departed_at_shards`` (only with ``--shards N``): an id that left, pulling its ranges and staging a
   zero slice at every shard each round;
6. ``store_rewrites`` (only with ``--allreduce``): a member setting, compare-and-setting and deleting
   the other ranks' keys of its group's store, then filling it.

An attack the job cannot have is listed under ``skipped`` with why. A run under attack that has not
finished after ``--run-timeout`` (3 x the clean run's time, at least 60 s) is stopped (SIGTERM: the
summary says how far it got) and reported unfinished.

Reported per run, from the server's metrics log: samples/s (the summary's: samples trained over the
time from the job's start), the accuracy and loss, the longest time a round stayed open
(``longest_round_open_s``: the summary's over the rounds the server closed, or the round a stopped run
left open, as a Status poller timed it: ``open_at_end_s``), deadline drops and the deadlines their
reasons state, joins and evictions, the honest workers' exit statuses, what the attacker was answered
(``attacker``: counts by call and status code; ``attacker_told``: the first message of each refusal)
and the invariants: every plan sums to B, every round of fewer than B samples closed while a member
was removed, exactly-once epochs (where the log shows them: ``--sampling exact``, the default), a
finite model (loss and accuracy; null when nothing was evaluated), every honest worker exited 0. Per
attack besides: ``ratio`` (its samples/s over the clean run's), ``deadline_s`` (the deadline
``--round-deadline auto`` settles at in the clean run: max(floor, 4 x its mean round)),
``round_bound_s`` (that, or the clean run's longest round, its first with the warm-up, whichever is
larger, plus the reaper's 1 s), ``rounds_within_deadline`` and ``held`` (finished with every invariant
held). ``targets``, from the issue: each ratio >= 0.8 (the goal 0.95), no round open past its bound,
every job held.

The modules: ``cli`` (flags, the job, the runs, output), ``runs`` (one run and its attack), ``report``
(records, comparisons, targets, table; pure), ``load`` and ``peers`` (the attackers, and the
Status poller).
"""
