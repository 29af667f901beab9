"""A policy's own settings: a declaration checks its default, a value is checked against its type and
bounds or choices (as given in a config, or as a flag's text), and a policy's options are complete with
the declared defaults and hold no setting it does not declare."""

from __future__ import annotations

import pytest

from ps.control.settings import Setting, checked_options, setting_flag

RATE = Setting("rate", float, 0.5, "a fraction", low=0.0, high=1.0, low_open=True)
ROUNDS = Setting("probe_rounds", int, 4, "rounds", low=1)
MODE = Setting("mode", str, "fast", "how", choices=("fast", "slow"))
LOUD = Setting("loud", bool, False, "whether")


def test_a_value_is_checked_against_the_type_and_the_bounds() -> None:
    assert RATE.check(1) == 1.0 and isinstance(RATE.check(1), float)
    assert ROUNDS.check(7) == 7 and MODE.check("slow") == "slow" and LOUD.check(True) is True
    for setting, bad, why in ((RATE, 0.0, r"rate must be in \(0, 1\]"), (RATE, float("inf"), "rate must be finite"),
                              (ROUNDS, 0, r"probe_rounds must be in \[1, inf\)"), (ROUNDS, 2.5, "must be an integer"),
                              (ROUNDS, True, "must be an integer"), (MODE, "medium", "mode must be one of fast, slow"),
                              (LOUD, 1, "loud must be true or false")):
        with pytest.raises(ValueError, match=why):
            setting.check(bad)


def test_a_flags_text_parses_to_the_settings_type() -> None:
    assert RATE.parse("0.25") == 0.25 and ROUNDS.parse("3") == 3 and MODE.parse("fast") == "fast"
    assert LOUD.parse("on") is True and LOUD.parse("false") is False
    for setting, text in ((RATE, "half"), (ROUNDS, "3.5"), (RATE, "nan"), (LOUD, "maybe"), (MODE, "")):
        with pytest.raises(ValueError, match=setting.name):
            setting.parse(text)


def test_a_declaration_is_refused_when_its_default_or_its_form_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"must be in \[1, 2\]"):
        Setting("x", int, 3, "", low=1, high=2)
    with pytest.raises(ValueError, match="identifier"):
        Setting("two words", int, 1, "")
    with pytest.raises(ValueError, match="choices are for str settings"):
        Setting("x", int, 1, "", choices=("1",))
    with pytest.raises(ValueError, match="bounds are for int and float settings"):
        Setting("x", bool, False, "", low=0)
    with pytest.raises(ValueError, match="kind must be one of"):
        Setting("x", list, [], "")


def test_options_are_completed_with_the_defaults_and_hold_only_declared_settings() -> None:
    declared = (RATE, ROUNDS)
    assert checked_options("p", declared, {}) == {"rate": 0.5, "probe_rounds": 4}
    assert checked_options("p", declared, {"probe_rounds": 9}) == {"rate": 0.5, "probe_rounds": 9}
    with pytest.raises(ValueError, match=r"policy p has no setting 'speed' \(its settings are probe_rounds, rate\)"):
        checked_options("p", declared, {"speed": 1})
    with pytest.raises(ValueError, match="policy q has no setting 'rate' \\(it declares none\\)"):
        checked_options("q", (), {"rate": 0.5})
    assert setting_flag("model", "probe_rounds") == "--model-probe-rounds" == ROUNDS.flag("model")
