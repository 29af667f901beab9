"""The committed generated code matches protos/ps.proto, and so do the Python mappings of its enums."""

from protos.generate import stale_files


def test_generated_code_is_fresh() -> None:
    assert stale_files() == [], "run: python -m protos.generate"


def test_push_kinds_match_the_proto_enum() -> None:
    """The core's push kinds, the wire's PushKind numbers and their inverse are one mapping."""
    from protos import ps_pb2
    from common.transport.messages import PUSH_KINDS
    from common.transport.push_stream import PUSH_KIND_NAMES, PUSH_KIND_NUMBERS

    assert set(PUSH_KIND_NUMBERS) == set(PUSH_KINDS)
    assert sorted(PUSH_KIND_NUMBERS.values()) == sorted(ps_pb2.PushKind.values())
    assert all(PUSH_KIND_NAMES[number] == name for name, number in PUSH_KIND_NUMBERS.items())
