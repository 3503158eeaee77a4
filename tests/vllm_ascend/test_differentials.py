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
"""

from __future__ import annotations

import harness

harness.require()

from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from vllm.config import CUDAGraphMode  # noqa: E402

import vllm_ascend.ops  # noqa: E402,F401
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
