"""The model policy (Cannikin's OptPerf): per-worker time fits (time_fit.py), the one-step optimal
split and parking (optperf.py), whether a plan is measured balanced (balance.py), the policy itself
(policy.py) and its checkpoint state read back (state.py). Pure."""
