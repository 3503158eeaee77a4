"""Config fuzzing: `GraphConfig.from_vllm_args` + `resolve` on generated configurations.

Two properties, each in a default-run profile (a few hundred examples) and a ``-m slow``
profile (10,000 examples):

* any input — valid values, wrong types, negative and huge numbers, unknown keys,
  contradictory flags, garbage JSON — either resolves, or raises ConfigError /
  GraphModeError (nothing else escapes), and the error names a key the input used
  (``ConfigError.key`` or the message);
* one broken key in an otherwise valid configuration: if it is rejected, the error names
  that key.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ascendgraph.config import (
    IGNORED_COMPILATION_KEYS,
    MODELLED_ADDITIONAL_KEYS,
    MODELLED_COMPILATION_KEYS,
    SOCS,
    GraphConfig,
)
from ascendgraph.errors import ConfigError, GraphModeError
from ascendgraph.models.backends import ATTENTION_BACKENDS
from ascendgraph.models.presets import PRESETS
from ascendgraph.modes import CompilationMode, GraphMode
from ascendgraph.resolve import resolve

DEFAULT_EXAMPLES = 500
SLOW_EXAMPLES = 10_000
DEFAULT = settings(max_examples=DEFAULT_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=SLOW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MODE_NAMES = [m.name for m in GraphMode] + [m.name.lower() for m in GraphMode]
COMPILATION_NAMES = [m.name for m in CompilationMode] + [0, 1, 2, 3]

# --------------------------------------------------------------------------- values

NASTY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=3),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["FULL", "piecewise", "O3", "AIV", "A5", "never", "1", " 1 ", "", "[]", "{}"]),
    st.lists(st.integers(min_value=-5, max_value=600), max_size=5),
    st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def sometimes_nasty(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly good values (so that resolution runs deep), one draw in ten anything."""
    # (one_of(good, good, ..., NASTY) would not do: one_of merges equal branches.)
    return st.sampled_from(range(10)).flatmap(lambda draw: NASTY if draw == 0 else good)


SIZES = st.lists(st.integers(min_value=1, max_value=600), min_size=1, max_size=8)

ENGINE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "max_num_seqs": st.integers(min_value=1, max_value=600),
    "max_num_batched_tokens": st.integers(min_value=1, max_value=10_000),
    "num_speculative_tokens": st.integers(min_value=0, max_value=5),
    "draft_num_hidden_layers": st.integers(min_value=1, max_value=4),
    "tensor_parallel_size": st.integers(min_value=1, max_value=8),
    "data_parallel_size": st.integers(min_value=1, max_value=4),
    "pipeline_parallel_size": st.integers(min_value=1, max_value=2),
    "prefill_context_parallel_size": st.integers(min_value=1, max_value=2),
    "decode_context_parallel_size": st.integers(min_value=1, max_value=2),
    "enable_expert_parallel": st.booleans(),
    "enable_sequence_parallel": st.booleans(),
    "enable_shared_expert_dp": st.booleans(),
    "enable_dsa_cp": st.booleans(),
    "multistream_overlap_shared_expert": st.booleans(),
    "enforce_eager": st.booleans(),
    "block_size": st.sampled_from([16, 64, 128]),
    "soc": st.sampled_from(list(SOCS) + [s.lower() for s in SOCS]),
    "attention_backend": st.sampled_from(sorted(ATTENTION_BACKENDS)),
    "performance_mode": st.sampled_from(["balanced", "interactivity", "throughput"]),
    "use_v2_model_runner": st.booleans(),
    "max_loras": st.integers(min_value=0, max_value=4),
    "cudagraph_specialize_lora": st.booleans(),
    "optimization_level": st.sampled_from([0, 1, 2, 3, "O0", "O1", "o2", "3"]),
    "num_layers": st.integers(min_value=1, max_value=4),
    "enable_lora": st.booleans(),
    "speculative_config": st.fixed_dictionaries(
        {"num_speculative_tokens": st.sampled_from(range(10)).flatmap(lambda d: NASTY if d == 0 else st.integers(0, 3))},
        optional={"method": st.sampled_from(["eagle", "mtp"]), "draft_num_hidden_layers": st.integers(-1, 3)},
    ),
}
COMPILATION_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "mode": st.sampled_from(COMPILATION_NAMES),
    "level": st.sampled_from(COMPILATION_NAMES),
    "cudagraph_mode": st.sampled_from(MODE_NAMES),
    "cudagraph_capture_sizes": SIZES,
    "max_cudagraph_capture_size": st.integers(min_value=1, max_value=1024),
    "cudagraph_num_of_warmups": st.integers(min_value=0, max_value=3),
    "splitting_ops": st.lists(st.sampled_from(["ascendgraph_attn::attention", "x"]), max_size=2),
    "use_inductor_graph_partition": st.booleans(),
    "cudagraph_specialize_lora": st.booleans(),
}
SUB_CONFIG_KEYS = {
    "ascend_compilation_config": [
        "enable_npugraph_ex", "enable_static_kernel", "enable_super_kernel", "fuse_norm_quant",
        "fuse_qknorm_rope", "fuse_muls_add",
    ],
    "xlite_graph_config": ["enabled", "full_mode"],
}
UNKNOWN_KEY = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)


