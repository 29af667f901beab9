"""The default batch policy, auto (policy.py): the proportional step where a worker's law is not known,
the fitted law's one-step solve and parking where it is. A worker's law from its observations
(law.py), every worker's observations kept for it (worker_laws.py), the test that a worker's speed
changed (change.py), the split the laws ask for with parking only where it is sure (solve.py), the
probes of changed workers held at their minimum and the batch a parked worker comes back at
(probes.py) and its checkpoint state read back (state.py); the re-probes of parked workers and the
rounds it measures are model/'s (parking.py, rounds.py). Pure."""
