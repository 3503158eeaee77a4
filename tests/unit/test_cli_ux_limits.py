"""Count flags have upper bounds and seeds a range: exit 2 with one line, never a hang or a traceback."""

from __future__ import annotations

import pytest

from ascendgraph.cli.app import main
from ascendgraph.cli.args import LIMITS, MAX_SEED

HUGE = "99999999999999999999"


def _bad_input(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("command", ["run", "plan", "profile"])
def test_a_seed_beyond_63_bits_is_bad_input(capsys, command):
    err = _bad_input(capsys, [command, "--num-layers", "2", "--requests", "4", "--seed", HUGE])
    assert f"ascendgraph {command}: error: argument --seed" in err and "2**63" in err


@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_negative_seed_is_bad_input(capsys, command):
    assert "argument --seed" in _bad_input(capsys, [command, "--seed", "-1"])


def test_the_largest_seed_is_accepted_by_the_parser():
    from ascendgraph.cli.args import seed_int

    assert seed_int(str(MAX_SEED)) == 2**63 - 1


@pytest.mark.parametrize("argv, flag, limit", [
    (["run", "--requests", HUGE], "--requests", "1000000"),
    (["plan", "--requests", HUGE], "--requests", "1000000"),
    (["explain", "--num-layers", "1025"], "--num-layers", "1024"),
    (["explain", "-tp", HUGE], "-tp", "65536"),
    (["explain", "-dp", "65537"], "-dp", "65536"),
    (["explain", "-pp", HUGE], "-pp", "65536"),
    (["explain", "--block-size", HUGE], "--block-size", "65536"),
    (["explain", "--max-loras", HUGE], "--max-loras", "65536"),
    (["explain", "--stream-limit", HUGE], "--stream-limit", "1000000"),
    (["doctor", "--num-layers", "5000"], "--num-layers", "1024"),
    (["diagnose", "--stream-limit", HUGE, "-"], "--stream-limit", "1000000"),
])
def test_count_flags_have_a_documented_cap(capsys, argv, flag, limit):
    err = _bad_input(capsys, argv)
    assert f"ascendgraph {argv[0]}: error: argument" in err and flag in err and f"at most {limit}" in err


def test_the_caps_are_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for limit in ("at most 1024", "at most 65536", "at most 1000000"):
        assert limit in out


def test_the_explain_stream_plan_never_shows_float_rounding(capsys):
    top = str(LIMITS["stream_limit"][1])
    assert main(["explain", "--stream-limit", top]) == 0
    assert "budget 1000000 -> up to 199993 sizes" in capsys.readouterr().out


def test_the_engine_bounds_match_the_cli():
    from ascendgraph.runtime import engine

    assert engine.MAX_REQUESTS == LIMITS["requests"][1] and engine.MAX_SEED == LIMITS["seed"][1] == MAX_SEED


def test_when_no_size_fits_nothing_is_offered_as_fitting(capsys):
    from ascendgraph.cli.app import main as _main
    from ascendgraph.sizes import plan_stream_budget

    plan = plan_stream_budget(num_hidden_layers=2, capture_sizes=[1, 2, 4, 8], mode="PIECEWISE", max_streams=1)
    assert plan.max_num_sizes == 0 and plan.sizes == []
    assert "not even one capture size fits" in plan.warnings[-1]
    assert _main(["run", "--num-layers", "2", "--requests", "2", "--stream-limit", "1", "--sizes-from-plan"]) == 2
    assert "not even one capture size fits" in capsys.readouterr().err
