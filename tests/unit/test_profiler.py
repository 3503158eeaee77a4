"""Ascend-format profiles: exact CSV columns, rows consistent with the run, a loadable trace."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ascendgraph.config import GraphConfig
from ascendgraph.runtime.engine import Engine, EngineOptions
from ascendgraph.errors import ConfigError
from ascendgraph.runtime.profiler import (
    KERNEL_DETAILS_COLUMNS,
    OP_STATISTIC_COLUMNS,
    KernelCounter,
    accelerator_core,
    profile_run,
    write_profile,
)
from ascendgraph.runtime.workload import WorkloadSpec
from sim.device import KernelRecord, TraceSpan


def _record(name, op_type, start, duration, *, stream=0, graph=None, block_dim=2):
    return KernelRecord(name, op_type, stream, start, duration, ((4, 16), (16,)), ("bfloat16", "float32"),
                        ((4, 16),), ("bfloat16",), graph, 64.0, 128.0, block_dim)


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    return rows[0], [dict(zip(rows[0], row)) for row in rows[1:]]


RECORDS = [
    _record("aten.mm.default", "mm", 100.0, 4.0, graph="graph#1"),
    _record("ascendgraph.rms_norm.default", "rms_norm", 104.0, 1.0, graph="graph#1"),
    _record("aten.mm.default", "mm", 110.0, 2.0, graph="graph#1"),
    _record("aten.add.Tensor", "add", 200.0, 1.5, stream=3),
]
SPANS = [TraceSpan("replay", "replay graph#1", 0, 100.0, 12.0, "graph#1"),
         TraceSpan("wait", "wait external event#1", 0, 105.0, 5.0, "graph#1"),
         TraceSpan("task_update", "update task group 0 of graph#1", 2, 106.0, 2.0, "graph#1"),
         TraceSpan("capture", "capture graph#1", 1, 10.0, 50.0, "graph#1")]


@pytest.fixture()
def written(tmp_path):
    return write_profile(tmp_path, RECORDS, step_ids=[7, 7, 7, 8], spans=SPANS, stream_names={0: "stream 0"})


def test_the_files_land_in_a_torch_npu_shaped_run_directory(written, tmp_path):
    assert written.run_dir.parent == tmp_path and written.run_dir.name.endswith("_ascend_pt")
    assert sorted(p.name for p in written.output_dir.iterdir()) == [
        "kernel_details.csv", "op_statistic.csv", "trace_view.json"
    ]
    assert [p.name for p in tmp_path.iterdir()] == [written.run_dir.name], "no staging directory left"


def test_csv_headers_are_exactly_the_semantics_columns(written):
    assert _read(written.op_statistic)[0] == list(OP_STATISTIC_COLUMNS) == [
        "Device_id", "OP Type", "Core Type", "Count", "Total Time(us)", "Avg Time(us)", "Min Time(us)",
        "Max Time(us)", "Ratio(%)",
    ]
    assert _read(written.kernel_details)[0] == list(KERNEL_DETAILS_COLUMNS) == [
        "Step Id", "Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)",
        "Wait Time(us)", "Block Dim", "Mix Block Dim", "Input Shapes", "Input Data Types", "Input Formats",
        "Output Shapes", "Output Data Types", "Output Formats",
    ]


def test_op_statistic_groups_by_type_with_count_total_average_min_max_and_ratio(written):
    _, rows = _read(written.op_statistic)
    by_type = {row["OP Type"]: row for row in rows}
    mm = by_type["mm"]
    assert (mm["Core Type"], mm["Count"], mm["Total Time(us)"], mm["Avg Time(us)"], mm["Min Time(us)"],
            mm["Max Time(us)"]) == ("AI_CORE", "2", "6.000", "3.000", "2.000", "4.000")
    assert [row["OP Type"] for row in rows] == ["mm", "add", "rms_norm"], "sorted by total time"
    assert sum(int(row["Count"]) for row in rows) == len(RECORDS)
    assert sum(float(row["Ratio(%)"]) for row in rows) == pytest.approx(100.0, abs=0.02)


def test_kernel_details_has_one_row_per_launch_with_waits_per_stream(written):
    _, rows = _read(written.kernel_details)
    assert [row["Name"] for row in rows] == [r.name for r in RECORDS]
    assert [row["Step Id"] for row in rows] == ["7", "7", "7", "8"]
    assert [row["Wait Time(us)"] for row in rows] == ["0.000", "0.000", "5.000", "0.000"]
    first = rows[0]
    assert (first["Block Dim"], first["Mix Block Dim"], first["Input Shapes"], first["Input Data Types"],
            first["Input Formats"], first["Output Shapes"]) == ("2", "0", "4,16;16", "DT_BF16;FLOAT", "ND;ND", "4,16")


def test_trace_view_has_one_kernel_span_per_record_and_replays_around_their_kernels(written):
    trace = json.loads(written.trace_view.read_text())
    events = trace["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert len(kernels) == len(RECORDS) and all(e["ph"] == "X" for e in kernels)
    (replay,) = [e for e in events if e.get("cat") == "replay"]
    inside = [k for k in kernels if k["args"]["graph"] == "graph#1"]
    assert all(k["tid"] == replay["tid"] and replay["ts"] <= k["ts"] and k["ts"] + k["dur"] <= replay["ts"] + replay["dur"]
               for k in inside)
    assert {e["cat"] for e in events if e["ph"] == "X"} == {"kernel", "replay", "wait", "task_update", "capture", "step"}
    names = {(e["tid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert (0, "stream 0") in names and (3, "stream 3") in names, "one named track per stream"


def test_a_failure_while_writing_leaves_no_partial_profile(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("ascendgraph.profile_formats.json.dumps", broken)
    with pytest.raises(OSError):
        write_profile(tmp_path, RECORDS)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "op_type, core",
    [("mm", "AI_CORE"), ("mm_static_kernel", "AI_CORE"), ("paged_attention", "MIX_AIC"), ("SuperKernel", "MIX_AIC"),
     ("add_rms_norm", "AI_VECTOR_CORE")],
)
def test_kernels_are_placed_on_cube_vector_or_mixed_cores(op_type, core):
    assert accelerator_core(op_type) == core


def test_kernels_per_step_averages_the_decode_steps_or_all_steps_without_any():
    counter = KernelCounter(device=None)
    counter.steps = [("prefill", 40, 60), ("decode", 10, 30), ("decode", 12, 30)]
    assert counter.per_step() == {"graph": 11.0, "eager": 30.0}
    counter.steps = [("prefill", 40, 60), ("mixed", 20, 60)]
    assert counter.per_step() == {"graph": 30.0, "eager": 60.0}
    assert KernelCounter(device=None).per_step() == {"graph": None, "eager": None}


# --------------------------------------------------------------------------- a profiled engine run


class _Steps:
    def __init__(self) -> None:
        self.records = []

    def on_step(self, engine, record) -> None:
        self.records.append(record)


def test_a_profiled_run_is_consistent_with_its_steps_and_traces_every_device_activity(tmp_path):
    config = GraphConfig.from_vllm_args(
        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]},
        num_layers=2, max_num_seqs=4, max_num_batched_tokens=16,
    )
    workload = WorkloadSpec(num_requests=3, seed=0, prompt_words=(3, 5), output_tokens=(2, 4))
    engine = Engine(config, EngineOptions(device="sim", workload_spec=workload, num_threads=1))
    log = _Steps()
    engine.observers.append(log)
    with profile_run(engine, tmp_path) as session:
        engine.capture()
        engine.serve()
    output, steps = session.output, log.records
    assert engine.report().ok
    engine.close()

    # one kernel_details row per kernel of the served path, steps in order, op_statistic counts agree
    _, rows = _read(output.kernel_details)
    assert len(rows) == sum(s.graph_kernels for s in steps) == output.kernels > 0
    per_step: dict[str, int] = {}
    for row in rows:
        per_step[row["Step Id"]] = per_step.get(row["Step Id"], 0) + 1
    assert per_step == {str(s.step): s.graph_kernels for s in steps if s.graph_kernels}
    _, stats = _read(output.op_statistic)
    assert sum(int(row["Count"]) for row in stats) == len(rows)

    # the trace: a span per kernel, replays around their kernels, captures, waits and task updates
    events = json.loads(output.trace_view.read_text())["traceEvents"]
    by_cat: dict[str, list] = {}
    for event in events:
        if event["ph"] == "X":
            by_cat.setdefault(event["cat"], []).append(event)
    full_steps = [s for s in steps if s.runtime_mode.name == "FULL"]
    assert len(by_cat["kernel"]) == output.kernels
    assert len(by_cat["replay"]) == len(full_steps) > 0
    assert len(by_cat["capture"]) == engine.capture_state.graphs_captured
    assert len(by_cat["task_update"]) == len(by_cat["wait"]) == 2 * len(full_steps), "one per attention layer"
    def ns(event, key="ts"):  # trace times are whole nanoseconds; compare them exactly, not as float sums
        return round(event[key] * 1000)

    for kernel in by_cat["kernel"]:
        if kernel["args"]["graph"] is None:
            continue
        assert any(r["tid"] == kernel["tid"] and ns(r) <= ns(kernel)
                   and ns(kernel) + ns(kernel, "dur") <= ns(r) + ns(r, "dur")
                   for r in by_cat["replay"]), "every replayed kernel sits inside a replay on its stream"


def test_a_profile_directory_that_cannot_be_created_is_a_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = GraphConfig.from_vllm_args(compilation_config={"cudagraph_mode": "NONE"}, num_layers=1)
    engine = Engine(config, EngineOptions(device="sim", requests=1, num_threads=1))
    with pytest.raises(ConfigError, match="cannot create the profile directory"):
        with profile_run(engine, blocker / "profile"):
            pass
    engine.close()


@pytest.mark.parametrize("recording_before, kept", [(False, False), (True, True)])
def test_the_kernel_counter_drops_only_the_records_it_asked_for(recording_before, kept):
    from types import SimpleNamespace

    import torch

    from sim.device import SimDevice

    device = SimDevice(record_kernels=recording_before)
    engine = SimpleNamespace(device=device, options=SimpleNamespace(check_eager=True), observers=[])
    counter = KernelCounter.attach(engine.device, engine.observers, check_eager=engine.options.check_eager)
    assert engine.observers == [counter] and device.records_kernels
    x = torch.ones(4)
    with device.track_eager():
        x + 1
    assert len(device.kernel_records) == 1
    counter.on_step(engine, SimpleNamespace(kind="decode", graph_kernels=1, eager_kernels=0))
    assert (len(device.kernel_records) == 1) is kept
    with device.profiling("unused"):
        with device.track_eager():
            x + 1
        counter.on_step(engine, SimpleNamespace(kind="decode", graph_kernels=1, eager_kernels=0))
        assert device.kernel_records, "never dropped while a profiling session reads them"


def test_merged_static_kernels_keep_their_op_statistic_rows_and_kernel_details_name_the_super_kernel(tmp_path):
    # The graph-mode guide's check (find static_kernel in op_statistic.csv) on its own example:
    # static kernels on, super kernel on by default.
    import torch

    from sim.cost import task_signature
    from sim.device import SimDevice

    device = SimDevice()
    x, w = torch.randn(4, 16), torch.randn(16, 16)

    def block():
        return torch.relu(torch.mm(x, w)) * 2.0  # mm, relu, mul: three static kernels

    probe = device.new_graph()
    with device.graph(probe):
        block()
    tasks = [t for seg in probe.program.segments for t in seg.tasks]
    device.install_static_kernels({task_signature(t): f"k{i}" for i, t in enumerate(tasks)})
    graph = device.new_graph()
    with device.graph(graph):
        block()
    assert device.super_kernel_optimize(graph) == 1
    with device.profiling(str(tmp_path)) as session:
        graph.replay()
        graph.replay()
        device.synchronize()
    (launch, _) = session.records
    assert launch.op_type == "SuperKernel" and len(launch.members) == 3
    assert sum(m.duration_us for m in launch.members) == pytest.approx(launch.duration_us)
    written = write_profile(tmp_path / "out", session.records, step_ids=[1, 2], spans=[], stream_names={})

    _, statistic = _read(written.op_statistic)
    counts = {row["OP Type"]: int(row["Count"]) for row in statistic}
    assert counts == {"SuperKernel": 2, "mm_static_kernel": 2, "relu_static_kernel": 2, "mul_static_kernel": 2}
    assert any("static_kernel" in row["OP Type"] for row in statistic), "the guide's check finds them"
    ratio = {row["OP Type"]: float(row["Ratio(%)"]) for row in statistic}
    assert ratio["SuperKernel"] == pytest.approx(100.0)
    assert sum(ratio[t] for t in counts if t != "SuperKernel") == pytest.approx(100.0, abs=0.05)

    _, details = _read(written.kernel_details)
    assert [row["Type"] for row in details[:4]] == ["SuperKernel", "mm_static_kernel", "relu_static_kernel",
                                                   "mul_static_kernel"]
    assert len({row["Name"] for row in details}) == 1, "constituents carry the super kernel's name"
    assert details[1]["Start Time(us)"] == details[0]["Start Time(us)"]
    assert all(row["Wait Time(us)"] == "0.000" for row in details[1:4])
    assert details[1]["Input Shapes"] == "4,16;16,16"
