"""Differentials: vLLM Ascend's own functions against ascendgraph's on generated inputs.

* FIA padding: on a batch of a served configuration (graph mode, speculative tokens,
  max_num_seqs, capture sizes), NPUModelRunner._determine_batch_execution_and_padding
  (worker/model_runner_v1.py:2714-2811) decides the runtime mode and the batch descriptor with
  vLLM's own CudagraphDispatcher (initialised as _check_and_update_cudagraph_mode does), and
  for a FULL graph NPUModelRunner._pad_query_start_loc_for_fia (801-847) pads query_start_loc
  with the descriptor's request count, as execute_model calls them; both called unbound with
  a stand-in runner carrying only what they read, and a stand-in query_start_loc buffer
  (``.np``, ``copy_to_gpu``). Against `ascendgraph.forward_context.fia_padded_lengths` given
  the same descriptor. The padded requests' KV lengths are the runner's zero fill
  (model_runner_v1.py:1028). The runner serving whole (tests/vllm_ascend/test_model_runner.py)
  computes all of this itself; this differential checks ascendgraph's padding against it on
  many more batches than a served stream meets. One difference is known and listed in
  docs/semantics.md ("Known differences"): under a FULL config a uniform batch is padded like a
  mixed one (vLLM's dispatcher never marks it uniform there).

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
from hypothesis import example, given, settings  # noqa: E402
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


@dataclass(frozen=True)
class Served:
    """A serving configuration of the padding differential (graph mode, 1 + speculative tokens,
    max_num_seqs, capture sizes)."""

    mode: str
    query_len: int
    max_num_seqs: int
    sizes: tuple[int, ...]


SERVED = [
    Served("FULL", 1, 4, (2, 4, 8)),  # mixed batches in FULL graphs; a full batch of 4 gets a 5th (dummy) request
    Served("FULL", 2, 8, (4, 8, 16)),
    Served("FULL_AND_PIECEWISE", 1, 8, (1, 2, 4, 8)),
    Served("FULL_AND_PIECEWISE", 3, 4, (4, 8, 12, 16)),
    Served("FULL_DECODE_ONLY", 1, 16, (1, 2, 4, 8, 16)),
    Served("FULL_DECODE_ONLY", 2, 6, (2, 4, 8, 12)),
]
_RUNNERS: dict[Served, Any] = {}


def runner_standin(served: Served, model_configs: dict[bool, Any]) -> Any:
    """What NPUModelRunner._determine_batch_execution_and_padding (model_runner_v1.py:2714-2811)
    and _pad_query_start_loc_for_fia (801-847) read of the runner, with vLLM's own
    CudagraphDispatcher initialised as _check_and_update_cudagraph_mode does (4790-4820: the
    mode resolved with the attention backend's support, then initialize_cudagraph_keys)."""
    if served in _RUNNERS:
        return _RUNNERS[served]
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    case = Case(served.mode, None, served.sizes, None, served.max_num_seqs, 2048, False, served.query_len - 1)
    config, mode = resolved_config(case, model_configs)
    dispatcher = CudagraphDispatcher(config)
    dispatcher.initialize_cudagraph_keys(mode, served.query_len)
    runner = SimpleNamespace(
        vllm_config=config, compilation_config=config.compilation_config, model_config=config.model_config,
        speculative_config=config.speculative_config, uniform_decode_query_len=served.query_len,
        cudagraph_dispatcher=dispatcher, arange_np=np.arange(MAX_REQS + 2),
        input_batch=SimpleNamespace(num_computed_tokens_cpu=np.full(MAX_REQS, 5), lora_id_to_lora_request={}))
    runner._pad_for_sequence_parallelism = NPUModelRunner._pad_for_sequence_parallelism.__get__(runner)
    _RUNNERS[served] = runner
    return runner


def vllm_ascend_serves(runner: Any, q_lens: list[int]) -> Optional[tuple[Any, list[int], list[int]]]:
    """The runner's own decision for a batch (mode and batch descriptor from vLLM's dispatcher),
    then, for a FULL graph, its padding of query_start_loc with the descriptor's request count
    (execute_model: model_runner_v1.py:1911-1931, 1944, 2020-2032). None when the batch runs
    without a FULL graph."""
    from vllm.config import set_current_vllm_config

    num_scheduled = np.array(q_lens, dtype=np.int32)
    with set_current_vllm_config(runner.vllm_config):
        mode, desc, *_ = NPUModelRunner._determine_batch_execution_and_padding(
            runner, num_tokens=sum(q_lens), num_reqs=len(q_lens), num_scheduled_tokens_np=num_scheduled,
            max_num_scheduled_tokens=max(q_lens), use_cascade_attn=False)
        if mode != CUDAGraphMode.FULL:
            return None
        buffer = QueryStartLoc(q_lens)
        num_reqs_padded = desc.num_reqs if desc.num_reqs is not None else len(q_lens)
        requests = NPUModelRunner._pad_query_start_loc_for_fia(
            runner, buffer, desc.num_tokens, num_reqs_padded, len(q_lens), mode, desc.num_reqs)
    assert buffer.copied
    ends = [int(v) for v in buffer.np[1: requests + 1]]
    return desc, ends, [5] * len(q_lens) + [0] * (requests - len(q_lens))  # the runner's zero fill


@st.composite
def served_batches(draw: Any) -> tuple[Served, list[int]]:
    served = draw(st.sampled_from(SERVED))
    reqs = draw(st.integers(1, served.max_num_seqs))
    if draw(st.booleans()):  # a uniform decode batch (every request query_len tokens)
        return served, [served.query_len] * reqs
    return served, draw(st.lists(st.integers(1, 6), min_size=reqs, max_size=reqs))


@settings(max_examples=300, deadline=None, derandomize=True, database=None, print_blob=False)
@given(batch=served_batches())
# Under a FULL config with speculative tokens, a mixed batch padded to exactly num_reqs * query_len
# tokens (2 requests of 1 and 2 tokens in a graph of 4) must still get the dummy request
# (vllm-project/vllm-ascend#9863); the draws rarely make one.
@example(batch=(SERVED[1], [1, 2]))
def test_fia_padding_agrees_with_vllm_ascends_model_runner(batch: tuple[Served, list[int]],
                                                          model_configs: dict[bool, Any]) -> None:
    served, q_lens = batch
    theirs = vllm_ascend_serves(runner_standin(served, model_configs), q_lens)
    if theirs is None:
        return  # eager or PIECEWISE: no FIA padding
    desc, ends, lens = theirs
    ours = fia_padded_lengths([int(v) for v in np.cumsum(q_lens)], [5] * len(q_lens), num_tokens=desc.num_tokens,
                              uniform=desc.uniform, num_reqs_padded=desc.num_reqs, query_len=served.query_len)
    assert ours == (ends, lens), (served, q_lens, desc)
    assert ends[-1] == desc.num_tokens  # the TND contract: the last end is the token count


@pytest.mark.parametrize("served", SERVED, ids=lambda s: f"{s.mode}-q{s.query_len}-seqs{s.max_num_seqs}")
def test_each_served_configuration_pads_a_decode_batch_in_a_full_graph(served: Served,
                                                                       model_configs: dict[bool, Any]) -> None:
    # So the generated batches above meet FULL graphs under every configuration: one uniform
    # decode request is padded to the smallest decode graph.
    theirs = vllm_ascend_serves(runner_standin(served, model_configs), [served.query_len])
    assert theirs is not None
    desc, ends, _ = theirs
    assert ends[-1] == desc.num_tokens > served.query_len or desc.num_tokens == served.query_len


def test_a_mixed_batch_that_fills_max_num_seqs_gets_a_request_past_the_runners_buffers(
        model_configs: dict[bool, Any]) -> None:
    # FULL graphs of 8 tokens, max_num_seqs 4: vLLM's dispatcher pads 4 requests of 5 tokens to
    # 8 tokens and 4 requests (min(8, max_num_seqs)); the runner then inserts a dummy request
    # ending at 8 (model_runner_v1.py:837-844), a 5th: query_start_loc has max_num_reqs + 2
    # entries for it (323-329), seq_lens only max_num_reqs, so the metadata builder pads the
    # dummy's KV length itself (attention_v1.py:371-376).
    runner = runner_standin(SERVED[0], model_configs)
    desc, ends, lens = vllm_ascend_serves(runner, [2, 1, 1, 1])
    assert (desc.num_tokens, desc.num_reqs, desc.uniform) == (8, 4, False)
    assert ends == [2, 3, 4, 5, 8] and len(ends) == SERVED[0].max_num_seqs + 1


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


def resolved_config(case: Case, model_configs: dict[bool, Any]) -> tuple[Any, CUDAGraphMode]:
    """The VllmConfig of ``case`` and the graph mode the runner resolves for it."""
    from vllm.config import CompilationConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig

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
    return config, mode


def vllm_ascend_decides(case: Case, model_configs: dict[bool, Any]) -> Decided:
    from vllm.config.compilation import CompilationMode

    config, mode = resolved_config(case, model_configs)
    compilation = config.compilation_config
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
