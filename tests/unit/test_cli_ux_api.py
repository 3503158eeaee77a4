"""The Python API raises ConfigError naming the bad argument, never a raw TypeError / AttributeError."""

from __future__ import annotations

import pytest

import ascendgraph
from ascendgraph import ConfigError

CONFIG = {"model": "tiny", "num_layers": 1}


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(device=None), "device must be a backend name"),
    (dict(device=5), "device must be a backend name"),
    (dict(seed="x"), "seed must be an integer from 0 to 2**63 - 1, got 'x'"),
    (dict(seed=2**70), "seed must be an integer from 0 to 2**63 - 1"),
    (dict(seed=-1), "seed must be an integer"),
    (dict(seed=True), "seed must be an integer"),
    (dict(requests=10**7), "requests must be an integer from 1 to 1000000"),
    (dict(requests="4"), "requests must be an integer"),
    (dict(atol="x"), "atol must be a finite number >= 0, got 'x'"),
    (dict(stream_limit="40"), "stream_limit must be an integer"),
    (dict(profile_dir=""), "profile_dir must be a directory path"),
    (dict(env=5), "env must be a mapping"),
    (dict(bogus_kw=1), "unknown run option 'bogus_kw'; valid: atol, "),
    (dict(stream_limt=40), "unknown run option 'stream_limt'; did you mean 'stream_limit'?"),
])
def test_run_refuses_bad_arguments_with_a_config_error(kwargs, fragment):
    with pytest.raises(ConfigError) as info:
        ascendgraph.run(CONFIG, **kwargs)
    assert fragment in str(info.value)


@pytest.mark.parametrize("call, fragment", [
    (lambda: ascendgraph.explain(env=5), "env must be a mapping"),
    (lambda: ascendgraph.explain(hccl_op_expansion_mode=5), "hccl_op_expansion_mode must be a string"),
    (lambda: ascendgraph.explain(other_rank_modes=5), "other_rank_modes must be a list of graph modes"),
    (lambda: ascendgraph.explain(other_rank_modes="FULL"), "other_rank_modes must be a list of graph modes"),
    (lambda: ascendgraph.explain(other_rank_modes=["bogus"]), "invalid cudagraph_mode 'bogus'"),
    (lambda: ascendgraph.explain(stream_limit="40"), "stream_limit must be an integer >= 1"),
    (lambda: ascendgraph.explain({1: 2}), "argument names must be strings"),
    (lambda: ascendgraph.explain({"max_num_seqs": 4, 1: 2}), "got 1"),
])
def test_explain_refuses_bad_arguments_with_a_config_error(call, fragment):
    with pytest.raises(ConfigError) as info:
        call()
    assert fragment in str(info.value)


def test_explain_still_takes_mode_names_and_modes_for_other_ranks():
    assert ascendgraph.explain(other_rank_modes=["FULL", ascendgraph.GraphMode.PIECEWISE]).mode is not None


def test_engine_options_validate_on_their_own():
    from ascendgraph.runtime.engine import EngineOptions

    with pytest.raises(ConfigError, match="atol must be a finite number"):
        EngineOptions(atol=[1])
    assert EngineOptions(seed=2**63 - 1, atol=0).seed == 2**63 - 1


@pytest.mark.parametrize("kwargs, fragment", [
    ({"env": {"ASCEND_LAUNCH_BLOCKING": 1}}, "environment variables are strings"),
    ({"compilation_config": {1: 2}}, "keys must be strings"),
    ({"additional_config": {("a",): 1}}, "keys must be strings"),
])
def test_explain_refuses_non_string_env_values_and_config_keys(kwargs, fragment):
    import ascendgraph
    from ascendgraph.errors import ConfigError

    with pytest.raises(ConfigError, match=fragment):
        ascendgraph.explain(**kwargs)


def test_explain_refuses_two_different_speculative_token_counts_like_the_cli():
    import ascendgraph
    from ascendgraph.errors import ConfigError

    with pytest.raises(ConfigError, match="give the number once"):
        ascendgraph.explain(speculative_config={"num_speculative_tokens": 2}, num_speculative_tokens=3)
    same = ascendgraph.explain(speculative_config={"num_speculative_tokens": 2}, num_speculative_tokens=2)
    assert same.config.num_speculative_tokens == 2
