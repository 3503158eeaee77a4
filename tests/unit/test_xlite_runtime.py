"""The xlite runtime behind the device layer (sim stand-in, hw import guard) and `explain`'s xlite section."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
import torch

from ascendgraph import GraphConfig
from ascendgraph.cli.app import main
from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.errors import DeviceUnavailable
from ascendgraph import explain
from ascendgraph.explanation import format_resolution, resolution_to_json
from ascendgraph.forward_context import AttentionMetadata, ForwardContext, set_forward_context
from ascendgraph.models.build import build_model
from ascendgraph.models.presets import PRESETS
from ascendgraph.modes import GraphMode
from ascendgraph.xlite import XliteBudgetExceeded, XliteRuntimeSpec, check_within_budget, describe_xlite

BLOCK = 16
XLITE_ON = {"xlite_graph_config": {"enabled": True}}
XLITE_FULL = {"xlite_graph_config": {"enabled": True, "full_mode": True}}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def sim_device():
    from ascendgraph.device import get_device

    return get_device("sim")


def _spec(budget: int, hidden: int, *, full_mode: bool = False) -> XliteRuntimeSpec:
    return XliteRuntimeSpec(budget=budget, full_mode=full_mode, hidden_size=hidden, dtype=torch.float32,
                            max_num_seqs=4, max_model_len=4096, block_size=BLOCK)


def _prefill_context(model, caches, num_tokens: int, mode: GraphMode = GraphMode.NONE):
    """One request prefilling ``num_tokens`` tokens into blocks 0..n."""
    blocks = (num_tokens + BLOCK - 1) // BLOCK
    metadata = AttentionMetadata(
        num_reqs=1, num_actual_tokens=num_tokens, num_tokens=num_tokens, query_start_loc=[num_tokens],
        seq_lens=[num_tokens], block_table=torch.arange(blocks, dtype=torch.int32).reshape(1, blocks),
        slot_mapping=torch.arange(num_tokens),
    )
    context = ForwardContext(mode, BatchDescriptor(num_tokens), metadata, caches, model.attention_layers)
    ids = torch.arange(3, 3 + num_tokens)
    positions = torch.arange(num_tokens)
    return ids, positions, context


# --------------------------------------------------------------------------- the sim stand-in


def test_the_sim_runtime_preallocates_a_buffer_of_budget_rows(sim_device):
    model = build_model(PRESETS["tiny"].with_layers(1), seed=0)
    runtime = sim_device.xlite_runtime(model, _spec(12, PRESETS["tiny"].hidden_size))
    assert tuple(runtime.hidden_states.shape) == (12, PRESETS["tiny"].hidden_size)
    assert runtime.hidden_states.dtype == torch.float32
    assert runtime.budget == 12


@pytest.fixture()
def float32_kernels_unchecked():
    """This test builds a float32 model (a declared simulator leniency, docs/decisions.md)."""
    from sim.kernels import unchecked

    with unchecked():
        yield


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_the_sim_runtime_writes_the_eager_forward_into_its_own_buffer(sim_device, preset, float32_kernels_unchecked):
    spec = PRESETS[preset].with_layers(2)
    model = build_model(spec, seed=3)
    runtime = sim_device.xlite_runtime(model, _spec(10, spec.hidden_size))
    ids, positions, context = _prefill_context(model, model.make_kv_caches(2, BLOCK), 7)
    with torch.no_grad():
        out = runtime.forward(ids, positions, context)
        ids2, positions2, reference_context = _prefill_context(model, model.make_kv_caches(2, BLOCK), 7)
        with set_forward_context(reference_context):
            reference = model(ids2, positions2)
    assert out.data_ptr() == runtime.hidden_states.data_ptr() and tuple(out.shape) == (7, spec.hidden_size)
    assert torch.equal(out, reference)
    assert runtime.forwards == 1
    # the KV cache it was given was written (the native runnable reads the same cache later)
    assert context.kv_caches[next(iter(context.kv_caches))].key.abs().sum() > 0


def test_the_sim_runtime_refuses_a_batch_over_budget_before_running_anything(sim_device):
    model = build_model(PRESETS["tiny"].with_layers(1), seed=0)
    runtime = sim_device.xlite_runtime(model, _spec(4, PRESETS["tiny"].hidden_size))
    caches = model.make_kv_caches(2, BLOCK)
    ids, positions, context = _prefill_context(model, caches, 5)
    with torch.no_grad(), pytest.raises(XliteBudgetExceeded) as info:
        runtime.forward(ids, positions, context)
    assert "5 tokens" in str(info.value) and "holds 4" in str(info.value) and "native" in str(info.value)
    assert isinstance(info.value, AssertionError)  # a broken invariant, not a user error
    assert runtime.forwards == 0 and not runtime.hidden_states.any()
    assert all(not cache.key.any() for cache in caches.values())


def test_the_sim_runtime_runs_outside_acl_graphs_only(sim_device):
    model = build_model(PRESETS["tiny"].with_layers(1), seed=0)
    runtime = sim_device.xlite_runtime(model, _spec(8, PRESETS["tiny"].hidden_size))
    ids, positions, context = _prefill_context(model, model.make_kv_caches(2, BLOCK), 3, GraphMode.FULL)
    with torch.no_grad(), pytest.raises(ValueError, match="runtime mode must be NONE, got FULL"):
        runtime.forward(ids, positions, context)


def test_a_profile_run_returns_the_preallocated_buffer_itself(sim_device):
    model = build_model(PRESETS["tiny"].with_layers(1), seed=0)
    runtime = sim_device.xlite_runtime(model, _spec(16, PRESETS["tiny"].hidden_size, full_mode=True))
    buffer = runtime.profile_run()
    assert buffer is runtime.hidden_states and runtime.profile_runs == 1 and runtime.forwards == 0


def test_the_budget_guard_names_both_figures():
    check_within_budget(8, 8)
    with pytest.raises(XliteBudgetExceeded, match="9 tokens .* holds 8"):
        check_within_budget(9, 8)


def test_runtime_spec_follows_the_budget_rule():
    config = GraphConfig.from_vllm_args(model="tiny-moe", max_num_batched_tokens=1001, tensor_parallel_size=4,
                                        enable_expert_parallel=True, additional_config=XLITE_FULL)
    spec = XliteRuntimeSpec.from_config(config, dtype=torch.bfloat16)
    assert (spec.budget, spec.full_mode, spec.tensor_parallel_size, spec.enable_expert_parallel) == (1004, True, 4, True)
    assert spec.hidden_size == PRESETS["tiny-moe"].hidden_size and spec.architecture == "Qwen3MoeForCausalLM"


def test_the_device_protocol_names_the_xlite_runtime():
    from ascendgraph.device import Device

    assert "xlite_runtime" in dir(Device)


# --------------------------------------------------------------------------- hw adapter: import guard only (no NPU here)


def test_importing_the_hw_adapter_does_not_import_xlite(monkeypatch):
    monkeypatch.delitem(sys.modules, "xlite", raising=False)
    monkeypatch.delitem(sys.modules, "xlite._C", raising=False)
    monkeypatch.delitem(sys.modules, "hw.xlite", raising=False)
    importlib.import_module("hw.xlite")
    assert "xlite" not in sys.modules and "xlite._C" not in sys.modules


def test_a_missing_xlite_package_is_a_one_line_reason_with_the_fix(monkeypatch):
    import hw.xlite as adapter

    monkeypatch.setitem(sys.modules, "xlite", None)  # import xlite -> ImportError
    reason = adapter.xlite_unavailable_reason()
    assert reason is not None and "\n" not in reason
    assert "pip install xlite" in reason and "xlite_graph_config" in reason
    with pytest.raises(DeviceUnavailable) as info:
        adapter.load_xlite()
    assert str(info.value) == reason


def test_a_broken_xlite_installation_is_reported_with_its_cause(monkeypatch):
    import hw.xlite as adapter

    def broken():
        raise OSError("libxlite.so: cannot open shared object file")

    monkeypatch.setattr(adapter, "_import_xlite", broken)
    reason = adapter.xlite_unavailable_reason()
    assert reason is not None and reason.startswith("importing xlite failed (OSError: libxlite.so")
    assert "xlite_graph_config" in reason


def test_the_npu_runtime_without_xlite_raises_device_unavailable(monkeypatch):
    import hw.xlite as adapter

    monkeypatch.setitem(sys.modules, "xlite", None)
    model = build_model(PRESETS["tiny"].with_layers(1), seed=0)
    with pytest.raises(DeviceUnavailable, match="pip install xlite"):
        adapter.NpuXliteRuntime(None, model, _spec(4, PRESETS["tiny"].hidden_size))  # type: ignore[arg-type]


def test_the_npu_runtime_refuses_mla_models_by_name():
    import hw.xlite as adapter
    from ascendgraph.errors import ConfigError

    model = build_model(PRESETS["tiny-mla"].with_layers(1), seed=0)
    with pytest.raises(ConfigError, match="MHA decoder models only; tiny-mla uses mla attention"):
        adapter.NpuXliteRuntime(None, model, _spec(4, PRESETS["tiny-mla"].hidden_size))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- explain


def test_explain_shows_no_xlite_section_when_it_is_off():
    resolution = explain()
    assert "xlite" not in resolution_to_json(resolution)
    assert "xlite:" not in format_resolution(resolution)
    assert describe_xlite(resolution.config) is None


def test_explain_json_carries_the_xlite_budget_and_routing():
    document = resolution_to_json(explain(max_num_seqs=8, num_speculative_tokens=1, data_parallel_size=2,
                                          additional_config=XLITE_ON))
    xlite = document["xlite"]
    assert (xlite["enabled"], xlite["full_mode"], xlite["mode"], xlite["budget"]) == (True, False, "decode-only", 16)
    assert xlite["data_parallel_size"] == 2
    assert any("more tokens than requests" in rule for rule in xlite["routing"])
    assert document["effective_mode"] == "FULL_DECODE_ONLY"


def test_explain_text_for_full_mode_names_the_budget_rule_and_the_profile_run():
    text = format_resolution(explain(model="tiny-moe", tensor_parallel_size=4, enable_expert_parallel=True,
                                     max_num_batched_tokens=1001, additional_config=XLITE_FULL))
    assert "xlite: full mode, token budget 1004 = max_num_batched_tokens 1001 rounded up to a multiple of tp 4" in text
    assert "profile runs -> xlite" in text
    assert "batches over 1004 tokens -> native" in text
    assert "native = eager" in text  # full mode without speculation: ACLGraph is off


def test_explain_cli_json_has_the_xlite_key(capsys):
    code = main(["explain", "--json", "--additional-config", json.dumps(XLITE_ON)])
    out = capsys.readouterr().out
    assert code == 0
    assert json.loads(out)["xlite"]["budget"] == 256  # max_num_seqs default 256 x (1 + 0)
