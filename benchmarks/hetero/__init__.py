"""Heterogeneity benchmark: our parameter server against the ideal and against equal-batch DDP.

``python -m benchmarks.hetero --profile hl8 --mode bsp --json`` emulates a heterogeneous cluster on
this machine (one CPU-quota cgroup per worker, the profile's ratios scaled to ``--cpu-budget``)
and measures, in one run, under the same quotas, with the same model and global batch:

* ``ideal``: each worker alone under its quota (``benchmarks.solo``: fetch, forward, backward,
  SGD step; one torch thread; no server), one after another. Their sum is what a perfect balancer
  could reach. ``ideal.together``: the same solo runs started all at once (a diagnostic: how much
  co-running processes slow each other down on this machine; ``ratio_to_ideal_together``).
* ``ddp_uniform``: PyTorch DistributedDataParallel (gloo) with equal batches ``B/K``, one process
  per worker cgroup (``benchmarks.ddp_baseline``).
* our BSP server (``ps-server`` + ``ps-worker`` via :class:`deploy.launcher.LocalCluster`) with the
  ``uniform``, ``static`` (declared cores = the shares) and ``dynamic`` controllers.
* ``ddp_split`` (with the baselines): DDP with per-rank batches set to ``dynamic``'s final plan, what
  a DDP user sets by hand for mixed hardware, measured after the ``dynamic`` run and again after
  the last run (its rate the mean of the two, ``samples`` each one's). With ``dynamic_allreduce``
  among the runs, ``ddp_fast_split`` is DDP at the fast path's own final plan, and the run's
  ``ratio_to_ddp_own_split`` compares the two at the same split. With ``dynamic_no_overlap`` among the
  runs (the serial path, ``ps-server --no-overlap``) the ``overlap`` record compares them: samples/s,
  exposed communication per round (``exposed_ms``), and both against ``ddp_split``.

``--mode asp`` runs ASP (Table I's ASP column; the server gets its scaled share too) with the
``uniform`` and ``dynamic`` controllers and ``dynamic`` without LR scaling, and reports the update
skew. ``--schedule swap`` (or ``tenant``, ``dynamic``, a file) steps the quotas through the schedule's
phases while the job runs, on the wall clock or at epoch boundaries, and reports per phase samples/s,
the decisions and seconds to re-balance after each change, and in BSP DDP beside it under the same
changes: equal batches, tuned to the first phase, re-tuned at every change (``schedules``).
``--tta TARGET`` times ``uniform`` and ``dynamic`` to a test accuracy on digits.

Progress goes to stderr; stdout gets the JSON report (with ``--json``) followed by a markdown table.
Every process and cgroup this starts is removed on every exit path (Ctrl-C and SIGTERM included).
Definitions of the reported numbers: ``benchmarks/analysis.py``.

The modules, by concern: ``cli`` (flags, settings, the run), ``settings`` (a run's settings and the
emulation), ``baselines`` (the ideal and DDP), ``runs`` (our server's runs and their variants),
``compose`` (a run in containers), ``modes`` (throughput, time to accuracy; the targets), ``schedules``
(a schedule's run and its DDP baselines) with ``phases`` (its phases read back from the metrics log)
and ``report`` (the environment and the table).
"""
