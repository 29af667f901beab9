"""The calls a server holds, by kind and peer (ps/serving/call_budget.py, pure): each kind within its
own bounds, a silent request stream displaced before a call is refused, and releases that free the
place once."""

from __future__ import annotations

import pytest

from ps.serving.call_budget import (
    CONTROL, DATA, HEALTH, REFLECTION, WATCH, Bound, CallBounds, CallBudget, Refused, calls_for_workers, call_kind,
)

A, B = "10.0.0.1", "10.0.0.2"


def budget(data: Bound = Bound(3, 2), control: Bound = Bound(2, 2)) -> CallBudget:
    return CallBudget(CallBounds(data=data, control=control, watch=Bound(3, 2)))


@pytest.mark.parametrize(("method", "kind"), [
    ("/hetero_ps.ParameterServer/Push", DATA), ("/hetero_ps.ParameterServer/Pull", DATA),
    ("/hetero_ps.ParameterShard/Push", DATA), ("/hetero_ps.ParameterShard/Pull", DATA),
    ("/hetero_ps.ParameterServer/Join", CONTROL), ("/hetero_ps.ParameterServer/Heartbeat", CONTROL),
    ("/hetero_ps.ParameterServer/Rendezvous", CONTROL), ("/hetero_ps.ParameterShard/Load", CONTROL),
    ("/grpc.health.v1.Health/Check", HEALTH), ("/grpc.health.v1.Health/List", HEALTH),
    ("/grpc.health.v1.Health/Watch", WATCH),
    ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", REFLECTION),
    ("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", REFLECTION),
    ("/some.Other/Method", CONTROL),
])
def test_every_method_has_its_kind(method: str, kind: str) -> None:
    assert call_kind(method) == kind


def test_a_kind_is_bounded_per_peer_and_in_all_and_kinds_do_not_share() -> None:
    calls = budget()
    calls.admit(A, DATA, silent=False)
    calls.admit(A, DATA, silent=False)
    with pytest.raises(Refused, match=f"2 data calls from {A} are held, the most one address may; try again later"):
        calls.admit(A, DATA, silent=False)
    calls.admit(B, DATA, silent=False)
    with pytest.raises(Refused, match="3 data calls are held, the most this server holds"):
        calls.admit(B, DATA, silent=False)
    for _ in range(2):  # the control calls have places of their own, and so has health
        calls.admit(A, CONTROL, silent=False)
        calls.admit(A, WATCH, silent=False)
    assert (calls.held(DATA), calls.held(DATA, A), calls.held(DATA, B), calls.held(CONTROL), calls.held(WATCH)) == (3, 2, 1, 2, 2)


def test_a_released_place_is_free_again_once() -> None:
    calls = budget()
    first = calls.admit(A, DATA, silent=False)
    calls.admit(A, DATA, silent=False)
    calls.release(first)
    calls.release(first)  # again: nothing more is freed
    assert calls.held(DATA, A) == 1
    calls.admit(A, DATA, silent=False)
    with pytest.raises(Refused):
        calls.admit(A, DATA, silent=False)


def test_a_call_displaces_the_oldest_silent_stream_of_its_peer_and_no_stream_that_spoke() -> None:
    calls = budget()
    told: list[str] = []
    old = calls.admit(A, DATA, silent=True, on_displaced=lambda: told.append("old"))
    spoke = calls.admit(A, DATA, silent=True, on_displaced=lambda: told.append("spoke"))
    calls.heard(spoke)
    newer = calls.admit(A, DATA, silent=False)  # A is full: its oldest silent stream goes
    assert told == ["old"] and old.displaced and not spoke.displaced and calls.held(DATA, A) == 2
    calls.release(old)  # the displaced call's own release, when it ends, frees nothing more
    assert calls.held(DATA, A) == 2
    with pytest.raises(Refused):  # no silent one left: refused
        calls.admit(A, DATA, silent=True)
    calls.release(newer)
    assert calls.held(DATA, A) == 1


def test_a_full_kind_displaces_the_oldest_silent_stream_of_any_peer() -> None:
    calls = budget(data=Bound(3, 3))
    told: list[str] = []
    calls.admit(A, DATA, silent=False)
    calls.admit(B, DATA, silent=True, on_displaced=lambda: told.append("b"))
    calls.admit(A, DATA, silent=True, on_displaced=lambda: told.append("a"))
    calls.admit(A, DATA, silent=False)
    assert told == ["b"] and (calls.held(DATA, A), calls.held(DATA, B)) == (3, 0)


def test_bounds() -> None:
    assert CallBounds.serving(80) == CallBounds(data=Bound(80, 80), control=Bound(80, 80))
    assert CallBounds.serving(80, 8).data == Bound(80, 8)
    with pytest.raises(ValueError, match="--max-rpcs-per-peer 9 exceeds --max-concurrent-rpcs 8"):
        CallBounds.serving(8, 9)
    with pytest.raises(ValueError, match="per peer"):
        Bound(4, 0)
    assert calls_for_workers(1) == 80  # the ps-server default: 16 per allowed worker + 64
