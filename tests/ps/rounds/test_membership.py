"""ps/rounds/membership.py: the updates each worker made, for the summary's `update_counts`. Pure
bookkeeping with the clock passed in."""

from __future__ import annotations

from ps.rounds.membership import Membership


def _joined(members: Membership, name: str, now: float) -> str:
    member = members.admit(name, 1.0, now)
    members.activate(member.worker_id)
    return member.worker_id


def test_the_update_counts_keep_a_departed_workers_updates() -> None:
    """The summary's update_counts listed the workers still in the job only: in an ASP job where b left
    after 404 of the job's 1,803 updates, the counts summed to 1,399 and b was not named."""
    members = Membership(max_workers=3)
    a, b = _joined(members, "a", 0.0), _joined(members, "b", 0.0)
    for worker, pushes in ((a, 5), (b, 3)):
        for _ in range(pushes):
            members.active[worker].count_push(1.0, 0.0, 0.0)
    members.remove(b, "left", 1.0)
    assert members.update_counts() == {"a": 5, "b": 3}
    again = _joined(members, "b", 100.0)  # b rejoins under its name: both of its stays count
    members.active[again].count_push(1.0, 0.0, 0.0)
    assert members.update_counts() == {"a": 5, "b": 4}
