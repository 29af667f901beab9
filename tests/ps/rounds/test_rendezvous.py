"""The fast path's group (ps/rounds/rendezvous.py): its backend, and the hub among its ranks (pure)."""

from __future__ import annotations

from ps.rounds.rendezvous import Group, hub_rank, plan_group


def test_group_backend_is_nccl_only_when_every_worker_has_its_own_gpu() -> None:
    assert plan_group(3, ["a", "b"], {"a": "GPU-1", "b": "GPU-2"}) == Group(3, ("a", "b"), "nccl")
    assert plan_group(3, ["a", "b"], {"a": "", "b": ""}).backend == "nccl"  # UUIDs unknown: trusted to differ
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected", seen on an H100): gloo instead of a hang
    shared = plan_group(3, ["a", "b", "c"], {"a": "GPU-1", "b": "GPU-2", "c": "GPU-1"})
    assert (shared.backend, shared.why) == ("gloo", "a and c share GPU GPU-1")
    mixed = plan_group(3, ["a", "b"], {"a": "GPU-1", "b": None})
    assert (mixed.backend, mixed.why) == ("gloo", "1 of 2 workers have no GPU")
    assert plan_group(3, ["a", "b"], {"a": None}) == Group(3, ("a", "b"), "gloo", "")  # all on CPUs: nothing to explain
    group = plan_group(3, ["b", "a"], {})
    assert (group.generation, group.world_size, group.rank("a"), group.rank("zz"), group.backend) == (3, 2, 1, -1, "gloo")


def test_the_hub_is_the_largest_batch_and_the_lowest_rank_among_equals() -> None:
    group = Group(1, ("a", "b", "c"), "gloo")
    assert hub_rank(group, {"a": 10, "b": 30, "c": 20}) == 1
    assert hub_rank(group, {"a": 10, "b": 30, "c": 30}) == 1
    assert hub_rank(group, {"c": 5}) == 2
    assert hub_rank(group, {}) == 0
    assert hub_rank(Group(0, (), "gloo"), {"a": 1}) == 0
