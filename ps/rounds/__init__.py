"""The coordinator (coordinator.py), the one core the servicer talks to, and its concerns, each with its
own state in its own module: who may join, the start and the waiting workers' entry (admission.py), who
leaves (departures.py), the open BSP round (bsp.py) and its close (round_close.py), ASP updates
(asp.py), epochs and the steps that schedule decisions and checkpoints (epochs.py) and what falls due
(milestones.py), the fast path's groups (fast_path.py, on rendezvous.py and its store,
group_store.py), the whole model for evaluations and checkpoints (whole_model.py, evaluations.py),
the checks a push passes (push_checks.py), the bound on its norm (update_norms.py), the replies
(step_reply.py), the checkpoint state, the checks a checkpoint passes and the resume's search
(checkpoint_checks.py, resume.py), the reports and the job's end; state.py is what they share and how it moves, events.py the round events they hear
of, membership.py who is in the job. May import ps.control, common.params, ps.shards, common.job,
common.transport, ps.ops and common.errors; never protos (the servicer translates)."""
