"""The committed generated code matches protos/ps.proto."""

from protos.generate import stale_files


def test_generated_code_is_fresh() -> None:
    assert stale_files() == [], "run: python -m protos.generate"
