"""GraphMode / CompilationMode / AttentionGraphSupport / BatchDescriptor against vLLM 0.32's enums."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("vllm", reason="vLLM is not importable: build the parity env with scripts/parity-env.sh")

import parity_harness as h  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from vllm.config.compilation import CompilationMode as VllmCompilationMode  # noqa: E402
from vllm.config.compilation import CompilationConfig, CUDAGraphMode  # noqa: E402
from vllm.forward_context import BatchDescriptor as VllmBatchDescriptor  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport  # noqa: E402

from ascendgraph.errors import ConfigError  # noqa: E402
from ascendgraph.modes import AttentionGraphSupport, CompilationMode, GraphMode  # noqa: E402

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(h.version_mismatch_reason() is not None, reason=str(h.version_mismatch_reason())),
]

MODE_NAMES = [m.name for m in CUDAGraphMode]
RUNTIME_NAMES = ["NONE", "PIECEWISE", "FULL"]

# (our helper, vLLM's helper) — the same question under our name and under vLLM's.
MODE_HELPERS = [
    ("decode_mode", "decode_mode"),
    ("mixed_mode", "mixed_mode"),
    ("max_mode", "max_cudagraph_mode"),
    ("without_piecewise", "without_piecewise"),
]
MODE_PREDICATES = [
    ("separate_routine", "separate_routine"),
    ("has_full_graphs", "has_full_cudagraphs"),
    ("has_piecewise_graphs", "has_piecewise_cudagraphs"),
    ("requires_piecewise_compilation", "requires_piecewise_compilation"),
]


def test_graph_mode_has_exactly_vllms_members_with_vllms_values():
    ours = {m.name: m.value for m in GraphMode}
    theirs = {m.name: m.value for m in CUDAGraphMode}
    assert ours == theirs


@pytest.mark.parametrize("name", MODE_NAMES)
@pytest.mark.parametrize("ours_helper, vllm_helper", MODE_HELPERS)
def test_mode_valued_helper_agrees_with_vllm(name, ours_helper, vllm_helper):
    ours = getattr(GraphMode[name], ours_helper)()
    theirs = getattr(CUDAGraphMode[name], vllm_helper)()
    assert ours.name == theirs.name, f"{name}.{ours_helper}()"


@pytest.mark.parametrize("name", MODE_NAMES)
@pytest.mark.parametrize("ours_helper, vllm_helper", MODE_PREDICATES)
def test_predicate_agrees_with_vllm(name, ours_helper, vllm_helper):
    ours = getattr(GraphMode[name], ours_helper)()
    theirs = getattr(CUDAGraphMode[name], vllm_helper)()
    assert ours is theirs, f"{name}.{ours_helper}()"


@pytest.mark.parametrize("name", MODE_NAMES)
def test_bool_and_str_agree_with_vllm(name):
    assert bool(GraphMode[name]) is bool(CUDAGraphMode[name])
    assert str(GraphMode[name]) == str(CUDAGraphMode[name]) == name


@pytest.mark.parametrize("name", MODE_NAMES)
@pytest.mark.parametrize("runtime", RUNTIME_NAMES)
def test_has_mode_agrees_with_vllm(name, runtime):
    ours = GraphMode[name]
    if not hasattr(ours, "has_mode"):
        pytest.skip("GraphMode.has_mode is not part of the contract")
    assert ours.has_mode(GraphMode[runtime]) is CUDAGraphMode[name].has_mode(CUDAGraphMode[runtime])


def test_runtime_modes_are_vllms_valid_runtime_modes():
    assert {m.name for m in GraphMode.runtime_modes()} == {
        m.name for m in CUDAGraphMode.valid_runtime_modes()
    }
    assert isinstance(GraphMode.runtime_modes(), frozenset)


@pytest.mark.parametrize("name", MODE_NAMES)
def test_is_runtime_mode_agrees_with_vllm(name):
    ours = GraphMode[name]
    if not hasattr(ours, "is_runtime_mode"):
        pytest.skip("GraphMode.is_runtime_mode is not part of the contract")
    assert ours.is_runtime_mode() is CUDAGraphMode[name].is_valid_runtime_mode()


def test_compilation_modes_match_vllm():
    assert {m.name: int(m) for m in CompilationMode} == {
        m.name: int(m) for m in VllmCompilationMode
    }


def test_attention_support_levels_match_vllm_in_value_and_order():
    assert {m.name: m.value for m in AttentionGraphSupport} == {
        m.name: m.value for m in AttentionCGSupport
    }
    ours = sorted(AttentionGraphSupport, key=lambda m: m.value)
    theirs = sorted(AttentionCGSupport, key=lambda m: m.value)
    assert [m.name for m in ours] == [m.name for m in theirs]


def test_batch_descriptor_has_vllms_fields_and_defaults():
    from ascendgraph.dispatch import BatchDescriptor

    def shape(cls):
        return [(f.name, f.default) for f in dataclasses.fields(cls)]

    assert shape(BatchDescriptor) == shape(VllmBatchDescriptor)


@h.parity_settings
@given(
    num_tokens=st.integers(0, 10_000),
    num_reqs=st.none() | st.integers(0, 1024),
    uniform=st.booleans(),
    has_lora=st.booleans(),
    num_active_loras=st.integers(0, 16),
    other=st.tuples(st.integers(0, 3), st.none() | st.integers(0, 3), st.booleans(), st.booleans(), st.integers(0, 3)),
)
def test_batch_descriptor_equality_and_hash_follow_vllm(num_tokens, num_reqs, uniform, has_lora, num_active_loras, other):
    from ascendgraph.dispatch import BatchDescriptor

    fields = (num_tokens, num_reqs, uniform, has_lora, num_active_loras)
    ours, theirs = BatchDescriptor(*fields), VllmBatchDescriptor(*fields)
    assert h.descriptor_tuple(ours) == h.descriptor_tuple(theirs)
    assert (ours == BatchDescriptor(*fields)) and hash(ours) == hash(BatchDescriptor(*fields))
    assert (ours == BatchDescriptor(*other)) == (theirs == VllmBatchDescriptor(*other))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ours.num_tokens = 1  # type: ignore[misc]


def _random_case(name: str, flips: list[bool]) -> str:
    return "".join(c.lower() if flip else c for c, flip in zip(name, flips + [False] * len(name)))


def _vllm_parses(text: str):
    """vLLM's own parse path: the pydantic validator of CompilationConfig.cudagraph_mode."""
    return h.run(lambda: CompilationConfig(cudagraph_mode=text).cudagraph_mode.name)


def _ours_parses(text: str):
    outcome = h.run(lambda: GraphMode.parse(text).name)
    if outcome.error is not None:
        assert isinstance(outcome.error, ConfigError), "a bad mode name must be a ConfigError"
    return outcome


@h.parity_settings
@given(name=st.sampled_from(MODE_NAMES), flips=st.lists(st.booleans(), max_size=20))
def test_mode_names_parse_case_insensitively_like_vllm(name, flips):
    text = _random_case(name, flips)
    h.assert_same_outcome(_vllm_parses(text), _ours_parses(text), repr(text))


@h.parity_settings
@given(
    text=st.text(alphabet=st.sampled_from("NOEFULDCIPWSAR_ xyz-"), min_size=0, max_size=20)
    .map(str.strip)
)
def test_mode_name_garbage_is_rejected_like_vllm(text):
    # Surrounding whitespace is stripped first: ours tolerates it, vLLM does not (docs/parity.md).
    h.assert_same_outcome(_vllm_parses(text), _ours_parses(text), repr(text))