@st.composite
def sub_config(draw: st.DrawFn, name: str) -> Any:
    keys = SUB_CONFIG_KEYS[name] + ["unknown_" + draw(UNKNOWN_KEY)]
    chosen = draw(st.lists(st.sampled_from(keys), unique=True, max_size=4))
    return {key: draw(sometimes_nasty(st.booleans())) for key in chosen}


@st.composite
def model_value(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["preset"] * 7 + ["dict", "dict", "nasty"]))
    if kind == "preset":
        return draw(st.sampled_from(sorted(PRESETS)))
    if kind == "nasty":
        return draw(NASTY)
    return draw(st.one_of(
        st.fixed_dictionaries(
            {"architectures": st.sampled_from([["Qwen3ForCausalLM"], ["BartForConditionalGeneration"],
                                               ["Qwen3ForSequenceClassification"], ["UnknownArch"], [], "x"])},
            optional={
                "num_hidden_layers": sometimes_nasty(st.integers(1, 4)),
                "hidden_size": sometimes_nasty(st.sampled_from([64, 512])),
                "num_attention_heads": sometimes_nasty(st.sampled_from([2, 4])),
                "vocab_size": sometimes_nasty(st.integers(1, 4096)),
                "intermediate_size": sometimes_nasty(st.integers(1, 2048)),
                "kv_lora_rank": sometimes_nasty(st.integers(0, 64)),
                "rms_norm_eps": sometimes_nasty(st.floats(1e-7, 1e-3)),
                "num_key_value_heads": sometimes_nasty(st.sampled_from([1, 2])),
                "head_dim": sometimes_nasty(st.sampled_from([64, 128])),
                "num_experts": sometimes_nasty(st.integers(0, 8)),
                "num_experts_per_tok": sometimes_nasty(st.integers(0, 2)),
                "qk_rope_head_dim": sometimes_nasty(st.integers(0, 64)),
                "max_position_embeddings": sometimes_nasty(st.integers(1, 40960)),
                "rope_theta": sometimes_nasty(st.floats(1.0, 1e6)),
                "is_encoder_decoder": sometimes_nasty(st.booleans()),
                "is_pooling": sometimes_nasty(st.booleans()),
                "qk_norm": sometimes_nasty(st.booleans()),
                "attention": sometimes_nasty(st.sampled_from(["mha", "mla"])),
                "text_config": st.fixed_dictionaries({"num_hidden_layers": st.integers(1, 2)}),
            },
        ),
    ))


@st.composite
def vllm_args(draw: st.DrawFn) -> dict[str, Any]:
    """Keyword arguments of from_vllm_args: the JSON flags (dict or text), model, engine args."""
    compilation: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(sorted(COMPILATION_VALUES) + list(IGNORED_COMPILATION_KEYS[:3])
                                            + ["unknown_" + draw(UNKNOWN_KEY)]), unique=True, max_size=5)):
        good = COMPILATION_VALUES.get(key, st.none())
        compilation[key] = draw(sometimes_nasty(good))
    additional: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(list(MODELLED_ADDITIONAL_KEYS) + ["unknown_" + draw(UNKNOWN_KEY)]),
                             unique=True, max_size=3)):
        if key in SUB_CONFIG_KEYS:
            additional[key] = draw(sometimes_nasty(sub_config(key)))
        elif key == "soc":
            additional[key] = draw(sometimes_nasty(st.sampled_from(list(SOCS))))
        else:
            additional[key] = draw(sometimes_nasty(st.booleans()))
    args: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(sorted(ENGINE_VALUES) + ["unknown_" + draw(UNKNOWN_KEY)]),
                             unique=True, max_size=7)):
        args[key] = draw(sometimes_nasty(ENGINE_VALUES.get(key, st.integers())))
    as_json = draw(st.sampled_from(["dict", "dict", "dict", "dict", "dict", "json", "json", "json", "json", "garbage"]))
    if as_json == "json":
        compilation_arg: Any = json.dumps(compilation, default=str)
        additional_arg: Any = json.dumps(additional, default=str)
    elif as_json == "garbage":
        compilation_arg = draw(st.one_of(st.just("{bad json"), st.just("[1, 2]"), st.just(""), NASTY))
        additional_arg = additional
    else:
        compilation_arg, additional_arg = compilation, additional
    return {"compilation_config": compilation_arg, "additional_config": additional_arg,
            "model": draw(model_value()), **args}


