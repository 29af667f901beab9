"""A step's times as the worker reports them: the step's clocks and its push's PushTimes
(step_timer.py), and its own part of the step's communication (own_time.py). May import common,
worker.transport and worker.probes; never protos."""
