"""The global batch B itself (--adaptive-batch gns), apart from its split among the workers: the
gradient noise scale measured from the workers' gradients (gns.py) and the goodput choice of B with
the learning rate at it (goodput.py), and the state across decisions: the move under review, the
directions closed, the checkpoint (decider.py). Pure."""
