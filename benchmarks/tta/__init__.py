"""Time-to-accuracy benchmark: our parameter server against PyTorch DDP, to a test accuracy.

``python -m benchmarks.tta --json`` emulates a heterogeneous cluster on this machine as
``benchmarks.hetero`` does (HL8 by default: one CPU-quota cgroup per worker, the profile's ratios
scaled to ``--cpu-budget``) and trains the same model on the same data with the same global batch
B and learning rate, once per arm and seed, to a target test accuracy:

* ``ddp_uniform``: DistributedDataParallel (gloo), one rank per worker cgroup, B/K samples each;
* ``ddp_split``: the same with per-rank batches set by hand to the split the ``model`` policy ended
  at on the first seed (what a DDP user sets for mixed hardware, here to our best split);
* ``uniform``, ``dynamic``, ``model``: ps-server and its workers (one per cgroup) under that policy;
* ``model_adaptive``: ``model`` with ``--adaptive-batch gns`` from B (the fixed B0) within
  ``[--min-global-batch, --max-global-batch]``.

Every arm evaluates the test split at each epoch end and reports its curve in **seconds of
training**, counted alike on both sides: from the end of the first step of every worker (the
server's ``first_round``; a DDP rank's first step and a barrier), so that process start-up and the
workers' set-up are left out, and without the evaluations (the server evaluates a snapshot on
another thread, off its training clock; DDP's clock is stopped while its fastest rank evaluates).
Both go through exact epochs (each sample once per epoch; DDP: one shared permutation, each step's
samples split among the ranks in their batches' proportions).

A run stops at its first evaluation at ``--target`` or above once ``--budget`` seconds of training
have passed, or at ``--epochs``. Per arm: the time to the target and the best accuracy within the
budget, each seed's, their median and worst. ``targets`` holds the issue's goals (median over the
seeds): our best configuration ≤ 1/3 of ``ddp_uniform``'s time and ≤ 0.8 of ``ddp_split``'s;
``model_adaptive`` ≤ 0.9 of ``model``'s; on every seed ``model_adaptive`` ≤ 1.1 × ``model``.

The modules: ``cli`` (flags, the arms over the seeds, output), ``arms`` (one run of an arm) and
``report`` (medians, worst seeds, goals, table; pure).
"""
