"""Differentials: vLLM Ascend's own functions against ascendgraph's on generated inputs.

* FIA padding: NPUModelRunner._pad_query_start_loc_for_fia (worker/model_runner_v1.py:801-857),
  called unbound with a stand-in runner carrying only what it reads (compilation_config,
  uniform_decode_query_len, arange_np) and a stand-in query_start_loc buffer (``.np``,
  ``copy_to_gpu``), against `ascendgraph.runtime.forward_context.fia_padded_lengths`, on
  the batches a FULL runtime mode meets in production: any batch under a FULL graph
  config; uniform-decode batches under FULL_AND_PIECEWISE / FULL_DECODE_ONLY (their mixed
  batches run PIECEWISE or eagerly). The padded requests' KV lengths are the runner's zero
  fill (model_runner_v1.py:1028). One difference is known and listed in docs/semantics.md
  ("Known differences"): under a FULL config a uniform batch is padded like a mixed one.

* The platform hook against ``ascendgraph.resolve`` (below the padding tests). vLLM Ascend
  decides a graph configuration in two places, both run here as its model runner meets them:

1. ``VllmConfig(...)`` itself: vLLM's defaults, then ``NPUPlatform.check_and_update_config``
   (vllm_ascend/platform.py:343-395 at 182b75ea: ``_update_compilation_modes`` 937-1008,
   ``_setup_compile_backend`` 1011-1117 with vLLM's ``_set_cudagraph_sizes``, after
   ``apply_config_platform_defaults`` 289-294 injected the Ascend default max);
2. ``CompilationConfig.resolve_cudagraph_mode_and_sizes`` called with what
   ``NPUModelRunner._check_and_update_cudagraph_mode`` passes (worker/model_runner_v1.py:
   4790-4820): the smallest attention support of its backends (here
   ``AscendAttentionMetadataBuilder.get_cudagraph_support``, attention_v1.py:269-276),
   ``uniform_decode_query_len`` = 1 + speculative tokens, the V1 runner, no KV-cache config.

The model is a real ``ModelConfig`` of a tiny llama-like model from a ``config.json`` this
module writes (no download). vLLM's model inspection runs in a subprocess that loads vLLM
Ascend's general plugins; its model-loader plugin imports ``uvicorn`` (a server dependency
the environment does not install, model_loader/rfork/seed_server.py:24), so the subprocess
is told to load the other three (``VLLM_PLUGINS``): the loader plays no part in what the
inspection reports. ``ascendgraph.resolve`` reads the same ``config.json``.

Compared for every generated configuration both sides accept: the graph mode that will run,
the compilation mode, the capture sizes, the largest size, the warm-up count; and that a
configuration one side refuses the other refuses too. Differences are listed in
docs/semantics.md "Known differences" and asserted below as such (so a change is noticed).
"""

from __future__ import annotations

import harness

harness.require()

import os  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import Any, Optional  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from vllm.config import CUDAGraphMode  # noqa: E402

import vllm_ascend.ops  # noqa: E402,F401  (before attention_v1, as the model runner imports it)
from ascendgraph import GraphConfig, resolve  # noqa: E402
from ascendgraph.runtime.forward_context import fia_padded_lengths  # noqa: E402
from vllm_ascend.worker.model_runner_v1 import NPUModelRunner  # noqa: E402

MAX_REQS = 64


class QueryStartLoc:
    """The runner's CpuGpuBuffer for query_start_loc: the host array and a copy to the device."""

    def __init__(self, q_lens: list[int]) -> None:
        self.np = np.zeros(MAX_REQS + 2, dtype=np.int32)
        self.np[1: len(q_lens) + 1] = np.cumsum(q_lens)
        self.copied = False

    def copy_to_gpu(self) -> None:
        self.copied = True


def vllm_ascend_padding(config_mode: CUDAGraphMode, query_len: int, q_lens: list[int], num_tokens: int,
                        num_reqs_padded: int) -> tuple[list[int], list[int]]:
    runner = SimpleNamespace(compilation_config=SimpleNamespace(cudagraph_mode=config_mode),
                             uniform_decode_query_len=query_len, arange_np=np.arange(MAX_REQS + 2))
    buffer = QueryStartLoc(q_lens)
    requests = NPUModelRunner._pad_query_start_loc_for_fia(
        runner, buffer, num_tokens, num_reqs_padded, len(q_lens), CUDAGraphMode.FULL, num_reqs_padded)
    assert buffer.copied
    ends = [int(v) for v in buffer.np[1: requests + 1]]
    kv = [5] * len(q_lens) + [0] * (requests - len(q_lens))  # the runner's zero fill past num_reqs
    return ends, kv


