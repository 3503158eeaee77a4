"""npugraph_ex end to end: fused ops and kernels per step in the report, the seed's profile checks, the CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ascendgraph.cli.app import main
from ascendgraph.compile.static_kernel import CACHE_DIR_ENV
from ascendgraph.config import GraphConfig
from ascendgraph.runtime.engine import run
from ascendgraph.runtime.workload import WorkloadSpec

LAYERS = 2
WORKLOAD = WorkloadSpec(num_requests=3, seed=0, prompt_words=(3, 5), output_tokens=(3, 4))
VARIANTS = {
    "no-npugraph-ex": {"enable_npugraph_ex": False},
    "npugraph-ex": {},
    "static": {"enable_static_kernel": True, "enable_super_kernel": False},
    "static-super": {"enable_static_kernel": True},
}


def _config(acc: dict) -> GraphConfig:
    return GraphConfig.from_vllm_args(
        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]},
        additional_config={"ascend_compilation_config": acc} if acc else None,
        num_layers=LAYERS, max_num_seqs=4, max_num_batched_tokens=16,
    )


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _profiled_runs(tmp_path: Path, monkeypatch) -> dict:
    """The same bfloat16 FULL_DECODE_ONLY workload in each variant, profiled."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    results = {}
    with pytest.warns(UserWarning, match="Starting static kernel compilation"):
        for name, acc in VARIANTS.items():
            # A3: super kernel exists there only (CANN's aclsk API; the A2 profile turns it off)
            report = run(_config(acc), device="sim", sim_profile="A3", workload_spec=WORKLOAD, dtype="bfloat16",
                         num_threads=1, profile_dir=str(tmp_path / name))
            results[name] = (report, Path(report.extensions["profile"]["dir"]))
    return results


def _check_every_variant_serves_the_workload_like_eager(runs) -> None:
    for name, (report, _profile) in runs.items():
        assert report.ok, (name, report.error)
        assert report.max_abs_diff_vs_eager == 0.0, name


def _check_the_report_lists_the_matches_of_each_pass(runs) -> None:
    document = runs["npugraph-ex"][0].to_json()
    assert document["fused_ops"] == {
        "noop_elimination": 0, "rms_norm": 0, "add_rms_norm": 2 * LAYERS, "add_rms_norm_dynamic_quant": 0,
        "add_rms_norm_quant": 0, "split_qkv_rmsnorm_rope": LAYERS, "muls_add": 0,
    }
    assert runs["no-npugraph-ex"][0].to_json()["fused_ops"] == {
        "noop_elimination": 0, "add_rms_norm": 2 * LAYERS, "add_rms_norm_dynamic_quant": 0, "add_rms_norm_quant": 0,
    }, "without npugraph_ex a FULL mode runs the basic passes"


def _check_each_stage_launches_fewer_kernels_per_decode_step(runs) -> None:
    graph = {name: report.to_json()["kernels_per_step"]["graph"] for name, (report, _p) in runs.items()}
    eager = {report.to_json()["kernels_per_step"]["eager"] for report, _p in runs.values()}
    assert len(eager) == 1, "the eager reference is the same unfused model every time"
    # split_qkv_rmsnorm_rope: q norm, k norm and rope (the split and views launch nothing) -> 1 kernel
    assert graph["no-npugraph-ex"] - graph["npugraph-ex"] == LAYERS * 2
    assert graph["static"] == graph["npugraph-ex"], "static kernels replace launches one for one"
    assert graph["static-super"] < graph["static"]


def _check_static_kernels_show_in_op_statistic_as_the_seed_says(runs) -> None:
    static_types = [row["OP Type"] for row in _rows(runs["static"][1] / "op_statistic.csv")]
    assert any("static_kernel" in t for t in static_types)
    # the guide's own example: static kernel on, super kernel on by default; merged static kernels keep their rows
    merged_types = {row["OP Type"]: int(row["Count"]) for row in _rows(runs["static-super"][1] / "op_statistic.csv")}
    assert "SuperKernel" in merged_types and any("static_kernel" in t for t in merged_types)
    static_counts = {row["OP Type"]: int(row["Count"]) for row in _rows(runs["static"][1] / "op_statistic.csv")}
    assert {t: c for t, c in merged_types.items() if "static_kernel" in t} == {
        t: c for t, c in static_counts.items() if "static_kernel" in t
    }, "every static kernel still counted once per launch it was merged into"
    plain_types = [row["OP Type"] for row in _rows(runs["npugraph-ex"][1] / "op_statistic.csv")]
    assert not any("static_kernel" in t for t in plain_types)


