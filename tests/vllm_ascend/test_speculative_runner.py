"""vLLM Ascend's NPUModelRunner, whole, with speculative decoding: vLLM's n-gram drafting
(``SpeculativeConfig(method="ngram")``, no draft model) under cudagraph mode FULL, served by
vLLM's scheduler on the simulated NPU and compared with the same runner served eagerly.

What runs: the runner builds ``AscendNgramProposer`` (spec_decode/__init__.py@182b75ea:36-37,
``get_spec_decode_method``) and ``AscendRejectionSampler`` (worker/model_runner_v1.py:609-626);
each step ``sample_tokens`` verifies the scheduled drafts in ``_sample`` (2449-2465: the
rejection sampler over the target logits; greedy, without Triton its PyTorch kernels,
sample/rejection_sampler.py:536-600) and, after ``_bookkeeping_sync``, proposes the next drafts on
the host from the accepted tokens (2319-2325: n-gram is not a padded-batch drafter;
``propose_draft_token_ids`` 1449-1473 calls ``AscendNgramProposer.propose``,
spec_decode/ngram_proposer.py:29-60, over ``input_batch.token_ids_cpu``). The engine hands the
drafts to the scheduler (`serving.Engine._post_step`, vLLM's ``EngineCore.post_step``).

With 3 speculative tokens a decode request carries 1 to 4 tokens (``uniform_decode_query_len``
4). The prompts are chosen so that the proposer sometimes finds nothing (a decode step of one
token per request) and sometimes proposes drafts the target model accepts entirely, in part,
or not at all. Under FULL every batch up to the largest capture size replays one FULL graph,
so a request decoding one token alone is padded to a graph of 4 tokens while the runner's
request count stays 1: ``_pad_query_start_loc_for_fia`` (model_runner_v1.py:801-846) must
then add the FIA dummy request so that ``query_start_loc`` ends at the padded token count (the
TND rule ``tnd_tokens_equal_last_end``); vllm-project/vllm-ascend#9863 keeps FULL out of the
uniform-batch branch that left it at 1.
"""

from __future__ import annotations

import harness

harness.require()

import pytest  # noqa: E402
import torch  # noqa: E402

import serving  # noqa: E402
from serving import Arrival, RunnerSpec  # noqa: E402

SPECULATIVE_TOKENS = 3
QUERY_LEN = 1 + SPECULATIVE_TOKENS  # the runner's uniform_decode_query_len
SPEC = RunnerSpec(mode="FULL", capture_sizes=(4, 8, 16), ngram_speculative_tokens=SPECULATIVE_TOKENS)

# The tiny model with its dummy weights (seed 0) settles, greedily, into two-token cycles
# (``a`` generates 219, 280, 219, ...), which the n-gram proposer learns from the request's
# own tokens. The other prompts plant n-grams that disagree with that cycle.
_A = torch.randint(1, serving.harness_vocab(), (12,), generator=torch.Generator().manual_seed(1)).tolist()
_B = tuple(_A[:6] + [133, 55, 56, 57] + _A[6:] + [219, 7, 8, 9, 10])
_D = tuple(_A[:6] + [219, 280, 56, 57] + _A[6:])
_C = (5, 6, 7, 5, 6, 7, 5, 6)
STREAM = [
    Arrival(0, "a", prompt_len=12, max_tokens=8, seed=1),  # first decode: nothing to propose, then accepted cycles
    # ``b`` generates 133 first: the prompt's 133 proposes 55, 56, 57, all rejected
    Arrival(0, "b", prompt_len=len(_B), max_tokens=6, prompt=_B),
    # ``d`` generates 219 first: the prompt's 219, 280, 56, 57 is accepted in part (280)
    Arrival(0, "d", prompt_len=len(_D), max_tokens=4, prompt=_D),
    # arrives while the others decode, then decodes alone: one token, then drafts
    Arrival(3, "c", prompt_len=len(_C), max_tokens=8, prompt=_C),
]


@pytest.fixture(scope="module")
def eager() -> serving.Served:
    return serving.serve(SPEC.eager(), STREAM)