ENV = st.fixed_dictionaries({}, optional={
    "ASCEND_LAUNCH_BLOCKING": st.sampled_from(["0", "1", " 1 ", "", "yes"]),
    "HCCL_OP_EXPANSION_MODE": st.sampled_from(["AIV", "aiv", "FFTS+", "", "AICPU"]),
    "TASK_QUEUE_ENABLE": st.sampled_from(["0", "1", "2"]),
})
RESOLVE_OPTIONS = st.fixed_dictionaries({}, optional={
    "stream_limit": sometimes_nasty(st.integers(min_value=1, max_value=5000)),
    "hccl_op_expansion_mode": st.sampled_from([None, "AIV", "FFTS+"]),
    "other_rank_modes": st.lists(st.sampled_from(list(GraphMode)), max_size=2),
})

# --------------------------------------------------------------------------- the check

# Names an error may use for an input key. RENAMES: the same setting under another name
# (both properties accept them). CAUSES: settings whose combination an error may blame on a
# neighbour (e.g. spec-decode rounding names the sizes) — only the any-input property.
RENAMES = {
    "mode": {"compilation_mode"},
    "level": {"compilation_mode"},
    "num_layers": {"num_hidden_layers"},
    "enable_lora": {"max_loras"},
    "speculative_config": {"--speculative-config", "num_speculative_tokens", "draft_num_hidden_layers"},
    "compilation_config": {"--compilation-config"},
    "additional_config": {"--additional-config"},
}
CAUSES = {
    "max_num_seqs": {"max_cudagraph_capture_size", "cudagraph_capture_sizes"},
    "max_num_batched_tokens": {"max_cudagraph_capture_size", "cudagraph_capture_sizes"},
    "num_speculative_tokens": {"cudagraph_capture_sizes"},
    "speculative_config": {"cudagraph_capture_sizes"},
    "tensor_parallel_size": {"cudagraph_capture_sizes", "tp_size"},
    "enable_sequence_parallel": {"cudagraph_capture_sizes"},
    "enable_shared_expert_dp": {"cudagraph_capture_sizes"},
    "enable_dsa_cp": {"cudagraph_capture_sizes"},
    "max_cudagraph_capture_size": {"cudagraph_capture_sizes"},
    "cudagraph_capture_sizes": {"max_cudagraph_capture_size"},
    "model": {"architecture", "architectures", "num_hidden_layers", "hidden_size", "num_attention_heads",
              "num_key_value_heads", "intermediate_size", "vocab_size", "rms_norm_eps", "head_dim"},
    "xlite_graph_config": {"num_speculative_tokens", "pipeline_parallel_size", "architecture"},
    "attention_backend": {"cudagraph_mode"},  # narrowing with a NEVER backend names the mode to use
    "cudagraph_mode": {"cudagraph_mode"},
}


def input_names(kwargs: dict[str, Any], env: dict[str, str], options: dict[str, Any]) -> set[str]:
    """Every key the input used, with the names errors may call it by."""
    names: set[str] = set()

    def add(key: str) -> None:
        names.add(key)
        names.update(RENAMES.get(key, ()))
        names.update(CAUSES.get(key, ()))

    for key, value in kwargs.items():
        add(key)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                pass
        if isinstance(value, dict):
            for sub, sub_value in value.items():
                add(str(sub))
                if isinstance(sub_value, dict):
                    for leaf in sub_value:
                        names.update({str(leaf), f"{sub}.{leaf}"})
    names.update(env)
    for key in options:
        add(key)
    return names


def resolve_or_reject(kwargs: dict[str, Any], env: dict[str, str], options: dict[str, Any]) -> Optional[Exception]:
    try:
        config = GraphConfig.from_vllm_args(**kwargs)
        resolve(config, env=env, **options)
    except (ConfigError, GraphModeError) as exc:
        return exc
    return None