@st.composite
def full_batches(draw):  # (config mode, query_len, q_lens, num_tokens, num_reqs_padded, uniform)
    query_len = draw(st.sampled_from([1, 2, 4]))
    if draw(st.booleans()):
        mode = draw(st.sampled_from([CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY]))
        reqs = draw(st.integers(1, 16))
        padded = draw(st.integers(reqs, 16))
        return mode, query_len, [query_len] * reqs, padded * query_len, padded, True
    q_lens = draw(st.lists(st.integers(1, 40), min_size=1, max_size=12))
    num_tokens = sum(q_lens) + draw(st.integers(0, 16))
    uniform = len(set(q_lens)) == 1 and q_lens[0] == query_len and num_tokens == len(q_lens) * query_len
    return CUDAGraphMode.FULL, query_len, q_lens, num_tokens, len(q_lens), uniform


@settings(max_examples=300, deadline=None, derandomize=True)
@given(full_batches())
def test_fia_padding_agrees_with_vllm_ascends_model_runner(batch) -> None:
    mode, query_len, q_lens, num_tokens, num_reqs_padded, uniform = batch
    ends = [int(v) for v in np.cumsum(q_lens)]
    theirs = vllm_ascend_padding(mode, query_len, q_lens, num_tokens, num_reqs_padded)
    # Known difference (docs/semantics.md): under a FULL config vLLM Ascend pads every batch
    # as mixed (model_runner_v1.py:816-821); ascendgraph pads a uniform one per request.
    ours_uniform = uniform and mode != CUDAGraphMode.FULL
    ours = fia_padded_lengths(ends, [5] * len(q_lens), num_tokens=num_tokens, uniform=ours_uniform,
                              num_reqs_padded=num_reqs_padded, query_len=query_len)
    assert ours == theirs
    assert theirs[0][-1] == num_tokens  # the TND contract: the last end is the token count


def test_the_known_difference_a_uniform_batch_under_a_full_config() -> None:
    # 2 decode requests of 2 tokens in a FULL graph of 6 requests x 2 tokens.
    theirs = vllm_ascend_padding(CUDAGraphMode.FULL, 2, [2, 2], 12, 6)
    assert theirs == ([2, 4, 12], [5, 5, 0])  # one dummy request of 8 tokens
    ours = fia_padded_lengths([2, 4], [5, 5], num_tokens=12, uniform=True, num_reqs_padded=6, query_len=2)
    assert ours == ([2, 4, 6, 8, 10, 12], [5, 5, 0, 0, 0, 0])  # four padded requests of 2 tokens


# --------------------------------------------------------------------------- the platform hook

MAX_MODEL_LEN = harness.MAX_MODEL_LEN
environment = harness.environment


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return harness.tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def model_configs(model_dir: Path) -> dict[bool, Any]:
    """ModelConfig of the tiny model, per enforce_eager (a ModelConfig field)."""
    return {eager: harness.model_config(model_dir, enforce_eager=eager) for eager in (False, True)}


