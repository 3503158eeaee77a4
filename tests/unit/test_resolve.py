"""docs/semantics.md §3 (Ascend resolution pipeline) and §4 (attention narrowing), table-driven."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ascendgraph import (
    AttentionGraphSupport as S,
    CompilationMode,
    ConfigError,
    GraphConfig,
    GraphMode as M,
    GraphModeError,
    XliteConfigError,
    narrow_for_attention,
    resolve,
)
from ascendgraph.errors import LAUNCH_BLOCKING_MESSAGE

SIZES = [1, 2, 4, 8, 16]


def cfg(**kwargs) -> GraphConfig:
    return GraphConfig.from_vllm_args(**kwargs)


def run(mode=None, env=None, support=None, **kwargs):
    comp = dict(kwargs.pop("compilation_config", {}))
    if mode is not None:
        comp["cudagraph_mode"] = mode
    return resolve(cfg(compilation_config=comp, **kwargs), env=env or {}, attention_support=support)


# ---------------------------------------------------------------- §4 narrowing

NARROW_CASES = [
    # id, mode, support, kwargs, expected mode, message fragment or None
    ("NONE stays NONE", M.NONE, S.NEVER, {}, M.NONE, None),
    ("PIECEWISE never changed", M.PIECEWISE, S.NEVER, {}, M.PIECEWISE, None),
    ("FULL with ALWAYS stays", M.FULL, S.ALWAYS, {}, M.FULL, None),
    ("FULL + UNIFORM_BATCH, split -> F&P", M.FULL, S.UNIFORM_BATCH, dict(attention_split=True), M.FULL_AND_PIECEWISE,
     "CUDAGraphMode.FULL is not supported with attention backend (support: AttentionCGSupport.UNIFORM_BATCH); "
     "setting cudagraph_mode=FULL_AND_PIECEWISE"),
    ("FULL + UNIFORM_BATCH, no split -> FDO", M.FULL, S.UNIFORM_BATCH, dict(attention_split=False), M.FULL_DECODE_ONLY,
     "setting cudagraph_mode=FULL_DECODE_ONLY"),
    ("FULL + SINGLE_TOKEN, no split -> FDO", M.FULL, S.UNIFORM_SINGLE_TOKEN_DECODE, dict(attention_split=False),
     M.FULL_DECODE_ONLY, "AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE"),
    ("FDO + NEVER, piecewise-compiled -> PIECEWISE", M.FULL_DECODE_ONLY, S.NEVER, dict(attention_split=True),
     M.PIECEWISE, "; setting cudagraph_mode=PIECEWISE because attention is compiled piecewise"),
    ("FDO + NEVER, inductor partition -> PIECEWISE", M.FULL_DECODE_ONLY, S.NEVER,
     dict(attention_split=False, inductor_partition=True), M.PIECEWISE, "because attention is compiled piecewise"),
    ("FDO + NEVER, not compiled piecewise -> NONE", M.FULL_DECODE_ONLY, S.NEVER, dict(attention_split=False),
     M.NONE, "; setting cudagraph_mode=NONE because attention is not compiled piecewise"),
    ("F&P + NEVER without VLLM_COMPILE -> NONE", M.FULL_AND_PIECEWISE, S.NEVER,
     dict(compilation_mode=CompilationMode.NONE), M.NONE, "not compiled piecewise"),
    ("FDO + spec decode + SINGLE_TOKEN, split -> PIECEWISE", M.FULL_DECODE_ONLY, S.UNIFORM_SINGLE_TOKEN_DECODE,
     dict(uniform_decode_query_len=2, attention_split=True), M.PIECEWISE,
     "CUDAGraphMode.FULL_DECODE_ONLY is not supported with spec-decode for attention backend attention "
     "(support: AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); setting cudagraph_mode=PIECEWISE"),
    ("FDO + spec decode + SINGLE_TOKEN, no split -> NONE", M.FULL_DECODE_ONLY, S.UNIFORM_SINGLE_TOKEN_DECODE,
     dict(uniform_decode_query_len=2, attention_split=False), M.NONE, "setting cudagraph_mode=NONE"),
    ("FDO + spec decode + UNIFORM_BATCH stays", M.FULL_DECODE_ONLY, S.UNIFORM_BATCH,
     dict(uniform_decode_query_len=2), M.FULL_DECODE_ONLY, None),
    ("F&P without piecewise capture -> FDO", M.FULL_AND_PIECEWISE, S.ALWAYS,
     dict(piecewise_capture_available=False), M.FULL_DECODE_ONLY, "FULL_DECODE_ONLY"),
    ("PIECEWISE without piecewise capture -> NONE", M.PIECEWISE, S.ALWAYS,
     dict(piecewise_capture_available=False), M.NONE, "NONE"),
]


@pytest.mark.parametrize("mode, support, kwargs, expected, fragment", [c[1:] for c in NARROW_CASES],
                         ids=[c[0] for c in NARROW_CASES])
def test_narrowing_table(mode, support, kwargs, expected, fragment):
    result = narrow_for_attention(mode, support, capture_sizes=SIZES, max_capture_size=16, **kwargs)
    assert result.mode is expected
    if fragment is None:
        assert result.messages == []
    else:
        assert len(result.messages) >= 1
        assert any(fragment in m for m in result.messages)


@pytest.mark.parametrize("mode", [M.FULL, M.FULL_AND_PIECEWISE])
def test_full_mixed_graphs_with_a_never_backend_raise(mode):
    if mode is M.FULL:
        with pytest.raises(GraphModeError, match="please try cudagraph_mode=PIECEWISE, and make sure compilation "
                                                 "mode is VLLM_COMPILE"):
            narrow_for_attention(mode, S.NEVER, capture_sizes=SIZES, max_capture_size=16, backend_name="X")
    else:  # F&P with NEVER: decode FULL -> PIECEWISE when compiled piecewise (mixed is PIECEWISE, step 2 skips)
        assert narrow_for_attention(mode, S.NEVER, capture_sizes=SIZES, max_capture_size=16).mode is M.PIECEWISE


def test_message_names_the_backend():
    result = narrow_for_attention(M.FULL, S.UNIFORM_BATCH, capture_sizes=SIZES, max_capture_size=16,
                                  attention_split=False, backend_name="AscendMLABackend")
    assert result.messages == [
        "CUDAGraphMode.FULL is not supported with AscendMLABackend backend (support: "
        "AttentionCGSupport.UNIFORM_BATCH); setting cudagraph_mode=FULL_DECODE_ONLY"]


ROUNDING_CASES = [
    ("V1 FULL q=2 rounds", M.FULL, dict(uniform_decode_query_len=2), [2, 4, 8, 16], 16),
    ("V1 FDO q=3 rounds", M.FULL_DECODE_ONLY, dict(uniform_decode_query_len=3), [3, 6, 9], 9),
    ("V2 runner skips rounding", M.FULL, dict(uniform_decode_query_len=2, use_v2_model_runner=True), SIZES, 16),
    ("PIECEWISE does not round", M.PIECEWISE, dict(uniform_decode_query_len=2), SIZES, 16),
    ("q=1 does not round", M.FULL, dict(uniform_decode_query_len=1), SIZES, 16),
]


@pytest.mark.parametrize("mode, kwargs, sizes, max_size", [c[1:] for c in ROUNDING_CASES], ids=[c[0] for c in ROUNDING_CASES])
def test_spec_decode_rounding_is_silent(mode, kwargs, sizes, max_size):
    result = narrow_for_attention(mode, S.ALWAYS, capture_sizes=SIZES, max_capture_size=16, **kwargs)
    assert (result.capture_sizes, result.max_capture_size) == (sizes, max_size)
    assert result.messages == []


# ---------------------------------------------------------------- §3 pipeline, step by step

def test_defaults_are_o2_full_and_piecewise_with_recorded_default_decisions():
    r = run()
    assert r.requested_mode is M.FULL_AND_PIECEWISE and r.mode is M.FULL_AND_PIECEWISE
    assert r.compilation_mode is CompilationMode.VLLM_COMPILE
    assert r.decision("default_mode").after == "FULL_AND_PIECEWISE"
    assert r.decision("default_compilation_mode").after == "VLLM_COMPILE"
    assert r.warmups == 1
    assert r.attention_split and not r.npugraph_ex and not r.static_kernel


@pytest.mark.parametrize("level, mode, compilation", [
    (0, M.NONE, CompilationMode.NONE), (1, M.PIECEWISE, CompilationMode.VLLM_COMPILE),
    (2, M.FULL_AND_PIECEWISE, CompilationMode.VLLM_COMPILE), (3, M.FULL_AND_PIECEWISE, CompilationMode.VLLM_COMPILE)])
def test_step2_level_defaults(level, mode, compilation):
    r = run(optimization_level=level)
    assert r.requested_mode is mode and r.mode is mode and r.compilation_mode is compilation


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_a_requested_none_is_reported_as_none_at_every_level(level):
    r = run(M.NONE, optimization_level=level)
    assert r.requested_mode is M.NONE and r.mode is M.NONE and r.decision("default_mode") is None


def test_step1_enforce_eager_wins():
    r = run(M.FULL, enforce_eager=True)
    assert r.mode is M.NONE and r.compilation_mode is CompilationMode.NONE
    assert r.requested_mode is M.FULL
    assert r.decision("enforce_eager").reason in ("enforce_eager turns compilation off",
                                                  "Compilation disabled, using eager mode by default")
    assert any(d.reason == "Compilation disabled, using eager mode by default" for d in r.decisions)
    assert r.capture_sizes == [] and r.max_capture_size == 0


@pytest.mark.parametrize("comp_mode", ["STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE"])
def test_step3_unsupported_compilation_mode_warns_verbatim(comp_mode):
    r = run(M.FULL, compilation_config={"mode": comp_mode})
    expected = f"NPU does not support compilation mode. mode={comp_mode}, action: setting CUDAGraphMode to NONE."
    assert expected in r.warnings
    assert r.compilation_mode is CompilationMode.NONE
    assert r.mode is M.FULL  # only the compilation mode changes


@pytest.mark.parametrize("mode", [M.PIECEWISE, M.FULL_AND_PIECEWISE])
def test_step4_piecewise_without_vllm_compile_becomes_none(mode):
    r = run(mode, compilation_config={"mode": "STOCK_TORCH_COMPILE"})
    assert r.mode is M.NONE
    assert r.decision("piecewise_needs_vllm_compile").before == mode.name


def test_step5_xlite_decode_only_forces_full_decode_only():
    r = run(M.PIECEWISE, additional_config={"xlite_graph_config": {"enabled": True}})
    assert r.mode is M.FULL_DECODE_ONLY
    assert "Falling back to FULL_DECODE_ONLY under xlite decode-only mode" in r.decision("xlite").reason


def test_step5_xlite_full_mode_without_speculation_runs_eagerly():
    r = run(M.FULL, additional_config={"xlite_graph_config": {"enabled": True, "full_mode": True}})
    assert r.mode is M.NONE and r.enforce_eager and r.compilation_mode is CompilationMode.NONE
    assert "ACLGraph has been disabled when speculation is disabled in xlite full mode" in [d.reason for d in r.decisions]


def test_step5_xlite_full_mode_with_mtp_uses_full_decode_only():
    r = run(M.FULL, num_speculative_tokens=1, additional_config={"xlite_graph_config": {"enabled": True, "full_mode": True}})
    assert r.mode is M.FULL_DECODE_ONLY


def test_step5_enforce_eager_still_wins_over_xlite():
    r = run(M.FULL, enforce_eager=True, additional_config={"xlite_graph_config": {"enabled": True}})
    assert r.mode is M.NONE


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_speculative_tokens=2), "Xlite graph mode only support speculative decoding with num_speculative_tokens=1."),
    (dict(pipeline_parallel_size=2), "Xlite graph mode is not compatible with pipeline parallelism. Please set "
                                     "pipeline_parallel_size to 1."),
    (dict(model="tiny-llama", attention_backend="ascend",
          additional_config=None), None),
])
def test_step5_xlite_validation_errors_are_verbatim(kwargs, message):
    add = {"xlite_graph_config": {"enabled": True}}
    if message is None:
        assert run(additional_config=add, **{k: v for k, v in kwargs.items() if k != "additional_config"}).mode \
            is M.FULL_DECODE_ONLY
        return
    with pytest.raises(XliteConfigError) as info:
        run(additional_config=add, **kwargs)
    assert str(info.value) == message
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ConfigError)


def test_step5_xlite_unsupported_architecture():
    model = {"architectures": ["GPT2LMHeadModel"], "num_hidden_layers": 2, "hidden_size": 64,
             "num_attention_heads": 2, "vocab_size": 100}
    with pytest.raises(XliteConfigError, match=r"^GPT2LMHeadModel not supported!$"):
        run(model=model, additional_config={"xlite_graph_config": {"enabled": True}})


def test_step5_xlite_block_size_warns():
    r = run(block_size=256, additional_config={"xlite_graph_config": {"enabled": True}})
    assert any("block_size" in w for w in r.warnings)


POOLING = {"architectures": ["Qwen3ForSequenceClassification"], "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 2, "vocab_size": 100}
ENC_DEC = {"architectures": ["BartForConditionalGeneration"], "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 2, "vocab_size": 100}


@pytest.mark.parametrize("mode, comp, expected", [
    (M.FULL, "VLLM_COMPILE", M.PIECEWISE), (M.FULL_DECODE_ONLY, "VLLM_COMPILE", M.PIECEWISE),
    (M.FULL_AND_PIECEWISE, "VLLM_COMPILE", M.PIECEWISE), (M.FULL, "NONE", M.NONE), (M.PIECEWISE, "VLLM_COMPILE", M.PIECEWISE)])
def test_step6_pooling_models_lose_full_graphs(mode, comp, expected):
    r = run(mode, model=POOLING, compilation_config={"mode": comp})
    assert r.mode is expected
    if mode.has_full_graphs():
        assert f"Pooling models do not support full cudagraphs. Overriding cudagraph_mode to {expected.name}." in r.warnings


@pytest.mark.parametrize("mode, comp, expected", [
    (M.FULL_AND_PIECEWISE, "VLLM_COMPILE", M.PIECEWISE), (M.FULL, "VLLM_COMPILE", M.PIECEWISE),
    (M.FULL_DECODE_ONLY, "NONE", M.NONE), (M.PIECEWISE, "VLLM_COMPILE", M.PIECEWISE), (M.NONE, "VLLM_COMPILE", M.NONE)])
def test_step6_encoder_decoder_fallback(mode, comp, expected):
    r = run(mode, model=ENC_DEC, compilation_config={"mode": comp})
    assert r.mode is expected
    if mode not in (M.NONE, M.PIECEWISE):
        assert f"Encoder-decoder models don't support {mode.name}, fallback to {expected.name}." in r.warnings


def test_step7_ascend_default_max_is_injected_and_can_truncate():
    r = run(M.FULL, max_num_seqs=77)
    assert r.max_capture_size == 72 and r.capture_sizes[-1] == 72
    assert "Truncating max_cudagraph_capture_size to 72" in r.warnings


@pytest.mark.parametrize("seqs, k, max_size", [(40, 3, 160), (200, 3, 512), (16, 0, 16)])
def test_step7_ascend_default_max(seqs, k, max_size):
    r = run(M.FULL_DECODE_ONLY, max_num_seqs=seqs, num_speculative_tokens=k)
    # FULL decode graphs with q > 1 round sizes to multiples of q afterwards
    assert r.max_capture_size <= max_size
    assert max_size - r.max_capture_size < (k + 1) * 16


TP_ALIGN_CASES = [
    (dict(tensor_parallel_size=2, enable_sequence_parallel=True), [2, 4, 8, 16]),
    (dict(tensor_parallel_size=4, enable_shared_expert_dp=True), [4, 8, 16]),
    (dict(tensor_parallel_size=8, enable_dsa_cp=True), [8, 16]),
    (dict(tensor_parallel_size=4), [1, 2, 4, 8, 16]),
    (dict(tensor_parallel_size=1, enable_sequence_parallel=True), [1, 2, 4, 8, 16]),
]


@pytest.mark.parametrize("kwargs, expected", TP_ALIGN_CASES)
def test_step7_tp_alignment_table(kwargs, expected):
    r = run(M.PIECEWISE, compilation_config={"cudagraph_capture_sizes": SIZES}, **kwargs)
    assert r.capture_sizes == expected and r.max_capture_size == expected[-1]


def test_step7_tp_alignment_leaving_nothing_is_an_error():
    with pytest.raises(ConfigError, match="does not contain values that are multiples of tp_size 4"):
        run(M.PIECEWISE, compilation_config={"cudagraph_capture_sizes": [1, 2, 3]},
            tensor_parallel_size=4, enable_sequence_parallel=True)


@pytest.mark.parametrize("mode, pruned", [(M.PIECEWISE, True), (M.FULL_AND_PIECEWISE, True), (M.FULL, False),
                                          (M.FULL_DECODE_ONLY, False)])
def test_step7_a5_prunes_piecewise_modes_to_four_sizes(mode, pruned):
    r = run(mode, soc="A5", compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24, 32]})
    if pruned:
        assert r.capture_sizes == [1, 4, 16, 32] and r.max_capture_size == 32
        assert r.decision("a5_pruning") is not None
    else:
        assert len(r.capture_sizes) == 7


def test_step8_piecewise_modes_disable_npugraph_ex_and_static_kernel():
    r = run(M.PIECEWISE, additional_config={"ascend_compilation_config": {"enable_static_kernel": True}})
    assert (r.npugraph_ex, r.static_kernel, r.super_kernel, r.attention_split) == (False, False, False, True)


def test_step8_full_modes_keep_npugraph_ex_and_kernels_as_configured():
    r = run(M.FULL_DECODE_ONLY, soc="A3", additional_config={"ascend_compilation_config": {"enable_static_kernel": True}})
    assert (r.npugraph_ex, r.static_kernel, r.super_kernel, r.attention_split) == (True, True, True, False)
    r = run(M.FULL, additional_config={"ascend_compilation_config": {
        "enable_static_kernel": True, "enable_super_kernel": False}})
    assert (r.static_kernel, r.super_kernel) == (True, False)
    r = run(M.FULL, additional_config={"ascend_compilation_config": {"enable_npugraph_ex": False}})
    assert r.npugraph_ex is False


def test_step7a_a2_turns_super_kernel_off_with_a_warning_and_keeps_static_kernels():
    # CANN's super-kernel API (aclskScopeBegin / aclskOptimize) is Atlas A3 only
    r = run(M.FULL_DECODE_ONLY, soc="A2", additional_config={"ascend_compilation_config": {"enable_static_kernel": True}})
    assert (r.npugraph_ex, r.static_kernel, r.super_kernel) == (True, True, False)
    assert r.warnings == ["Super kernel is not supported on Atlas A2 (CANN's super-kernel API is Atlas A3 only). "
                          "Disabling it."]
    assert [d.rule for d in r.decisions if "super_kernel" in str(d.after)] == ["soc_310p"]


def test_step8_310p_disables_everything_with_warnings():
    r = run(M.FULL, soc="310P", additional_config={"ascend_compilation_config": {"enable_static_kernel": True}})
    assert (r.npugraph_ex, r.static_kernel, r.super_kernel) == (False, False, False)
    assert "npugraph_ex is not supported on Ascend 310P. Disabling it." in r.warnings
    assert "Static kernel is not supported on Ascend 310P. Disabling it." in r.warnings


@pytest.mark.parametrize("acc, message", [
    ({"enable_npugraph_ex": False, "enable_static_kernel": True}, "Static kernel generation requires npugraph_ex to be enabled."),
    ({"enable_super_kernel": True}, "Super kernel generation requires static kernel to be enabled"),
])
def test_step8_kernel_chain_errors_are_verbatim(acc, message):
    with pytest.raises(ConfigError) as info:
        run(M.FULL, additional_config={"ascend_compilation_config": acc})
    assert str(info.value) == message


@pytest.mark.parametrize("value, raises", [("1", True), (" 1 ", True), ("0", False), ("", False), ("true", False)])
def test_step9_launch_blocking(value, raises):
    if raises:
        with pytest.raises(ConfigError) as info:
            run(M.FULL, env={"ASCEND_LAUNCH_BLOCKING": value})
        assert str(info.value) == LAUNCH_BLOCKING_MESSAGE
        assert str(info.value).startswith("ACL graph is incompatible with ASCEND_LAUNCH_BLOCKING=1. Please unset "
                                          "ASCEND_LAUNCH_BLOCKING or set it to 0.")
    else:
        assert run(M.FULL, env={"ASCEND_LAUNCH_BLOCKING": value}).mode is M.FULL


def test_step9_launch_blocking_is_fine_when_graphs_are_off():
    assert run(M.FULL, enforce_eager=True, env={"ASCEND_LAUNCH_BLOCKING": "1"}).mode is M.NONE


def test_step9_reads_the_process_environment_when_env_is_none(monkeypatch):
    monkeypatch.setenv("ASCEND_LAUNCH_BLOCKING", "1")
    with pytest.raises(ConfigError):
        resolve(cfg(compilation_config={"cudagraph_mode": "FULL"}))


@pytest.mark.parametrize("mode, warns", [(M.FULL, True), (M.FULL_DECODE_ONLY, True), (M.FULL_AND_PIECEWISE, True),
                                         (M.PIECEWISE, False)])
def test_step10_context_parallel_with_full_graphs_warns(mode, warns):
    r = run(mode, decode_context_parallel_size=2)
    assert any("context parallelism" in w for w in r.warnings) is warns
    assert r.mode is mode


@pytest.mark.parametrize("backend, mode, expected", [
    ("mla", M.FULL, M.FULL_DECODE_ONLY), ("sfa", M.FULL, M.FULL_DECODE_ONLY), ("dsa", M.FULL, M.FULL_DECODE_ONLY),
    ("gdn", M.FULL, M.FULL_DECODE_ONLY), ("ascend", M.FULL, M.FULL), ("mla", M.FULL_AND_PIECEWISE, M.FULL_AND_PIECEWISE),
    ("never", M.PIECEWISE, M.PIECEWISE), ("never", M.FULL_DECODE_ONLY, M.NONE),
    ("never", M.FULL_AND_PIECEWISE, M.PIECEWISE)])
def test_step11_attention_narrowing_per_backend(backend, mode, expected):
    assert run(mode, attention_backend=backend).mode is expected


def test_step11_full_with_a_never_backend_is_rejected():
    with pytest.raises(GraphModeError, match="NeverGraphBackend"):
        run(M.FULL, attention_backend="never")


def test_step11_narrowing_decision_carries_the_upstream_message():
    r = run(M.FULL, attention_backend="mla")
    d = r.decision("attention_narrowing")
    assert (d.before, d.after) == ("FULL", "FULL_DECODE_ONLY")
    assert "CUDAGraphMode.FULL is not supported with AscendMLABackend backend" in d.reason


def test_step11_spec_decode_rounding_is_a_silent_decision():
    r = run(M.FULL_DECODE_ONLY, num_speculative_tokens=1, compilation_config={"cudagraph_capture_sizes": [1, 3, 8]})
    assert r.capture_sizes == [2, 4, 8]
    d = r.decision("spec_decode_rounding")
    assert d is not None and d.after == "[2, 4, 8]"
    assert not any("round" in w for w in r.warnings)


@pytest.mark.parametrize("mine, others, expected", [
    (M.FULL_AND_PIECEWISE, [M.FULL_DECODE_ONLY], M.FULL_DECODE_ONLY),
    (M.FULL_AND_PIECEWISE, [M.PIECEWISE], M.PIECEWISE),
    (M.FULL, [M.FULL_AND_PIECEWISE], M.FULL_AND_PIECEWISE),
    (M.FULL, [M.NONE], M.NONE),
    (M.FULL_DECODE_ONLY, [M.PIECEWISE], M.NONE),  # (PIECEWISE, NONE) is no member
    (M.PIECEWISE, [], M.PIECEWISE),
])
def test_step12_data_parallel_ranks_agree_on_the_minimum(mine, others, expected):
    r = resolve(cfg(compilation_config={"cudagraph_mode": mine.name}), env={}, other_rank_modes=others)
    assert r.mode is expected


def test_step13_flags_follow_the_final_mode():
    r = run(M.FULL_DECODE_ONLY, attention_backend="never")  # narrowed to NONE
    assert r.mode is M.NONE
    assert (r.npugraph_ex, r.static_kernel, r.capture_sizes, r.max_capture_size) == (False, False, [], 0)
    assert r.compilation_mode is CompilationMode.NONE


def test_every_decision_names_its_rule_and_reason():
    r = run(M.FULL, attention_backend="mla", max_num_seqs=77, soc="310P")
    assert r.decisions
    for d in r.decisions:
        assert d.rule and d.reason and d.before != d.after


def test_resolve_rejects_something_that_is_not_a_config():
    with pytest.raises(ConfigError, match="GraphConfig"):
        resolve({"cudagraph_mode": "FULL"})  # type: ignore[arg-type]


# ---------------------------------------------------------------- property: only config errors escape

MODES = [m.name for m in M] + [None]


@settings(max_examples=300, deadline=None)
@given(
    mode=st.sampled_from(MODES), level=st.integers(0, 3), eager=st.booleans(),
    seqs=st.integers(1, 600), tokens=st.integers(1, 20000), k=st.integers(0, 4),
    tp=st.sampled_from([1, 2, 3, 4, 8]), dp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]),
    sp=st.booleans(), soc=st.sampled_from(["A2", "A3", "310P", "A5"]),
    backend=st.sampled_from(["ascend", "mla", "sfa", "never"]),
    sizes=st.one_of(st.none(), st.lists(st.integers(1, 1024), min_size=1, max_size=12)),
    max_size=st.one_of(st.none(), st.integers(1, 1024)),
    comp_mode=st.sampled_from([None, "NONE", "VLLM_COMPILE", "STOCK_TORCH_COMPILE"]),
    xlite=st.booleans(), full_mode=st.booleans(), static=st.booleans(), npugraph_ex=st.booleans(),
    launch_blocking=st.sampled_from(["0", "1"]),
)
def test_resolve_only_raises_config_or_graph_mode_errors(mode, level, eager, seqs, tokens, k, tp, dp, pp, sp, soc,
                                                          backend, sizes, max_size, comp_mode, xlite, full_mode,
                                                          static, npugraph_ex, launch_blocking):
    comp: dict = {}
    if mode:
        comp["cudagraph_mode"] = mode
    if comp_mode:
        comp["mode"] = comp_mode
    if sizes is not None:
        comp["cudagraph_capture_sizes"] = sizes
    if max_size is not None:
        comp["max_cudagraph_capture_size"] = max_size
    add = {"xlite_graph_config": {"enabled": xlite, "full_mode": full_mode},
           "ascend_compilation_config": {"enable_static_kernel": static, "enable_npugraph_ex": npugraph_ex}}
    try:
        config = cfg(compilation_config=comp, additional_config=add, optimization_level=level, enforce_eager=eager,
                     max_num_seqs=seqs, max_num_batched_tokens=tokens, num_speculative_tokens=k,
                     tensor_parallel_size=tp, data_parallel_size=dp, pipeline_parallel_size=pp,
                     enable_sequence_parallel=sp, soc=soc, attention_backend=backend)
        result = resolve(config, env={"ASCEND_LAUNCH_BLOCKING": launch_blocking})
    except (ConfigError, GraphModeError) as exc:
        assert str(exc)
        return
    assert result.mode in set(M)
    if result.mode is M.NONE:
        assert result.capture_sizes == [] and result.max_capture_size == 0
    else:
        assert result.capture_sizes == sorted(set(result.capture_sizes))
        assert result.max_capture_size == (result.capture_sizes[-1] if result.capture_sizes else 0)
        assert result.max_capture_size <= tokens
    if result.mode.requires_piecewise_compilation():
        assert result.compilation_mode is CompilationMode.VLLM_COMPILE and not result.npugraph_ex


# mutants of resolve.py's rules (docs/testing.md "Mutation testing")


def test_a_configuration_with_capture_sizes_gets_no_no_capture_sizes_decision():
    # resolve.py `_rule_no_capture_sizes`: `mode is NONE or s.capture_sizes` -> `and` added a
    # "nothing captured" decision and warning to every run, the default one included
    from ascendgraph.config import GraphConfig
    from ascendgraph.resolve import resolve

    default = resolve(GraphConfig())
    assert [d.rule for d in default.decisions] == ["default_compilation_mode", "default_mode", "capture_sizes",
                                                   "backend_setup"]
    assert default.warnings == [] and len(default.capture_sizes) == 35
    eager = resolve(GraphConfig(enforce_eager=True))
    assert "no_capture_sizes" not in [d.rule for d in eager.decisions]


def test_full_graphs_without_context_parallelism_get_no_context_parallel_warning():
    # resolve.py `_rule_context_parallel`: `pcp > 1` -> `>= 1` warned every FULL run
    from ascendgraph.config import GraphConfig
    from ascendgraph.modes import GraphMode as Mode
    from ascendgraph.resolve import resolve

    assert resolve(GraphConfig(cudagraph_mode=Mode.FULL)).warnings == []
    warned = resolve(GraphConfig(cudagraph_mode=Mode.FULL, decode_context_parallel_size=2)).warnings
    assert any("context parallel" in w.lower() or "dcp" in w.lower() for w in warned), warned


def test_a_device_profile_narrows_the_piecewise_size_limit_and_keeps_the_socs_own():
    # resolve.py `Capabilities.of`: `v is not None` -> `is None` lost both limits
    from types import SimpleNamespace

    from ascendgraph.resolve import Capabilities
    from ascendgraph.resolve import A5_MAX_PIECEWISE_SIZES

    assert Capabilities.of("A2", SimpleNamespace(max_piecewise_sizes=6)).max_piecewise_sizes == 6
    assert Capabilities.of("A5", SimpleNamespace()).max_piecewise_sizes == A5_MAX_PIECEWISE_SIZES
    assert Capabilities.of("A5", SimpleNamespace(max_piecewise_sizes=2)).max_piecewise_sizes == 2
    assert Capabilities.of("A2", SimpleNamespace()).max_piecewise_sizes is None
