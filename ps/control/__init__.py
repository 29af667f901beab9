"""Batch sizing: how the global batch is split among the workers and corrected from their measured
compute times. policy.py is the interface the coordinator sees; controller.py the OmniLearn-style
controller (its settings in config.py), resting on the integer splits of split.py, the proportional
law of proportional.py and the number checks of checks.py; gns.py estimates the gradient noise scale
from the workers' gradients. Pure: no torch, no gRPC, no clock, no I/O, so each rule is unit- and
property-tested alone. Imports nothing of ps but the leaf ps.number_checks."""
