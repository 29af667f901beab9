"""A step's times as the worker reports them: its own part of the step's communication
(own_time.py). May import common and worker.transport; never protos."""