@dataclass(frozen=True)
class Case:
    """One configuration, in the spellings both sides take."""

    cudagraph_mode: Optional[str]
    compilation_mode: Optional[int]
    capture_sizes: Optional[tuple[int, ...]]
    max_capture_size: Optional[int]
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    speculative_tokens: int
    optimization_level: int = 2
    performance_mode: str = "balanced"

    def compilation(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        if self.cudagraph_mode is not None:
            values["cudagraph_mode"] = self.cudagraph_mode
        if self.compilation_mode is not None:
            values["mode"] = self.compilation_mode
        if self.capture_sizes is not None:
            values["cudagraph_capture_sizes"] = list(self.capture_sizes)
        if self.max_capture_size is not None:
            values["max_cudagraph_capture_size"] = self.max_capture_size
        return values


@dataclass(frozen=True)
class Decided:
    mode: str
    compilation_mode: str
    capture_sizes: tuple[int, ...]
    max_capture_size: int
    warmups: int


def vllm_ascend_decides(case: Case, model_configs: dict[bool, Any]) -> Decided:
    from vllm.config import CompilationConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
    from vllm.config.compilation import CompilationMode

    from vllm_ascend.attention.attention_v1 import AscendAttentionBackend, AscendAttentionMetadataBuilder

    model_config = model_configs[case.enforce_eager]
    parallel = ParallelConfig()
    speculative = None
    if case.speculative_tokens:  # n-gram drafting: speculative tokens without a draft model
        speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=case.speculative_tokens,
                                        prompt_lookup_max=3, prompt_lookup_min=1,
                                        target_model_config=model_config, target_parallel_config=parallel)
    scheduler = SchedulerConfig(max_num_seqs=case.max_num_seqs, max_num_batched_tokens=case.max_num_batched_tokens,
                                max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False)
    # check_and_update_config sets PYTORCH_NPU_ALLOC_CONF (platform.py:1208-1227,
    # _set_pytorch_npu_alloc_env): keep it out of the process.
    with environment(PYTORCH_NPU_ALLOC_CONF=os.environ.get("PYTORCH_NPU_ALLOC_CONF")):
        config = VllmConfig(model_config=model_config, parallel_config=parallel, scheduler_config=scheduler,
                            speculative_config=speculative, compilation_config=CompilationConfig(**case.compilation()),
                            optimization_level=case.optimization_level, performance_mode=case.performance_mode)
    compilation = config.compilation_config
    support = AscendAttentionMetadataBuilder.get_cudagraph_support(config, None)
    mode = compilation.resolve_cudagraph_mode_and_sizes(
        min_cg_support=support, min_cg_attn_backend=AscendAttentionBackend.__name__,
        uniform_decode_query_len=1 + case.speculative_tokens, use_v2_model_runner=False,
        tensor_parallel_size=1, kv_cache_config=None, max_num_reqs=case.max_num_seqs)
    sizes = tuple(compilation.cudagraph_capture_sizes or ())
    return Decided(mode.name, CompilationMode(compilation.mode).name, sizes,
                   compilation.max_cudagraph_capture_size or 0, compilation.cudagraph_num_of_warmups)


def ascendgraph_decides(case: Case, model_dir: Path) -> Decided:
    config = GraphConfig.from_vllm_args(
        compilation_config=case.compilation(), model=str(model_dir), enforce_eager=case.enforce_eager,
        max_num_seqs=case.max_num_seqs, max_num_batched_tokens=case.max_num_batched_tokens,
        num_speculative_tokens=case.speculative_tokens or None, optimization_level=case.optimization_level,
        performance_mode=case.performance_mode)
    result = resolve(config, env={})
    return Decided(result.mode.name, result.compilation_mode.name, tuple(result.capture_sizes),
                   result.max_capture_size, result.warmups)


