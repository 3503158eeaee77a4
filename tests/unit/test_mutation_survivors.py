"""Tests written to kill survivors of the mutation run (docs/testing.md, "Mutation testing")."""

from __future__ import annotations

import pytest

from ascendgraph.errors import ConfigError
from ascendgraph.modes import AttentionGraphSupport, CompilationMode, GraphMode


@pytest.mark.parametrize("enum_type", [GraphMode, CompilationMode, AttentionGraphSupport])
@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_not_an_enum_value_although_it_equals_0_or_1(enum_type, value):
    # modes.py `isinstance(value, int) and not isinstance(value, bool)`: with `or`, True would
    # parse as the member whose value is 1 (PIECEWISE, ...) instead of being refused
    with pytest.raises(ConfigError, match="invalid"):
        enum_type.parse(value)


def test_integers_still_parse_by_value():
    assert CompilationMode.parse(3) is CompilationMode.VLLM_COMPILE
    assert GraphMode.parse("piecewise") is GraphMode.PIECEWISE


# --------------------------------------------------------------------------- 2026-12-02 run (resolve, dispatch)


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


@pytest.mark.parametrize("num_tokens", [True, False, 8.0, "8", -1])
def test_dispatch_refuses_a_token_count_that_is_not_a_non_negative_integer(num_tokens):
    # dispatch.py: `isinstance(n, bool) or not isinstance(n, int) or n < 0` with an `and`
    # let True (an int) or a negative count through
    from ascendgraph.dispatch import GraphDispatcher

    dispatcher = GraphDispatcher(GraphMode.FULL_AND_PIECEWISE, capture_sizes=[1, 2, 4, 8], max_num_seqs=4)
    with pytest.raises(ValueError, match="num_tokens must be an integer >= 0"):
        dispatcher.dispatch(num_tokens)


def test_a_none_mode_dispatcher_has_its_keys_initialised_as_vllms_does():
    # dispatch.py `_initialise_keys`: vLLM 0.32's initialize_cudagraph_keys sets
    # keys_initialized = True before its early exit for NONE; the mutant left it False
    from ascendgraph.dispatch import GraphDispatcher

    dispatcher = GraphDispatcher(GraphMode.NONE, capture_sizes=[], max_num_seqs=4)
    assert dispatcher.keys_initialized is True
    assert dispatcher.dispatch(4)[0] is GraphMode.NONE


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