def _check_super_kernel_gives_fewer_kernel_details_rows_with_the_merged_block_dim(runs) -> None:
    static = _rows(runs["static"][1] / "kernel_details.csv")
    merged = _rows(runs["static-super"][1] / "kernel_details.csv")
    supers = [row for row in merged if row["Type"] == "SuperKernel"]
    super_names = {row["Name"] for row in supers}
    members = [row for row in merged if row["Name"] in super_names and row["Type"] != "SuperKernel"]
    assert members and all("static_kernel" in row["Type"] for row in members), "constituents under the super kernel's name"
    assert len(merged) - len(members) < len(static), "fewer launches"
    assert supers and all(row["Accelerator Core"] == "MIX_AIC" for row in supers)
    largest_static_block = max(int(row["Block Dim"]) for row in static if "static_kernel" in row["Type"])
    assert max(int(row["Block Dim"]) for row in supers) == largest_static_block
    trace = json.loads((runs["static-super"][1] / "trace_view.json").read_text())
    parts = [e["args"]["merged kernels"] for e in trace["traceEvents"] if e.get("args", {}).get("Type") == "SuperKernel"]
    assert parts and all(len(p) >= 2 and all("static_kernel" in name for name in p) for p in parts)


def test_npugraph_ex_static_and_super_kernel_end_to_end(tmp_path, monkeypatch):
    """One test over four profiled runs (they are the expensive part; xdist would repeat a module
    fixture on every worker): without npugraph_ex, with it, with static kernels, with static +
    super kernel."""
    runs = _profiled_runs(tmp_path, monkeypatch)
    _check_every_variant_serves_the_workload_like_eager(runs)
    _check_the_report_lists_the_matches_of_each_pass(runs)
    _check_each_stage_launches_fewer_kernels_per_decode_step(runs)
    _check_static_kernels_show_in_op_statistic_as_the_seed_says(runs)
    _check_super_kernel_gives_fewer_kernel_details_rows_with_the_merged_block_dim(runs)


# --------------------------------------------------------------------------- the CLI


SMALL = ["--device", "sim", "--num-layers", "1", "--max-num-seqs", "4", "--max-num-batched-tokens", "8",
         "--requests", "2", "-cc", '{"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]}']


def test_run_with_a_quantised_model_and_a_profile_dir(capsys, tmp_path):
    code = main(["run", *SMALL, "--quantization", "w8a8_dynamic", "--profile-dir", str(tmp_path), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    document = json.loads(captured.out)
    assert document["fused_ops"]["add_rms_norm_dynamic_quant"] == 1, "layer 0's post-attention norm feeds gate_up"
    assert set(document["kernels_per_step"]) == {"graph", "eager"}
    profile = Path(document["profile"]["dir"])
    assert profile.parent.parent == tmp_path and (profile / "kernel_details.csv").is_file()
    assert "fusion     " not in captured.err  # --json: the document alone, no text report


def test_the_profile_command_writes_a_profile_and_prints_the_busiest_kernel_types(capsys, tmp_path):
    code = main(["profile", *SMALL, "--profile-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    (run_dir,) = list(tmp_path.glob("*_ascend_pt"))
    assert (run_dir / "ASCEND_PROFILER_OUTPUT" / "op_statistic.csv").is_file()
    assert "top kernel types by device time" in captured.out and "fusion     " in captured.out


def test_an_unknown_quantization_is_bad_input(capsys):
    assert main(["run", *SMALL, "--quantization", "int4"]) == 2
    assert "invalid choice: 'int4'" in capsys.readouterr().err
