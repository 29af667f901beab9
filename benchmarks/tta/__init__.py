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

``--sweep 64,128,256,512,1024`` runs all of that from each B0 of the list (the adaptive arm within the
same bounds from every start: the smallest B0/4 to 4 x the largest unless set), and judges the adaptive
arm from each B0 against the best fixed B: its median within 1.1 of ``model``'s median at the B0 where
that is least, its worst seed within 1.3 of that B's worst, its median at most 0.8 of ``ddp_split``'s
at ``ddp_split``'s own best B0, and no plan below a worker's break-even batch (each seed's record lists
any, from the metrics log: ``below_break_even``).

The modules: ``cli`` (flags, the arms over the seeds, output), ``arms`` (one run of an arm),
``report`` (medians, worst seeds, goals, table; pure) and ``sweep`` (the goals and table over B0s; pure).
"""
