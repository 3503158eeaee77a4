"""`ascendgraph plan` without the simulator (--measure off): workload input, stream verdicts,
size selections, the JSON document, exit codes, --plot; and select_sizes edge cases."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ascendgraph.cli.app import main
from ascendgraph.config import GraphConfig
from ascendgraph.errors import ConfigError
from ascendgraph.tools.plan import (
    default_budget,
    file_workload,
    generated_workload,
    make_plan,
    read_workload_file,
    sizes_from_plan,
    stream_failure,
)
from ascendgraph.modes import GraphMode
from ascendgraph.tools.plan.measure import interpolate
from ascendgraph.resolve import resolve
from ascendgraph.sizes import pad_num_tokens, sample_sizes, select_sizes

OFF = ["--measure", "off"]
JSON_KEYS = {
    "schema_version", "model", "requested_mode", "effective_mode", "soc", "capture_sizes", "max_capture_size",
    "stream_plan", "workload", "budget", "selections", "padding_waste_ratio", "measurement", "measure_error",
    "plot", "warnings",
}
STREAM_PLAN_KEYS = {
    "max_num_sizes", "streams_per_size", "fits", "sizes", "requested_sizes", "graphs_per_size", "reserved_streams",
    "max_streams", "expansion_mode", "streams_needed", "first_failing_index", "first_failing_size",
    "largest_fitting_selection",
}
SELECTION_KEYS = {"sizes", "num_sizes", "padding_waste", "real_tokens", "padded_tokens", "graphed_batches", "graphs",
                  "streams", "fits", "predicted"}


def _plan(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _write(tmp_path, text: str, name: str = "batches.txt") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# --------------------------------------------------------------------------- workload files


def test_a_workload_file_has_one_batch_size_per_line_with_comments_and_blank_lines(tmp_path):
    path = _write(tmp_path, "# decode steps\n8\n\n 16 \n3  # a small one\n")
    assert read_workload_file(path) == [8, 16, 3]


@pytest.mark.parametrize("bad, line", [("8\n16\nabc\n", 3), ("4\n0\n", 2), ("-3\n", 1), ("1\n2.5\n", 2),
                                       ("\n\n7 8\n", 3)])
def test_a_bad_workload_line_is_named_by_file_and_line_number(tmp_path, bad, line):
    path = _write(tmp_path, bad)
    with pytest.raises(ConfigError) as info:
        read_workload_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: expected a batch size in tokens (an integer >= 1), got ")


def test_an_empty_or_missing_workload_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no batch sizes"):
        read_workload_file(_write(tmp_path, "# nothing\n\n"))
    with pytest.raises(ConfigError, match="cannot read the workload file"):
        read_workload_file(str(tmp_path / "missing.txt"))


def test_cli_bad_workload_file_exits_2_with_one_line_naming_the_line(capsys, tmp_path):
    path = _write(tmp_path, "8\n16\nlots\n")
    code, out, err = _plan(capsys, "--workload", path, *OFF)
    assert code == 2
    assert out == ""
    assert f"{path}:3: expected a batch size in tokens" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_workload_and_requests_are_mutually_exclusive(capsys, tmp_path):
    code, _, err = _plan(capsys, "--workload", _write(tmp_path, "4\n"), "--requests", "3", *OFF)
    assert code == 2
    assert "not allowed with argument" in err


@pytest.mark.parametrize("flag", ["--budget", "--requests", "--sample-sizes"])
def test_cli_rejects_non_positive_counts(capsys, flag):
    code, _, err = _plan(capsys, flag, "0", *OFF)
    assert code == 2 and "expected a positive integer" in err


def test_generated_workload_counts_only_decode_batches_when_mixed_batches_run_eagerly():
    config = GraphConfig.from_vllm_args(max_num_seqs=8, max_num_batched_tokens=64)
    everything = generated_workload(config, GraphMode.FULL_AND_PIECEWISE, requests=6, seed=0)
    decode_only = generated_workload(config, GraphMode.FULL_DECODE_ONLY, requests=6, seed=0)
    assert everything.batch_sizes == decode_only.batch_sizes
    assert everything.counted == everything.batch_sizes
    assert 0 < len(decode_only.counted) < len(decode_only.batch_sizes)
    assert decode_only.details["counted"] == "uniform-decode batches"
    # the same seed gives the same batches (the ones `run` with the same flags serves)
    assert generated_workload(config, GraphMode.FULL_AND_PIECEWISE, requests=6, seed=0).batch_sizes == \
        everything.batch_sizes


# --------------------------------------------------------------------------- stream verdicts


def _not_fitting_config() -> GraphConfig:
    # 3 layers, PIECEWISE: 4 graphs per size; 35 default sizes (max_num_seqs 256)
    return GraphConfig.from_vllm_args(num_layers=3, compilation_config={"cudagraph_mode": "PIECEWISE"})


def test_a_config_that_does_not_fit_names_the_first_failing_size_and_the_largest_fitting_selection(tmp_path):
    workload = file_workload(_write(tmp_path, "\n".join(["3"] * 20 + ["17"] * 10 + ["100", "250"])))
    result = make_plan(_not_fitting_config(), workload, stream_limit=50, measure="off")
    plan = result.plan
    assert plan is not None and not plan.fits
    assert plan.max_num_sizes == 12  # floor(50 / 4)
    failure = result.failure
    assert failure is not None
    descending = sorted(plan.requested_sizes, reverse=True)
    assert failure.index == 12 and failure.size == descending[12]
    assert failure.streams_before == 48 and failure.streams_needed == 52
    assert result.fitting_even == plan.sizes == sample_sizes(plan.requested_sizes, 12)
    assert result.fitting_aware == select_sizes(plan.requested_sizes, 12, workload.counted)
    assert max(result.fitting_aware) == max(plan.requested_sizes) == 256
    assert len(result.fitting_aware) <= 12
    # the default budget is what fits
    assert result.budget == 12 and result.budget_source == "stream plan"
    assert result.even.fits and result.aware.fits and not result.configured.fits


def test_cli_text_for_a_config_that_does_not_fit(capsys):
    code, out, err = _plan(capsys, "--num-layers", "3", "-cc", '{"cudagraph_mode": "PIECEWISE"}', "--stream-limit",
                           "50", "--requests", "4", *OFF)
    assert code == 0 and "DOES NOT FIT" not in err  # the plan is the result: stdout
    descending = sorted(resolve(_not_fitting_config()).capture_sizes, reverse=True)
    assert f"first size to fail  {descending[12]} (capture #13 of 35, largest first)" in out
    assert "DOES NOT FIT" in out
    assert "largest fitting selection (at most 12 sizes; workload-aware may need fewer):" in out
    assert "even sampling     12 sizes: [1, 8, 32, 56, 80, 104, 136, 160, 184, 208, 232, 256]" in out
    aware_line = next(line for line in out.splitlines() if line.strip().startswith("workload-aware") and "sizes:" in line)
    count = int(aware_line.split("workload-aware")[1].split("size")[0])
    listed = aware_line.split("[")[1].rstrip("]").split(", ")
    assert 1 <= count <= 12 and (len(listed) == count or "..." in listed), "each row states its own size count"


def test_cli_check_exits_1_only_when_the_sizes_do_not_fit(capsys):
    flags = ["--num-layers", "3", "-cc", '{"cudagraph_mode": "PIECEWISE"}', "--requests", "2", *OFF, "--check"]
    assert _plan(capsys, *flags, "--stream-limit", "50")[0] == 1
    assert _plan(capsys, *flags, "--stream-limit", "1800")[0] == 0


def test_stream_failure_is_none_when_everything_fits():
    plan = resolve(GraphConfig()).stream_plan
    assert plan is not None and plan.fits
    assert stream_failure(plan) is None
    assert default_budget(plan) == len(plan.requested_sizes)


def test_nothing_fits_is_reported_with_the_cost_of_one_size(capsys):
    code, out, err = _plan(capsys, "-tp", "2", "--stream-limit", "60", "--requests", "2", "--json", *OFF)
    assert code == 0
    document = json.loads(out)
    assert document["stream_plan"]["max_num_sizes"] == 0
    assert document["stream_plan"]["first_failing_index"] == 0
    assert document["stream_plan"]["first_failing_size"] == document["max_capture_size"]
    assert "no size fits" not in err  # --json: the text report is not printed
    assert any("not even one size fits" in w for w in document["warnings"])
    code, out, _ = _plan(capsys, "-tp", "2", "--stream-limit", "60", "--requests", "2", *OFF)
    assert "no size fits: even the largest alone needs" in out


# --------------------------------------------------------------------------- selections and JSON


def test_cli_json_document(capsys, tmp_path):
    path = _write(tmp_path, "\n".join(str(t) for t in [1, 1, 2, 3, 5, 9, 17, 17, 33, 60, 120, 200, 400]))
    code, out, err = _plan(capsys, "--workload", path, "--budget", "4", "--json", *OFF)
    assert code == 0, err
    document = json.loads(out)
    assert JSON_KEYS <= set(document)
    assert document["schema_version"] == 1
    assert STREAM_PLAN_KEYS <= set(document["stream_plan"])
    assert set(document["selections"]) == {"configured", "even", "workload_aware"}
    for selection in document["selections"].values():
        assert SELECTION_KEYS <= set(selection)
        assert selection["predicted"] is None
    even, aware = document["selections"]["even"], document["selections"]["workload_aware"]
    assert even["num_sizes"] == 4 and aware["num_sizes"] <= 4
    assert even["sizes"][-1] == aware["sizes"][-1] == document["max_capture_size"] == 256
    assert aware["padding_waste"] <= even["padding_waste"]
    assert document["padding_waste_ratio"] == pytest.approx(aware["padding_waste"] / even["padding_waste"])
    # 400 tokens exceed the largest size (256): eager, not counted
    assert even["graphed_batches"] == aware["graphed_batches"] == 12
    assert document["workload"] == {**document["workload"], "source": "file", "batches": 13, "counted_batches": 13}
    assert document["budget"] == {"sizes": 4, "graphs_per_size": 5, "streams": 35 + 4 * 5, "source": "--budget"}
    assert document["measurement"] is None
    assert "padding waste" not in err  # --json: stdout holds the document, the text is not printed


def test_padding_waste_figures_add_up(tmp_path):
    workload = file_workload(_write(tmp_path, "3\n5\n9\n"))
    config = GraphConfig.from_vllm_args(compilation_config={"cudagraph_capture_sizes": [4, 8, 16]})
    result = make_plan(config, workload, budget=2, measure="off")
    even = result.even
    assert even.sizes == [4, 16]
    assert (even.real_tokens, even.padded_tokens) == (17, 4 + 16 + 16)
    assert even.padding_waste == pytest.approx(36 / 17 - 1)
    assert result.aware.sizes == [8, 16]  # 3, 5 -> 8; 9 -> 16: 32 padded tokens
    assert result.aware.padded_tokens == 32


def test_budget_larger_than_the_sizes_is_clamped_with_a_warning(tmp_path):
    workload = file_workload(_write(tmp_path, "3\n"))
    config = GraphConfig.from_vllm_args(compilation_config={"cudagraph_capture_sizes": [4, 8, 16]})
    result = make_plan(config, workload, budget=10, measure="off")
    assert result.budget == 3
    assert any("--budget 10 is more than the 3 configured sizes" in w for w in result.warnings)


def test_graphs_off_means_nothing_to_plan(capsys):
    code, out, err = _plan(capsys, "--enforce-eager", "--requests", "2", "--json", *OFF)
    assert code == 0
    document = json.loads(out)
    assert document["effective_mode"] == "NONE"
    assert document["stream_plan"] is None and document["selections"] == {}
    assert "graphs are off" not in err
    assert "graphs are off" in _plan(capsys, "--enforce-eager", "--requests", "2", *OFF)[1]


def test_sizes_from_plan_keeps_every_size_when_they_all_fit_and_selects_within_a_budget():
    config = GraphConfig.from_vllm_args(max_num_seqs=8, max_num_batched_tokens=64)
    unchanged = sizes_from_plan(config, requests=4, seed=0)
    assert unchanged.sizes == unchanged.candidates == [1, 2, 4, 8]
    assert unchanged.config.cudagraph_capture_sizes == (1, 2, 4, 8)
    chosen = sizes_from_plan(config, requests=4, seed=0, budget=2)
    assert len(chosen.sizes) <= 2 and chosen.sizes[-1] == 8
    assert chosen.config.max_cudagraph_capture_size is None
    assert resolve(chosen.config).capture_sizes == chosen.sizes
    assert chosen.padding_waste <= chosen.padding_waste_even
    assert "--sizes-from-plan:" in chosen.describe() and "budget 2, --budget" in chosen.describe()


# --------------------------------------------------------------------------- --plot


def test_plot_without_matplotlib_is_a_clear_one_line_error(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    code, out, err = _plan(capsys, "--plot", "waste.png", "--requests", "2", *OFF)
    assert code == 2 and out == ""
    assert err.strip() == ("ascendgraph plan: error: --plot needs matplotlib, which is not installed; install it "
                           "with: pip install 'ascendgraph[plot]'")


def test_plot_draws_a_png_when_matplotlib_is_installed(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "waste.png"
    code, out, err = _plan(capsys, "--plot", str(target), "--requests", "4", "--budget", "4", "--json", *OFF)
    assert code == 0, err
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(out)["plot"] == str(target)


def test_importing_the_plan_command_does_not_import_torch():
    code = "import sys, ascendgraph.tools.plan, ascendgraph.tools.plan.measure; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# --------------------------------------------------------------------------- helpers


def test_interpolation_is_linear_between_points_and_extends_past_the_ends():
    points = [(1, 10.0), (5, 30.0), (9, 30.0)]
    assert interpolate(points, 1) == 10.0
    assert interpolate(points, 3) == 20.0
    assert interpolate(points, 7) == 30.0
    assert interpolate(points, 13) == 30.0
    assert interpolate([(4, 8.0), (8, 16.0)], 16) == 32.0
    assert interpolate([(4, 8.0), (8, 4.0)], 100) == 0.0  # never negative
    assert interpolate([(4, 8.0)], 100) == 8.0


# --------------------------------------------------------------------------- select_sizes edges


def test_select_sizes_with_no_graphable_batch_keeps_only_the_largest():
    assert select_sizes([1, 2, 4, 8], 3, []) == [8]
    assert select_sizes([1, 2, 4, 8], 3, [9, 100, 0]) == [8]


def test_select_sizes_with_a_budget_covering_every_candidate_keeps_them_all_deduplicated():
    assert select_sizes([8, 1, 4, 4, 2], 4, [3]) == [1, 2, 4, 8]
    assert select_sizes([8, 1, 4, 2], 10, [3]) == [1, 2, 4, 8]


def test_select_sizes_prefers_fewer_sizes_when_they_pad_no_more():
    # every batch is 4 tokens: [4, 8] pads nothing, and so would [2, 4, 8] — keep two
    assert select_sizes([1, 2, 4, 8], 3, [4, 4, 4]) == [4, 8]


def _padded(sizes, workload):
    return sum(pad_num_tokens(t, sizes) for t in workload if 0 < t <= max(sizes))


@settings(max_examples=100, deadline=None)
@given(candidates=st.lists(st.integers(1, 40), min_size=1, max_size=7, unique=True), n=st.integers(1, 4),
       workload=st.lists(st.integers(0, 45), max_size=25))
def test_select_sizes_matches_an_exhaustive_search_including_zero_and_oversized_batches(candidates, n, workload):
    largest = max(candidates)
    rest = sorted(set(candidates) - {largest})
    best = min(_padded(sorted(c) + [largest], workload)
               for k in range(min(n - 1, len(rest)) + 1) for c in combinations(rest, k))
    chosen = select_sizes(candidates, n, workload)
    assert _padded(chosen, workload) == best
    assert largest in chosen and len(chosen) <= n


@settings(max_examples=100, deadline=None)
@given(candidates=st.lists(st.integers(1, 512), min_size=2, max_size=40, unique=True), n=st.integers(1, 10),
       workload=st.lists(st.integers(1, 600), min_size=1, max_size=60))
def test_select_sizes_never_pads_more_tokens_than_even_sampling(candidates, n, workload):
    ours = select_sizes(candidates, n, workload)
    even = sample_sizes(candidates, n)
    assert len(ours) <= len(even) <= n
    assert _padded(ours, workload) <= _padded(even, workload)
