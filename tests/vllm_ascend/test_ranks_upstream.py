"""vLLM's and vLLM Ascend's own DP coordination, unmodified, on simulated ranks (issue 36 item 2).

Every rank is a thread with its own vLLM ``parallel_state`` groups on the fabric's
torch.distributed backend (`sim.vllm_ranks`, `sim.process_group`) and its own config; the
functions under test are imported from vLLM 0.27.1 and vLLM Ascend's source and called as
they are: ``vllm.v1.worker.dp_utils.coordinate_batch_across_dp``,
``vllm.config.ParallelConfig.sync_dp_state`` and ``NPUModelRunner._sync_metadata_across_dp``
(on a runner built without its ``__init__``, given the three fields the method reads:
``dp_size``, ``dp_rank``, ``vllm_config``). The scenarios of tests/ranks whose hang lives in
these functions fail on their buggy side through this code, and a differential test holds
ascendgraph's re-statement (`ascendgraph.parallel.coordination`, which the CLI uses without
vLLM) to them on generated step sequences.
"""

from __future__ import annotations

import random

import harness
import pytest

harness.require()

import vllm_ascend.ops  # noqa: E402,F401  (model_runner_v1's imports need vllm_ascend.ops loaded first)
from vllm.config import CUDAGraphMode, ParallelConfig  # noqa: E402
from vllm.v1.worker.dp_utils import coordinate_batch_across_dp  # noqa: E402
from vllm_ascend.worker.model_runner_v1 import NPUModelRunner  # noqa: E402

from ascendgraph.errors import CollectiveDeadlock, CollectiveMismatch  # noqa: E402
from ascendgraph.parallel import coordination  # noqa: E402
from ascendgraph.parallel.layout import ParallelLayout  # noqa: E402
from sim.vllm_ranks import VllmRanks  # noqa: E402


pytestmark = pytest.mark.usefixtures("fresh_simulated_npu")

# vllm_ascend/utils.py is_hierarchical_communication_enabled: with these, should_skip_allreduce_
# across_dp_group is False before it reads the model, so _sync_metadata_across_dp all-reduces.
HIERARCHICAL = {"HCCL_INTRA_ROCE_ENABLE": "0", "HCCL_INTRA_PCIE_ENABLE": "1"}


def _runner(dp: int, rank: int, config):
    runner = object.__new__(NPUModelRunner)
    runner.dp_size, runner.dp_rank, runner.vllm_config = dp, rank, config
    return runner


def _steps(seed: int, dp: int, count: int) -> list[list[tuple[int, int]]]:
    draw = random.Random(seed)
    return [[(draw.randint(1, 64), draw.choice((0, 1, 2))) for _ in range(dp)] for _ in range(count)]


def _restated_all_reduce(every_rank_rows):
    def all_reduce(_mine):
        return [[sum(rows[i][j] for rows in every_rank_rows) for j in range(len(every_rank_rows[0][0]))]
                for i in range(len(every_rank_rows[0]))]
    return all_reduce


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vllms_coordinate_batch_across_dp_and_the_restatement_agree(seed):
    dp, steps = 4, _steps(seed, 4, 12)
    got: dict[int, list] = {}

    def body(rank):
        config = ParallelConfig(data_parallel_size=dp, data_parallel_rank=rank,
                                disable_nccl_for_dp_synchronization=False)
        got[rank] = []
        for step in steps:
            tokens, mode = step[rank]
            _, across, synced = coordinate_batch_across_dp(num_tokens_unpadded=tokens, allow_microbatching=False,
                                                           parallel_config=config, cudagraph_mode=mode)
            got[rank].append((tuple(int(v) for v in across), synced))

    stats = VllmRanks(ParallelLayout(dp=dp)).run(body)
    assert stats.met == {"dp:device": len(steps)}  # vLLM syncs on the device group by default
    for index, step in enumerate(steps):
        rows = []
        for rank in range(dp):
            mine = [[0] * dp for _ in range(4)]
            mine[0][rank], mine[1][rank], mine[3][rank] = step[rank][0], step[rank][0], step[rank][1]
            rows.append(mine)
        for rank in range(dp):
            _, across, synced = coordination.coordinate_batch_across_dp(
                _restated_all_reduce(rows), num_tokens_unpadded=step[rank][0], dp_size=dp, dp_rank=rank,
                cudagraph_mode=step[rank][1])
            assert got[rank][index] == (across, synced), (index, rank)


def _runner_syncs(dp, steps, call):
    """``call(runner, tokens, mode)`` (vLLM Ascend's ``_sync_metadata_across_dp``) per step on
    ``dp`` fabric ranks: per rank, (max, num_tokens_across_dp, synced mode) of each step."""
    config = harness.vllm_config("FULL")
    got: dict[int, list] = {}

    def body(rank):
        runner = _runner(dp, rank, config)
        got[rank] = []
        for step in steps:
            most, across, synced = call(runner, *step[rank])
            got[rank].append((most, tuple(int(v) for v in across), synced.value))

    with harness.environment(**HIERARCHICAL):
        stats = VllmRanks(ParallelLayout(dp=dp)).run(body)
    assert stats.met == {"dp:cpu": len(steps)}  # vLLM Ascend syncs on the DP CPU group
    return got


