"""The parameter layout (common/transport/layout.py): where a peer's differs, in words."""

from __future__ import annotations

from common.transport.layout import Layout, TensorEntry

OWN = Layout((TensorEntry("w", (16, 64)), TensorEntry("b", (16,))))


def test_a_layout_names_where_a_peers_first_differs() -> None:
    assert OWN.difference(OWN) == ""
    assert OWN.difference(Layout((TensorEntry("w", (64, 16)), TensorEntry("b", (16,))))) == (
        "tensor 0 is 'w' [64, 16] float32 there, 'w' [16, 64] float32 here")
    assert OWN.difference(Layout((TensorEntry("w", (16, 64)), TensorEntry("b", (16,), "int8")))) == (
        "tensor 1 is 'b' [16] int8 there, 'b' [16] float32 here")
    assert OWN.difference(Layout(OWN.entries[:1])) == "1 tensors there, 2 here"
