"""Batch sizing: how the global batch is split among the workers and corrected from their measured
times. policy.py is the interface the coordinator sees; registry.py builds a policy by name and reads
one back from a checkpoint. Each policy is a module over the shared roster (roster.py: workers,
bounds, the exact-sum split): uniform.py, static.py (Eq. 4a), dynamic.py (the proportional law of
proportional.py, Eq. 6-8) and model.py (Cannikin's OptPerf: the time fits of time_fit.py and the
split and parking of optperf.py); their settings in config.py, the integer splits in split.py and the
number checks in checks.py. gns.py estimates the gradient noise scale from the workers' gradients.
Pure: no torch, no gRPC, no clock, no I/O, so each rule is unit- and property-tested alone. Imports
nothing of ps but the leaf common.number_checks."""