@pytest.fixture(scope="module")
def graph() -> serving.Served:
    return serving.serve(SPEC, STREAM)


def drafted(records: list[serving.StepRecord]) -> dict[str, int]:
    """How vLLM's rejection sampler ruled on the scheduled drafts, per request and step: a step
    samples the accepted drafts plus one token, so ``len(sampled) - 1`` drafts were accepted."""
    outcome = {"accepted": 0, "partly accepted": 0, "rejected": 0}
    for record in records:
        for request_id, drafts in record.drafts.items():
            accepted = len(record.sampled[request_id]) - 1
            assert 0 <= accepted <= len(drafts), (record.index, request_id, drafts, record.sampled[request_id])
            assert record.sampled[request_id][:accepted] == drafts[:accepted]
            key = "accepted" if accepted == len(drafts) else "rejected" if accepted == 0 else "partly accepted"
            outcome[key] += 1
    return outcome


def test_the_ngram_drafts_are_scheduled_and_verified_by_the_rejection_sampler(eager: serving.Served) -> None:
    from vllm_ascend.sample.rejection_sampler import AscendRejectionSampler
    from vllm_ascend.spec_decode.ngram_proposer import AscendNgramProposer

    runner = eager.worker.runner
    assert isinstance(runner.drafter, AscendNgramProposer)
    assert isinstance(runner.rejection_sampler, AscendRejectionSampler)
    assert runner.uniform_decode_query_len == QUERY_LEN
    # the scheduler put each step's drafts in the step: one token per request plus its drafts
    for record in eager.records:
        for request_id, drafts in record.drafts.items():
            assert 1 <= len(drafts) <= SPECULATIVE_TOKENS and record.scheduled[request_id] == 1 + len(drafts)
    assert all(n > 0 for n in drafted(eager.records).values()), drafted(eager.records)
    # decode steps in which the proposer found nothing: one token per request
    assert any(r.scheduled and not r.drafts and set(r.scheduled.values()) == {1} for r in eager.records)
    assert eager.log.violations() == []
    # every request served to its max_tokens (a step's accepted drafts may sample past it: vLLM's
    # scheduler keeps the tokens up to the limit, vllm/v1/core/sched/scheduler.py:2100-2109, check_stop)
    generated = serving.tokens(eager.records)
    assert all(len(generated[a.request_id]) >= a.max_tokens for a in STREAM), generated


def test_full_graph_serving_with_ngram_drafts_equals_eager_step_by_step(graph: serving.Served,
                                                                         eager: serving.Served) -> None:
    from vllm.config import CUDAGraphMode

    keys = graph.worker.runner.cudagraph_dispatcher.cudagraph_keys
    assert keys[CUDAGraphMode.FULL] and graph.graphs_after_serving == graph.graphs_before_serving
    # the same requests and drafts in every step, the same tokens and logits, bitwise
    assert [(r.scheduled, r.drafts) for r in graph.records] == [(r.scheduled, r.drafts) for r in eager.records]
    for g, e in zip(graph.records, eager.records):
        assert g.sampled == e.sampled, f"step {g.index} ({g.runtime_mode}): {g.sampled} != {e.sampled}"
        if e.logits is not None:
            assert torch.equal(g.logits.cpu()[: e.logits.shape[0]], e.logits.cpu()), \
                f"step {g.index} ({g.runtime_mode}, {g.padded_tokens} tokens): logits differ"
    assert drafted(graph.records) == drafted(eager.records)
    assert graph.log.violations() == []
    full = [r for r in graph.records if r.runtime_mode == "FULL"]
    # FULL replays verified drafts ...
    assert any(r.drafts for r in full)
    # ... and replayed the corner case of vllm-project/vllm-ascend#9863: one request decoding
    # one token, padded to a graph of 1 + 3 speculative tokens
    assert any(r.scheduled and set(r.scheduled.values()) == {1} and len(r.scheduled) == 1
               and r.padded_tokens == QUERY_LEN for r in full)
