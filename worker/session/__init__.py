"""A worker's session in its parts, composed by worker/runtime.py's Session: its place in the job
(membership.py: join, heartbeat, rejoin and recovery), the job as it holds it (replica.py: model,
path parts, ASP's optimizer, kept in step with the server), the plan it follows (plan_follower.py:
batch sizes, slices, path switches) and its steps (step_runner.py: the batch fetched and timed, the
gradient pushed, the reply taken; collective_step.py: the fast path's step). May import common, the
other rooms of the worker and worker.device; never protos."""
