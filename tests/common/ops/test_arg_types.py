"""The help formatter of ps-server, ps-worker and ps-shard (common.ops.arg_types.DefaultsHelpFormatter)."""

from __future__ import annotations

import argparse

from common.ops.arg_types import DefaultsHelpFormatter


def test_help_shows_defaults_but_not_a_store_false_flags_true_nor_none() -> None:
    """`--no-park (default: True)` read as parking off by default: a flag that stores False shows no
    default, and neither does one whose default is None; the others keep theirs."""
    p = argparse.ArgumentParser(prog="x", formatter_class=DefaultsHelpFormatter)
    p.add_argument("--no-park", dest="park", action="store_false", help="never park")
    p.add_argument("--nesterov", action="store_true", help="Nesterov momentum")
    p.add_argument("--min-batch", type=int, default=None, help="lower bound (default: 1)")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate")
    text = " ".join(p.format_help().split())
    assert "never park --nesterov" in text
    assert "Nesterov momentum (default: False)" in text
    assert "lower bound (default: 1) --lr" in text
    assert "learning rate (default: 0.1)" in text
    assert "True" not in text and "None" not in text