def names_a_key(error: Exception, names: set[str]) -> bool:
    """``error.key`` is one of the names (or a dotted path through them), or the message
    mentions one as a whole word."""
    # The bounded reader (ascendgraph/readers.py) refuses a non-finite or over-long number while
    # reading the JSON, before any key is looked at: it names the flag and the value's problem.
    if re.search(r"numbers must be finite|more than 20 digits", str(error)):
        return True
    key = getattr(error, "key", None)
    if key is not None and (key in names or any(part in names for part in str(key).split("."))):
        return True
    message = str(error)
    return any(
        name and re.search(rf"(?<![A-Za-z0-9_-]){re.escape(name)}(?![A-Za-z0-9_-])", message) for name in names
    )


def check_any_config(kwargs: dict[str, Any], env: dict[str, str], options: dict[str, Any]) -> None:
    error = resolve_or_reject(kwargs, env, options)  # anything else escaping fails the test
    if error is not None:
        assert str(error).strip(), f"empty message from {type(error).__name__}"
        assert names_a_key(error, input_names(kwargs, env, options)), (
            f"{type(error).__name__} (key={getattr(error, 'key', None)!r}) names no key of the input: {error}"
        )


@given(vllm_args(), ENV, RESOLVE_OPTIONS)
@DEFAULT
def test_any_config_resolves_or_raises_a_config_error_naming_a_key(kwargs, env, options):
    check_any_config(kwargs, env, options)


@pytest.mark.slow
@given(vllm_args(), ENV, RESOLVE_OPTIONS)
@SLOW
def test_any_config_resolves_or_raises_a_config_error_naming_a_key_10k(kwargs, env, options):
    check_any_config(kwargs, env, options)


# --------------------------------------------------------------------------- one broken key

VALID_BASE = {
    "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8]},
    "additional_config": {"ascend_compilation_config": {"enable_npugraph_ex": True}},
    "model": "tiny",
    "max_num_seqs": 8,
    "max_num_batched_tokens": 64,
}
# (where, key): where is "engine", "compilation" or an additional sub-config name.
BREAKABLE = (
    [("engine", key) for key in sorted(ENGINE_VALUES) if key not in ("enable_lora", "speculative_config")]
    + [("compilation", key) for key in MODELLED_COMPILATION_KEYS]
    + [("ascend_compilation_config", key) for key in SUB_CONFIG_KEYS["ascend_compilation_config"]]
    + [("xlite_graph_config", key) for key in SUB_CONFIG_KEYS["xlite_graph_config"]]
)
BAD_VALUES = st.one_of(
    st.integers(min_value=-(2**40), max_value=-1),
    st.integers(min_value=2**40, max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.booleans(),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=1),
)


def check_one_broken_key(where: str, key: str, value: Any) -> None:
    kwargs = json.loads(json.dumps(VALID_BASE))
    if where == "engine":
        kwargs[key] = value
    elif where == "compilation":
        kwargs["compilation_config"][key] = value
    else:
        kwargs["additional_config"].setdefault(where, {})[key] = value
    error = resolve_or_reject(kwargs, {}, {})
    if error is None:
        return
    names = {key, f"{where}.{key}"} | RENAMES.get(key, set())
    if where in SUB_CONFIG_KEYS:
        names |= {where}
    assert names_a_key(error, names), (
        f"breaking {where}.{key}={value!r} gave {type(error).__name__} (key={getattr(error, 'key', None)!r}) "
        f"that does not name it: {error}"
    )


@given(st.sampled_from(BREAKABLE), BAD_VALUES)
@DEFAULT
def test_one_broken_key_is_named_by_the_error(target, value):
    check_one_broken_key(*target, value)


@pytest.mark.slow
@given(st.sampled_from(BREAKABLE), BAD_VALUES)
@SLOW
def test_one_broken_key_is_named_by_the_error_10k(target, value):
    check_one_broken_key(*target, value)


def test_the_base_configuration_is_valid():
    assert resolve_or_reject(json.loads(json.dumps(VALID_BASE)), {}, {}) is None