def _restated_syncs(dp, steps, *, draft=False):
    policy = coordination.get_policy("vllm_ascend")
    for step in steps:
        rows = [coordination.dp_sync_contribution(policy, num_tokens=step[r][0], mode=0 if draft else step[r][1],
                                                  dp_size=dp, dp_rank=r) for r in range(dp)]
        yield [coordination.sync_metadata_across_dp(policy, _restated_all_reduce(rows), num_tokens=step[rank][0],
                                                    mode=step[rank][1], dp_size=dp, dp_rank=rank, draft=draft)
               for rank in range(dp)]


@pytest.mark.parametrize("seed", [0, 1])
def test_vllm_ascends_sync_metadata_across_dp_and_the_restatement_agree(seed):
    dp, steps = 3, _steps(seed, 3, 10)
    got = _runner_syncs(dp, steps, lambda runner, tokens, mode: runner._sync_metadata_across_dp(
        num_tokens=tokens, cudagraph_mode=CUDAGraphMode(mode), allow_dp_padding=mode != 0))
    for index, results in enumerate(_restated_syncs(dp, steps)):
        for rank, result in enumerate(results):
            assert got[rank][index] == (result.max_tokens, result.num_tokens_across_dp, result.synced_mode)


@pytest.mark.parametrize("disable_nccl, error, rule", [
    (True, CollectiveMismatch, "same_shape"),  # async scheduling: vLLM syncs on the CPU group too
    (False, CollectiveDeadlock, None),  # vLLM's device group and vLLM Ascend's CPU group never meet
])
def test_sync_tensors_differ_through_their_code(disable_nccl, error, rule):
    """tests/ranks/scenario_files/sync_tensors_differ.toml (vLLM Ascend #9689), buggy side: rank 0
    runs vLLM Ascend's [2, dp] sync, rank 1 vLLM's [4, dp] coordinate_batch_across_dp."""
    config = harness.vllm_config("FULL")

    def body(rank):
        if rank == 0:
            _runner(2, 0, config)._sync_metadata_across_dp(num_tokens=2, cudagraph_mode=CUDAGraphMode.FULL,
                                                           allow_dp_padding=True)
        else:
            coordinate_batch_across_dp(num_tokens_unpadded=2, allow_microbatching=False, cudagraph_mode=2,
                                       parallel_config=ParallelConfig(data_parallel_size=2, data_parallel_rank=1,
                                                                      disable_nccl_for_dp_synchronization=disable_nccl))

    with harness.environment(**HIERARCHICAL), pytest.raises(error) as info:
        VllmRanks(ParallelLayout(dp=2)).run(body)
    if rule:
        assert info.value.rules == (rule,) and "rank 0: (2, 2), rank 1: (4, 2)" in str(info.value)


@pytest.mark.parametrize("idle_policy", ["external_launcher_only", "always_dummy"])
def test_a_zero_token_step_that_skips_the_sync_deadlocks_in_sync_dp_state(idle_policy):
    """tests/ranks/scenario_files/zero_token_step_skips_sync.toml (vLLM #43547): the engine core
    loop (vLLM v1/engine/core.py run_busy_loop / _has_global_unfinished_reqs, interval 4 here) with
    vLLM's own coordinate_batch_across_dp per step and ParallelConfig.sync_dp_state on the engine
    core's own DP group. Rank 1 has a zero-token step; with #43547 it returns without the sync."""
    steps = {0: [2, 2, 2, 2, 2, 2], 1: [2, 0, 2, 2]}
    ranks = VllmRanks(ParallelLayout(dp=2))

    def body(rank):
        config = ParallelConfig(data_parallel_size=2, data_parallel_rank=rank, disable_nccl_for_dp_synchronization=True)
        work, counter, running = list(steps[rank]), 0, True
        while work or running:
            tokens = work.pop(0) if work else 1  # an idle rank runs a dummy batch of one token
            if not (tokens == 0 and idle_policy == "external_launcher_only"):
                coordinate_batch_across_dp(num_tokens_unpadded=max(tokens, 1), allow_microbatching=False,
                                           parallel_config=config, cudagraph_mode=2)
            counter += 1
            if counter % 4 == 0:
                running, _ = ParallelConfig.sync_dp_state(ranks.engine_dp_group(), bool(work), False)

    if idle_policy == "always_dummy":
        stats = ranks.run(body)
        assert stats.met["dp:engine"] == 2
        return
    with pytest.raises(CollectiveDeadlock) as info:
        ranks.run(body)
    assert "dp:engine" in str(info.value) and "dp:cpu" in str(info.value)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_drafters_sync_and_the_restatement_agree(seed):
    """The proposer's call (``is_draft_model=True``, spec_decode/llm_base_proposer.py:817): mode NONE
    in the tensor and always padded to the DP maximum (model_runner_v1.py:700), on generated
    token counts; held to `coordination.sync_metadata_across_dp(..., draft=True)`."""
    dp, steps = 3, _steps(seed, 3, 8)
    got = _runner_syncs(dp, steps, lambda runner, tokens, mode: runner._sync_metadata_across_dp(
        num_tokens=tokens, is_draft_model=True))
    for index, results in enumerate(_restated_syncs(dp, steps, draft=True)):
        for rank, result in enumerate(results):
            assert got[rank][index] == (result.max_tokens, result.num_tokens_across_dp, result.synced_mode)
