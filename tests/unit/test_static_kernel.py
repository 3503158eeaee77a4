"""Static kernels: the decode sizes, the launches of a graph, the cached build and its warning, the sim."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import sim  # noqa: F401
from ascendgraph.compile.static_kernel import (
    CACHE_DIR_ENV,
    STATIC_KERNEL_BUILD_WARNING,
    StaticKernelStage,
    build_static_kernels,
    cache_root,
    collect_signatures,
    static_sizes,
)
from ascendgraph.config import GraphConfig
from ascendgraph.runtime.engine import Engine, EngineOptions
from ascendgraph.runtime.workload import WorkloadSpec

ag = torch.ops.ascendgraph
FLAGS = {"npugraph_ex": True, "static_kernel": True, "super_kernel": False}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


@pytest.mark.parametrize(
    "sizes, q, max_num_seqs, expected",
    [
        ([1, 2, 4, 8, 16], 1, 4, [1, 2, 4]),
        ([1, 2, 4, 8, 16], 2, 4, [2, 4, 8]),
        ([16, 8, 4], 1, 256, [4, 8, 16]),
        ([3, 5], 4, 1, []),
    ],
)
def test_static_sizes_are_the_capture_sizes_between_q_and_q_times_max_num_seqs(sizes, q, max_num_seqs, expected):
    assert static_sizes(sizes, q, max_num_seqs) == expected


def test_the_cache_root_is_the_environment_variable_or_the_home_cache():
    assert cache_root({CACHE_DIR_ENV: "/tmp/x"}) == Path("/tmp/x")
    assert cache_root({}) == Path.home() / ".cache" / "ascendgraph"


def _graph():
    def fn(x, w, r):
        tokens = x.shape[0]
        y = ag.rms_norm(x + r, w, 1e-6)
        return torch.mm(y.view(tokens, 16), torch.ones(16, 8)), torch.empty_like(y)

    return make_fx(fn, tracing_mode="symbolic")(torch.randn(3, 16), torch.ones(16), torch.randn(3, 16))


def test_signatures_are_the_kernel_launches_at_each_size_without_views_or_allocations():
    signatures = collect_signatures(_graph(), [1, 4])
    ops = {(s.op, s.num_tokens) for s in signatures}
    assert ops == {
        (op, size)
        for size in (1, 4)
        for op in ("aten.add.Tensor", "ascendgraph.rms_norm.default", "aten.mm.default")
    }
    (mm,) = [s for s in signatures if s.op == "aten.mm.default" and s.num_tokens == 4]
    assert mm.input_shapes == ((4, 16), (16, 8)) and mm.input_dtypes == ("float32", "float32")


def test_the_first_build_warns_with_its_directory_and_a_reused_build_is_silent(tmp_path):
    signatures = collect_signatures(_graph(), [1, 2])
    with pytest.warns(UserWarning) as caught:
        build = build_static_kernels(signatures, sizes=[1, 2], flags=FLAGS)
    messages = [str(w.message) for w in caught if "static kernel" in str(w.message)]
    assert messages == [STATIC_KERNEL_BUILD_WARNING.format(path=build.directory)]
    assert messages[0] == f"Starting static kernel compilation, the build directory is {build.directory}"
    assert build.directory.parent == tmp_path / "cache" / "static_kernels" and not build.reused
    manifest = json.loads((build.directory / "manifest.json").read_text())
    assert manifest["key"] == build.key and len(manifest["kernels"]) == len(signatures)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = build_static_kernels(signatures, sizes=[1, 2], flags=FLAGS)
    assert again.reused and again.directory == build.directory


def test_the_build_key_hashes_the_torch_version_the_flags_and_the_shapes(monkeypatch):
    signatures = collect_signatures(_graph(), [1, 2])
    with pytest.warns(UserWarning):
        base = build_static_kernels(signatures, sizes=[1, 2], flags=FLAGS)
        other_flags = build_static_kernels(signatures, sizes=[1, 2], flags={**FLAGS, "super_kernel": True})
        other_shapes = build_static_kernels(collect_signatures(_graph(), [1, 2, 4]), sizes=[1, 2, 4], flags=FLAGS)
        monkeypatch.setattr(torch, "__version__", "0.0.0-other")
        other_torch = build_static_kernels(signatures, sizes=[1, 2], flags=FLAGS)
    directories = {b.directory for b in (base, other_flags, other_shapes, other_torch)}
    assert len(directories) == 4 and not any(b.reused for b in (other_flags, other_shapes, other_torch))


def test_a_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    signatures = collect_signatures(_graph(), [1])

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.warns(UserWarning), pytest.raises(OSError):
        build_static_kernels(signatures, sizes=[1], flags=FLAGS)
    root = tmp_path / "cache" / "static_kernels"
    assert list(root.iterdir()) == []


def test_a_stage_whose_cache_cannot_be_written_runs_without_static_kernels(tmp_path, caplog):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    stage = StaticKernelStage(sizes=(1,), flags=FLAGS, cache_dir=blocker)
    with pytest.warns(UserWarning):
        assert stage(_graph()) == 0
    assert stage.builds == [] and "static kernel build failed" in caplog.text


# --------------------------------------------------------------------------- through the engine


def _engine(tmp_path, *, static: bool, super_kernel: bool = False, dtype: str = "bfloat16") -> Engine:
    acc = {"enable_static_kernel": static, "enable_super_kernel": super_kernel} if static else {}
    config = GraphConfig.from_vllm_args(
        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]},
        additional_config={"ascend_compilation_config": acc} if acc else None,
        num_layers=2, max_num_seqs=4, max_num_batched_tokens=16,
    )
    workload = WorkloadSpec(num_requests=2, seed=0, prompt_words=(3, 5), output_tokens=(2, 3))
    return Engine(config, EngineOptions(device="sim", workload_spec=workload, dtype=dtype, num_threads=1))


def _full_graph_tasks(engine: Engine) -> list:
    return [t for e in engine.capture_state.entries() for seg in e.graph.program.segments for t in seg.tasks]


def _static_messages(caught) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("Starting static kernel compilation")]


def test_the_engine_builds_once_reuses_silently_and_captures_cheaper_static_kernels(tmp_path):
    """One test over three captured engines (the expensive part): without static kernels, with
    them (the first build), with them again (the cache is reused)."""
    plain = _engine(tmp_path, static=False)
    plain.capture()
    with warnings.catch_warnings(record=True) as first_warnings:
        warnings.simplefilter("always")
        static = _engine(tmp_path, static=True)
        static.capture()
    with warnings.catch_warnings(record=True) as reuse_warnings:
        warnings.simplefilter("always")
        reused = _engine(tmp_path, static=True)
        reused.capture()

    # the warning on the first build only
    build = static.static_kernels.build
    assert _static_messages(first_warnings) == [STATIC_KERNEL_BUILD_WARNING.format(path=build.directory)]
    assert _static_messages(reuse_warnings) == []
    assert reused.static_kernels.build.reused and reused.static_kernels.build.directory == build.directory
    assert build.sizes == (1, 2, 4)

    # graphs captured after the build run static kernels, which cost less
    tasks = _full_graph_tasks(static)
    assert [t for t in tasks if "static_kernel" in t.name], "the captured FULL graphs run static kernels"
    assert all(t.op_type.endswith("_static_kernel") for t in tasks if "static_kernel" in t.name)
    assert "paged_attention" in {t.op_type for t in tasks}, "attention's lengths change every step: not static"
    assert "mm_static_kernel" in {t.op_type for t in tasks}
    plain_time = sum(e.graph.device_time_us() for e in plain.capture_state.entries())
    static_time = sum(e.graph.device_time_us() for e in static.capture_state.entries())
    assert static_time < plain_time
    assert len(_full_graph_tasks(plain)) == len(tasks), "static kernels replace launches one for one"

    # and the results are unchanged
    static.serve()
    report = static.report()
    assert report.ok and report.max_abs_diff_vs_eager == 0.0
    assert report.extensions["static_kernel"]["kernels"] == len(build.kernels)
    for engine in (plain, static, reused):
        engine.close()


@pytest.mark.filterwarnings("ignore:Starting static kernel compilation")
def test_a_static_kernel_engine_takes_its_traced_graph_from_the_cache_and_installs_the_same_kernels(
        tmp_path, monkeypatch, caplog):
    # The static-kernel stage only reads the graph (ascendgraph.compile.cache.GRAPH_READERS): the
    # traced entry keeps the launches it read, and a hit builds (reuses) and installs from them
    # without Dynamo. An entry without them is traced again; other capture sizes are another entry.
    import pickle

    from ascendgraph.compile.backend import AscendGraphBackend
    from ascendgraph.compile.cache import TRACED_SUBDIR

    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    calls: list[int] = []
    original = AscendGraphBackend.__call__
    monkeypatch.setattr(AscendGraphBackend, "__call__",
                        lambda self, gm, inputs: calls.append(1) or original(self, gm, inputs))
    first = _engine(tmp_path, static=True)
    first.capture()
    assert first.compiled.traced_cache == "miss" and calls == [1]
    again = _engine(tmp_path, static=True)
    again.capture()
    assert again.compiled.traced_cache == "hit" and calls == [1], "the second engine traced again"
    assert again.static_kernels.build.reused and again.static_kernels.build.kernels == first.static_kernels.build.kernels
    assert [t.op_type for t in _full_graph_tasks(again)] == [t.op_type for t in _full_graph_tasks(first)]
    assert "mm_static_kernel" in {t.op_type for t in _full_graph_tasks(again)}
    again.serve()
    assert again.report().ok and again.report().max_abs_diff_vs_eager == 0.0

    [entry] = (tmp_path / "compile" / TRACED_SUBDIR).glob("*.pkl")
    document = pickle.loads(entry.read_bytes())
    document["readers"] = {}  # an entry that kept nothing for the static stage
    entry.write_bytes(pickle.dumps(document))
    with caplog.at_level("WARNING", logger="ascendgraph"):
        broken = _engine(tmp_path, static=True)
        broken.capture()
    assert broken.compiled.traced_cache == "miss" and calls == [1, 1]
    assert broken.static_kernels.build.kernels == first.static_kernels.build.kernels
    assert "not used (the traced entry keeps nothing for static_kernel); tracing instead" in caplog.text

    config = GraphConfig.from_vllm_args(
        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2]},
        additional_config={"ascend_compilation_config": {"enable_static_kernel": True}},
        num_layers=2, max_num_seqs=4, max_num_batched_tokens=16,
    )
    other = Engine(config, EngineOptions(device="sim", workload_spec=WorkloadSpec(num_requests=1, seed=0),
                                         dtype="bfloat16", num_threads=1))
    other.capture()
    assert other.compiled.traced_cache == "miss" and other.static_kernels.build.sizes == (1, 2)
    assert len(list((tmp_path / "compile" / TRACED_SUBDIR).glob("*.pkl"))) == 2
    for engine in (first, again, broken, other):
        engine.close()


def test_signatures_round_trip_as_plain_lists_and_anything_else_is_refused():
    from ascendgraph.compile.static_kernel import KernelSignature, signatures_from_plain, signatures_to_plain

    signatures = [KernelSignature("aten.mm.default", ((4, 8), (8, 16)), ("torch.bfloat16", "torch.bfloat16"), 4)]
    plain = signatures_to_plain(signatures)
    assert json.loads(json.dumps(plain)) == plain and signatures_from_plain(plain) == signatures
    assert signatures_to_plain(None) is None and signatures_from_plain(None) is None
    for bad in ({}, [["aten.mm.default", [], []]], [[1, [], [], 4]], [["op", [], [], "4"]]):
        with pytest.raises(ValueError):
            signatures_from_plain(bad)
