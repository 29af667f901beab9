"""The flags of a policy's own settings are made from its declarations: a number with its bounds, a
choice, a switch with its --no- form; only the chosen policy's reach its config. The adaptive batch
decides every DECIDE_EVERY rounds unless the flag says otherwise, and its range must hold a B that
leaves an epoch MIN_STEPS_PER_EPOCH rounds."""

from __future__ import annotations

import pytest

from ps import server_flags
from ps.control.global_batch.goodput import DECIDE_EVERY
from ps.control.settings import Setting
from ps.server_flags import build_parser, policy_flags, policy_options, settle_min_batch
from ps.server_job import check_adaptive_epoch

DECLARED = {"dynamic": (Setting("loud", bool, False, "whether to shout"),
                        Setting("mode", str, "fast", "how to go", choices=("fast", "slow")),
                        Setting("rounds", int, 4, "how many rounds", low=1, high=9))}


@pytest.fixture
def declared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_flags, "policy_settings", lambda policy: DECLARED.get(policy, ()))


def test_each_kind_of_setting_is_a_flag(declared: None, capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    help_text = " ".join(parser.format_help().split())
    assert "--dynamic-loud, --no-dynamic-loud --policy dynamic: whether to shout (default: False)" in help_text
    assert "--dynamic-mode STR --policy dynamic: how to go (one of fast, slow) (default: fast)" in help_text
    assert "--dynamic-rounds INT --policy dynamic: how many rounds (in [1, 9]) (default: 4)" in help_text
    assert policy_options(parser.parse_args(["--policy", "dynamic", "--dynamic-loud", "--dynamic-mode", "slow",
                                             "--dynamic-rounds", "9"])) == {
        "loud": True, "mode": "slow", "rounds": 9}
    assert policy_options(parser.parse_args(["--policy", "dynamic", "--no-dynamic-loud"])) == {"loud": False}
    assert policy_options(parser.parse_args(["--policy", "dynamic"])) == {}
    for bad in (["--dynamic-mode", "medium"], ["--dynamic-rounds", "10"], ["--dynamic-rounds", "2.5"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
        assert "argument --dynamic-" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--dynamic-rounds is for --policy dynamic, not --policy model"):
        policy_options(parser.parse_args(["--policy", "model", "--dynamic-rounds", "3"]))
    assert policy_flags()["dynamic.rounds"] == "--dynamic-rounds" and policy_flags()["park"] == "parking (--no-park)"


def test_the_adaptive_batch_decides_as_soon_as_a_round_is_measured_unless_told_epoch() -> None:
    parser = build_parser()
    assert parser.parse_args(["--adaptive-batch", "gns"]).adapt_every == DECIDE_EVERY == 8
    assert parser.parse_args(["--adaptive-batch", "gns", "--adapt-every", "epoch"]).adapt_every is None
    assert parser.parse_args(["--adaptive-batch", "gns", "--adapt-every", "30"]).adapt_every == 30


@pytest.mark.parametrize(("flags", "refused"), [
    (["--min-global-batch", "89"], False),  # 1,438 // 16 = 89: one B left
    (["--min-global-batch", "90"], True),
    (["--min-global-batch", "512", "--max-global-batch", "512"], False),  # B held on purpose: φ measured at it
    (["--global-batch", "64"], False),
    ([], False),  # B₀ above the bound moves down to it at the first round
])
def test_the_adaptive_range_must_hold_a_batch_an_epoch_has_16_rounds_of(flags: list[str], refused: bool) -> None:
    args = build_parser().parse_args(["--adaptive-batch", "gns", "--workers", "2", "--global-batch", "512", *flags])
    settle_min_batch(args, batchnorm=False)
    if refused:
        with pytest.raises(ValueError, match="holds 16 rounds only up to B = 89"):
            check_adaptive_epoch(args, 1438)
    else:
        check_adaptive_epoch(args, 1438)


@pytest.mark.parametrize("flags, remedy", [
    (["--global-batch", "60", "--micro-batch", "8"], "use 56 or 64"),
    (["--global-batch", "20", "--micro-batch", "32"], "use 32"),
])
def test_a_global_batch_of_no_whole_micro_batches_is_refused_naming_the_multiples_nearest_it(
        flags: list[str], remedy: str) -> None:
    """The multiples of --micro-batch below and above --global-batch, or the one above where none is below."""
    args = build_parser().parse_args(["--workers", "1", *flags])
    with pytest.raises(ValueError, match=f"is not a multiple of --micro-batch [0-9]+; {remedy}$"):
        server_flags.check_micro_batch_flags(args)
