"""Batch policies: how the global batch B is split among the workers and corrected from their measured
times, and (global_batch/) B itself. policy.py is the whole contract ps/rounds sees (the BatchPolicy
interface, and building, reading back and re-configuring a policy); registry.py lists the policies by
name; config.py holds their settings, settings.py how a policy declares its own. Each policy is a
subclass of worker_plan.WorkerPlan (decisions, checkpoints: plan_state.py) on roster.WorkerRoster (the
workers, each one's record in worker_record.py, the plan and its exact-sum split in shares.py):
uniform.py, static.py (Eq. 4a), dynamic.py (the proportional law of proportional.py, Eq. 6-8),
model/ (Cannikin's OptPerf: time fits, the one-step split, parking) and auto/, the default (the
proportional step until a worker's time law is known, model/'s solve and parking after, the step again
on a change of speed); micro.py plans any of them in whole micro-batches; performance.py is the one
model of a round's time the model policy, --adaptive-batch and the metrics' predictions share; split.py
the integer splits, checks.py the number checks, stdev.py statistics.stdev without its Fractions. global_batch/ chooses B by goodput from the gradient
noise scale. Pure: no torch, no gRPC, no clock, no I/O, so each rule is unit- and property-tested alone.
Imports nothing of ps but the leaf common.number_checks."""