# --------------------------------------------------------------------------- contradictions
# Settings that contradict each other, each with the keys an error may name; the rest of the
# configuration is drawn at random (valid values), so the contradiction meets many contexts.
CONTRADICTIONS: dict[str, tuple[dict[str, Any], set[str]]] = {
    "static kernel without npugraph_ex": (
        {"additional_config": {"ascend_compilation_config": {"enable_npugraph_ex": False, "enable_static_kernel": True}}},
        {"enable_static_kernel", "enable_npugraph_ex"},
    ),
    "super kernel without static kernel": (
        {"additional_config": {"ascend_compilation_config": {"enable_static_kernel": False, "enable_super_kernel": True}}},
        {"enable_super_kernel", "enable_static_kernel"},
    ),
    "max disagrees with the sizes": (
        {"compilation_config": {"cudagraph_capture_sizes": [1, 2, 4], "max_cudagraph_capture_size": 8}},
        {"max_cudagraph_capture_size", "cudagraph_capture_sizes"},
    ),
    "empty size list": ({"compilation_config": {"cudagraph_capture_sizes": []}}, {"cudagraph_capture_sizes"}),
    "xlite with k = 2": (
        {"additional_config": {"xlite_graph_config": {"enabled": True}}, "num_speculative_tokens": 2},
        {"num_speculative_tokens", "xlite_graph_config"},
    ),
    "xlite with pipeline parallel": (
        {"additional_config": {"xlite_graph_config": {"enabled": True}}, "pipeline_parallel_size": 2},
        {"pipeline_parallel_size", "xlite_graph_config"},
    ),
    "tp alignment leaves nothing": (
        {"tensor_parallel_size": 8, "enable_sequence_parallel": True, "compilation_config": {"cudagraph_capture_sizes": [1, 3, 5]}},
        {"tensor_parallel_size", "cudagraph_capture_sizes", "tp_size"},
    ),
    "FULL with a NEVER backend": (
        {"compilation_config": {"cudagraph_mode": "FULL"}, "attention_backend": "never"},
        {"cudagraph_mode", "attention_backend"},
    ),
    "spec decode rounding leaves nothing": (
        {"compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY", "max_cudagraph_capture_size": 2},
         "num_speculative_tokens": 3},
        {"num_speculative_tokens", "max_cudagraph_capture_size", "cudagraph_capture_sizes"},
    ),
    "enforce eager with a graph mode": (
        {"compilation_config": {"cudagraph_mode": "FULL"}, "enforce_eager": True}, {"enforce_eager", "cudagraph_mode"},
    ),
    "compilation NONE with PIECEWISE": (
        {"compilation_config": {"cudagraph_mode": "PIECEWISE", "mode": "NONE"}}, {"cudagraph_mode", "mode"},
    ),
}
LAUNCH_BLOCKING = {"ASCEND_LAUNCH_BLOCKING": "1"}


@st.composite
def contradiction(draw: st.DrawFn) -> tuple[str, dict[str, Any], dict[str, str], set[str]]:
    name = draw(st.sampled_from(sorted(CONTRADICTIONS) + ["ASCEND_LAUNCH_BLOCKING=1 with graphs"]))
    kwargs: dict[str, Any] = {"compilation_config": {}, "additional_config": {}, "model": draw(st.sampled_from(sorted(PRESETS)))}
    for key in draw(st.lists(st.sampled_from(["max_num_seqs", "max_num_batched_tokens", "soc", "num_layers",
                                              "data_parallel_size", "optimization_level"]), unique=True, max_size=3)):
        kwargs[key] = draw(ENGINE_VALUES[key])
    if "max_num_seqs" in kwargs and "max_num_batched_tokens" in kwargs:
        # background values must be valid on their own: vLLM refuses a token budget below max_num_seqs
        kwargs["max_num_batched_tokens"] = max(kwargs["max_num_batched_tokens"], kwargs["max_num_seqs"])
    env: dict[str, str] = {}
    if name in CONTRADICTIONS:
        changes, keys = CONTRADICTIONS[name]
        for key, value in json.loads(json.dumps(changes)).items():
            if isinstance(value, dict):
                for sub, sub_value in value.items():
                    kwargs[key][sub] = sub_value
            else:
                kwargs[key] = value
    else:
        env, keys = dict(LAUNCH_BLOCKING), {"ASCEND_LAUNCH_BLOCKING"}
    return name, kwargs, env, keys


def check_contradiction(case: tuple[str, dict[str, Any], dict[str, str], set[str]]) -> None:
    name, kwargs, env, keys = case
    error = resolve_or_reject(kwargs, env, {})
    if error is not None:
        assert names_a_key(error, keys), f"{name}: {type(error).__name__} (key={getattr(error, 'key', None)!r}) names none of {sorted(keys)}: {error}"


@given(contradiction())
@DEFAULT
def test_contradictory_settings_resolve_or_name_one_of_them(case):
    check_contradiction(case)


@pytest.mark.slow
@given(contradiction())
@SLOW
def test_contradictory_settings_resolve_or_name_one_of_them_10k(case):
    check_contradiction(case)