def outcome(decide: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", decide(*args)
    except (ValueError, AssertionError) as error:  # ConfigError / GraphModeError are ValueErrors
        return "refused", f"{type(error).__name__}: {error}"


def every_size_above_the_token_budget(case: Case) -> bool:
    return case.capture_sizes is not None and min(case.capture_sizes) > case.max_num_batched_tokens


MODES = [None, "NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"]


@st.composite
def cases(draw: Any) -> Case:
    max_num_seqs = draw(st.integers(1, 300))
    sizes = None
    if draw(st.booleans()):
        sizes = tuple(draw(st.lists(st.integers(1, 600), min_size=1, max_size=6)))
    return Case(
        cudagraph_mode=draw(st.sampled_from(MODES)),
        compilation_mode=draw(st.sampled_from([None, None, 0, 3, 3, 1, 2])),
        capture_sizes=sizes,
        max_capture_size=draw(st.one_of(st.none(), st.integers(1, 600))),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=draw(st.integers(max(max_num_seqs, 64), 8192)),
        enforce_eager=draw(st.booleans()),
        speculative_tokens=draw(st.sampled_from([0, 0, 1, 2, 3])),
        optimization_level=draw(st.sampled_from([2, 2, 0, 1, 3])),
        performance_mode=draw(st.sampled_from(["balanced", "balanced", "interactivity", "throughput"])),
    )


@pytest.fixture(scope="module")
def sides(model_configs: dict[bool, Any], model_dir: Path) -> Any:
    """Both deciders, bound to the module's model (one argument, so a failing example prints short)."""

    class Sides:
        def theirs(self, case: Case) -> tuple[str, Any]:
            return outcome(vllm_ascend_decides, case, model_configs)

        def ours(self, case: Case) -> tuple[str, Any]:
            return outcome(ascendgraph_decides, case, model_dir)

        def __repr__(self) -> str:
            return "sides"

    return Sides()


@settings(max_examples=300, deadline=None, derandomize=True, database=None, print_blob=False)
@given(case=cases())
def test_the_platform_hook_and_resolve_decide_alike(case: Case, sides: Any) -> None:
    theirs, ours = sides.theirs(case), sides.ours(case)
    if every_size_above_the_token_budget(case) and theirs[0] == "refused":
        assert "Maximum cudagraph size should be greater than or equal to 1" in theirs[1]  # known difference 9
        return
    assert ours[0] == theirs[0], (case, ours, theirs)
    if theirs[0] == "ok":
        assert ours[1] == theirs[1], case


TABLE = [  # (case, what vLLM Ascend decides): one of each kind of decision, named
    # an unsupported compilation mode: compilation off, the FULL graphs kept (platform.py:974-979)
    (Case("FULL", 1, None, None, 12, 2048, False, 0), Decided("FULL", "NONE", (1, 2, 4, 8), 8, 1)),
    # PIECEWISE without VLLM_COMPILE: NONE (vLLM's VllmConfig.__post_init__, vllm/config/vllm.py:1310-1321)
    (Case("PIECEWISE", 0, None, None, 12, 2048, False, 0), Decided("NONE", "NONE", (), 0, 1)),
    # speculative decoding: Ascend default max 12 x 3 = 36 (platform.py:1275-1309), then vLLM's
    # spec-decode rounding to multiples of 3 in resolve_cudagraph_mode_and_sizes
    (Case("FULL_DECODE_ONLY", None, None, None, 12, 2048, False, 2),
     Decided("FULL_DECODE_ONLY", "VLLM_COMPILE", (3, 6, 9, 18, 24), 24, 1)),
    # the default mode with 3 speculative tokens: max min(40 x 4, 512) = 160, multiples of 4 kept by 8-steps
    (Case(None, None, None, None, 40, 2048, False, 3),
     Decided("FULL_AND_PIECEWISE", "VLLM_COMPILE", (4, *range(8, 161, 8)), 160, 1)),
    # enforce_eager wins over a FULL mode and user sizes
    (Case("FULL", None, (1, 2, 4, 100), None, 8, 64, True, 0), Decided("NONE", "NONE", (), 0, 1)),
    # -O0: no compilation, no graphs
    (Case(None, None, None, None, 256, 8192, False, 0, 0), Decided("NONE", "NONE", (), 0, 1)),
]


@pytest.mark.parametrize("case, expected", TABLE)
def test_named_decisions_agree(case: Case, expected: Decided, sides: Any) -> None:
    assert sides.theirs(case) == ("ok", expected)
    assert sides.ours(case) == ("ok", expected)


def test_both_refuse_a_max_inconsistent_with_the_sizes(sides: Any) -> None:
    case = Case("FULL_AND_PIECEWISE", None, (8, 4), 16, 8, 2048, False, 0)
    text = ("customized max_cudagraph_capture_size(=16) should be consistent with the max value of "
            "cudagraph_capture_sizes(=8)")
    assert sides.theirs(case)[0] == sides.ours(case)[0] == "refused"
    assert text in sides.theirs(case)[1] and text in sides.ours(case)[1]


def test_known_difference_every_user_size_above_the_token_budget(sides: Any) -> None:
    # docs/semantics.md "Known differences" 9. vLLM's first _set_cudagraph_sizes (in VllmConfig)
    # drops every size above max_num_batched_tokens and stores max 0; the platform hook runs it
    # again (platform.py:1037), now from max 0, and vLLM's assertion refuses (vllm/config/vllm.py,
    # "Maximum cudagraph size should be greater than or equal to 1"). ascendgraph keeps the mode,
    # captures nothing and warns (§2.3, no_capture_sizes).
    case = Case("PIECEWISE", None, (65,), None, 1, 64, False, 0)
    kind, text = sides.theirs(case)
    assert kind == "refused" and "Maximum cudagraph size should be greater than or equal to 1" in text
    assert sides.ours(case) == ("ok", Decided("PIECEWISE", "VLLM_COMPILE", (), 0, 1))
