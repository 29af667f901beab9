"""The model policy (Cannikin's OptPerf): per-worker time fits (time_fit.py) of a worker's recent
times (observations.py) kept per worker with its probes (worker_fits.py, on worker_times.py's), the one-step optimal split and parking
(optperf.py, pricing thousands of workers at once through finish_table.py), the probes' plan (probes.py), how far a re-solve may move a worker (trust.py), whether a
plan is measured balanced (balance.py), the parking schedule (parking.py), the rounds behind the
overhead c (rounds.py), the policy itself (policy.py), its checkpoint state (checkpoint.py) and the
checks that read it back (state.py). auto/ builds on these pieces. Pure."""
