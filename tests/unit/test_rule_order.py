"""The order of the resolution rules is pinned (issue 18, "kill the survivors").

For every adjacent pair of `ascendgraph.resolve.RULES` there is either a witness below —
a configuration whose outcome (mode, sizes, flags, warnings or error) changes when the two
rules swap places — or the pair is listed in COMMUTING with the reason no configuration can
tell the orders apart. The witnesses were found by swapping each pair over a corpus of
5,000 generated configurations; each test asserts the outcome of the real order (so a
mutant that reorders the rules fails here) and that the swap changes it (so the witness
keeps proving the order matters). Rule texts: docs/semantics.md "Resolution".
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

import pytest

from ascendgraph.config import GraphConfig
from ascendgraph.modes import GraphMode

resolve_module = importlib.import_module("ascendgraph.resolve")  # the module (ascendgraph.resolve is the function)


def _outcome(config: GraphConfig, env: dict, support: Optional[str], others: tuple) -> tuple:
    try:
        r = resolve_module.resolve(config, env=env, attention_support=support, other_rank_modes=others)
    except Exception as exc:  # a reordered pipeline may also crash: that is a changed outcome too
        return ("error", type(exc).__name__, str(exc).split("\n")[0][:60])
    return ("ok", r.mode.name, tuple(r.capture_sizes), r.npugraph_ex, r.static_kernel, r.super_kernel,
            r.compilation_mode.name, tuple(r.warnings))


def _swapped(monkeypatch: pytest.MonkeyPatch, first: str) -> None:
    rules = list(resolve_module.RULES)
    index = [name for name, _, _ in rules].index(first)
    rules[index], rules[index + 1] = rules[index + 1], rules[index]
    monkeypatch.setattr(resolve_module, "RULES", tuple(rules))


# (first rule of the pair, config kwargs, env, attention support, other DP ranks' modes, expected (kind, mode/error))
WITNESSES: list[tuple[str, dict[str, Any], dict[str, str], Optional[str], tuple, tuple[str, str]]] = [
    ("default_mode", {"compilation_config": {"cudagraph_mode": "FULL"}}, {"ASCEND_LAUNCH_BLOCKING": "1"}, None,
     (GraphMode.PIECEWISE,), ("error", "ConfigError")),
    ("unsupported_compilation_mode", {"compilation_config": {"mode": 2}, "tensor_parallel_size": 4},
     {"ASCEND_LAUNCH_BLOCKING": "1"}, "UNIFORM_SINGLE_TOKEN_DECODE", (), ("ok", "NONE")),
    ("piecewise_needs_vllm_compile",
     {"compilation_config": {"mode": 0, "cudagraph_capture_sizes": [2, 4, 8, 16, 24, 32]},
      "additional_config": {"xlite_graph_config": {"enabled": True, "full_mode": True}}, "max_num_seqs": 16},
     {}, None, (), ("ok", "NONE")),
    ("capture_sizes", {"additional_config": {"ascend_compilation_config": {"enable_static_kernel": True}},
                       "soc": "310P", "decode_context_parallel_size": 2, "num_speculative_tokens": 2, "max_num_seqs": 4},
     {}, "ALWAYS", (), ("ok", "FULL_AND_PIECEWISE")),
    ("soc_310p", {"compilation_config": {"cudagraph_mode": "NONE", "cudagraph_capture_sizes": [3, 5]},
                  "enforce_eager": True, "soc": "310P", "num_speculative_tokens": 2, "max_num_seqs": 4},
     {}, "UNIFORM_BATCH", (GraphMode.PIECEWISE,), ("ok", "NONE")),
    ("context_parallel", {"compilation_config": {"cudagraph_mode": "FULL"}, "decode_context_parallel_size": 2,
                          "max_num_seqs": 16}, {}, "UNIFORM_SINGLE_TOKEN_DECODE", (), ("ok", "FULL_DECODE_ONLY")),
    ("attention_narrowing", {"compilation_config": {"cudagraph_mode": "FULL", "mode": 3}, "max_num_seqs": 4},
     {}, "UNIFORM_SINGLE_TOKEN_DECODE", (GraphMode.NONE,), ("ok", "NONE")),
    ("data_parallel_agreement",
     {"compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [3, 5]},
      "decode_context_parallel_size": 2, "num_speculative_tokens": 1, "max_num_seqs": 16},
     {}, None, (GraphMode.PIECEWISE,), ("ok", "NONE")),
]

# Adjacent pairs no configuration tells apart, and why.
COMMUTING = {
    ("enforce_eager", "default_mode"): "default_mode only fills an unset mode; enforce_eager sets NONE either way",
    ("xlite", "pooling_and_encoder_decoder"): "the presets model no pooling or encoder-decoder model with xlite on",
    ("pooling_and_encoder_decoder", "capture_sizes"): "the size rule reads neither the model kind nor FULL-ness",
    ("backend_setup", "launch_blocking"): "launch_blocking reads only the mode, which backend_setup does not change",
    ("launch_blocking", "context_parallel"): "context_parallel only warns; launch_blocking raises or does nothing",
    ("final_backend_setup", "no_capture_sizes"): "both settle the same final state; neither reads what the other sets",
}


def test_every_adjacent_pair_has_a_witness_or_a_reason():
    names = [name for name, _, _ in resolve_module.RULES]
    pairs = set(zip(names, names[1:]))
    witnessed = {(first, names[names.index(first) + 1]) for first, *_ in WITNESSES}
    assert witnessed | set(COMMUTING) == pairs
    assert not witnessed & set(COMMUTING)


@pytest.mark.parametrize("first, kwargs, env, support, others, expected", WITNESSES, ids=[w[0] for w in WITNESSES])
def test_swapping_an_adjacent_pair_changes_the_witness_outcome(monkeypatch, first, kwargs, env, support, others,
                                                               expected):
    config = GraphConfig.from_vllm_args(**kwargs)
    real = _outcome(config, env, support, others)
    assert real[:2] == expected
    _swapped(monkeypatch, first)
    assert _outcome(config, env, support, others) != real


def test_launch_blocking_comes_before_attention_narrowing():
    # FULL_DECODE_ONLY with a backend that supports no graphs and ASCEND_LAUNCH_BLOCKING=1: the
    # blocking rule sees the requested graph mode and refuses; after narrowing it would see NONE.
    config = GraphConfig.from_vllm_args(compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"})
    env = {"ASCEND_LAUNCH_BLOCKING": "1"}
    assert _outcome(config, env, "NEVER", ())[:2] == ("error", "ConfigError")
    names = [name for name, _, _ in resolve_module.RULES]
    assert names.index("launch_blocking") < names.index("attention_narrowing")
    assert _outcome(config, {}, "NEVER", ())[:2] == ("ok", "NONE")  # without the variable: narrowed to eager
