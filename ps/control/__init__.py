"""Batch sizing: how the global batch is split among the workers and corrected from their measured
compute times (the OmniLearn-style controller and the integer splits it rests on), and the gradient
noise scale estimated from their gradients. Pure: no torch, no gRPC, no clock, no I/O, so each rule
is unit- and property-tested alone. Imports nothing of ps but the leaf ps.number_checks."""
