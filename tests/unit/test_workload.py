"""Workloads and the scheduler: determinism, budgets, batch kinds, spec decode, KV blocks."""

from __future__ import annotations

import pytest

from ascendgraph.errors import ConfigError
from ascendgraph.runtime.workload import (
    Request,
    RequestStatus,
    Scheduler,
    WorkloadSpec,
    generate_workload,
    sentence,
    simulate_batches,
    tokenize,
)


def _requests(*prompt_lens: int, max_tokens: int = 3, arrival: tuple[int, ...] = ()) -> list[Request]:
    return [
        Request(f"r{i}", "x", tuple(range(1, n + 1)), max_tokens, arrival[i] if arrival else 0)
        for i, n in enumerate(prompt_lens)
    ]


def _run(scheduler: Scheduler) -> list:
    batches = []
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        if batch is None:
            continue
        batches.append(batch)
        scheduler.complete(batch, {r.request_id: [5] * r.num_tokens for r in batch.requests})
    return batches


def test_tokenize_is_stable_and_inside_the_vocabulary():
    tokens = tokenize("Hello, world! Hello", 100)
    assert tokens == tokenize("hello , WORLD ! hello", 100)
    assert len(tokens) == 5 and tokens[0] == tokens[-1]
    assert all(0 <= t < 100 for t in tokens)


def test_same_seed_gives_the_same_workload_and_another_seed_does_not():
    spec = WorkloadSpec(num_requests=5, seed=3)
    first = generate_workload(spec, vocab_size=2048)
    assert first == generate_workload(spec, vocab_size=2048)
    assert first != generate_workload(WorkloadSpec(num_requests=5, seed=4), vocab_size=2048)
    assert [r.request_id for r in first] == [f"req-{i}" for i in range(5)]
    assert all(4 <= r.max_tokens <= 24 and r.prompt_len >= 1 for r in first)


def test_a_prompt_of_n_words_is_n_plus_one_tokens_and_its_text_follows_the_seed():
    import random

    spec = WorkloadSpec(num_requests=20, seed=11, prompt_words=(1, 40))
    lengths = random.Random(11)
    for request in generate_workload(spec, vocab_size=4096):
        words = lengths.randint(1, 40)
        assert request.prompt_len == words + 1 == len(request.prompt.split()) + 1
        lengths.randint(*spec.output_tokens)  # the same draws generate_workload makes, in its order
        assert request.prompt[0].isupper() and request.prompt.endswith(".")
        assert request.prompt[:-1].replace(" ", "").isalpha()
    assert sentence(random.Random(1), 6) == sentence(random.Random(1), 6) != sentence(random.Random(2), 6)


def test_bursty_workload_holds_requests_back_until_their_arrival_step():
    requests = generate_workload(WorkloadSpec(num_requests=5, burst_size=2, burst_gap=3), vocab_size=50)
    assert [r.arrival_step for r in requests] == [0, 0, 3, 3, 6]


@pytest.mark.parametrize("bad", [0, -1, True])
def test_workload_needs_at_least_one_request(bad):
    with pytest.raises(ConfigError, match="requests"):
        WorkloadSpec(num_requests=bad)


def test_batches_respect_token_and_sequence_budgets():
    scheduler = Scheduler(_requests(10, 3, 7, 2, 9), max_num_seqs=3, max_num_batched_tokens=8)
    for batch in _run(scheduler):
        assert batch.num_tokens <= 8
        assert batch.num_reqs <= 3
    assert len(scheduler.finished) == 5


def test_long_prompts_are_chunked_and_emit_their_first_token_at_the_end():
    scheduler = Scheduler(_requests(10), max_num_seqs=4, max_num_batched_tokens=4)
    batches = _run(scheduler)
    assert [b.num_tokens for b in batches[:3]] == [4, 4, 2]
    assert [b.requests[0].completes_prompt for b in batches[:3]] == [False, False, True]
    assert batches[3].kind == "decode" and batches[3].requests[0].start_position == 10


def test_all_decoding_requests_form_a_uniform_decode_batch():
    scheduler = Scheduler(_requests(2, 2), max_num_seqs=4, max_num_batched_tokens=16)
    batches = _run(scheduler)
    assert batches[0].kind == "prefill" and not batches[0].uniform_decode
    assert batches[1].uniform_decode and batches[1].num_tokens == 2


def test_a_prefill_beside_decodes_is_a_mixed_batch():
    scheduler = Scheduler(_requests(2, 3, arrival=(0, 1)), max_num_seqs=4, max_num_batched_tokens=16)
    batches = _run(scheduler)
    assert batches[1].kind == "mixed" and not batches[1].uniform_decode
    assert batches[1].has_prefill


@pytest.mark.parametrize("k", [1, 2])
def test_speculative_decoding_gives_each_decoding_request_one_plus_k_tokens(k):
    scheduler = Scheduler(_requests(3, 4, max_tokens=6), max_num_seqs=4, max_num_batched_tokens=32,
                          num_speculative_tokens=k, vocab_size=100)
    batches = _run(scheduler)
    decodes = [b for b in batches if b.uniform_decode]
    assert decodes, "expected uniform decode batches"
    for batch in decodes:
        assert all(r.num_tokens == 1 + k and r.num_draft_tokens == k for r in batch.requests)
        assert batch.query_start_loc == [(1 + k) * (i + 1) for i in range(batch.num_reqs)]
    for state in scheduler.finished:
        assert len(state.output_token_ids) == state.request.max_tokens


def test_slots_follow_the_block_table():
    scheduler = Scheduler(_requests(5), max_num_seqs=1, max_num_batched_tokens=8, block_size=4)
    batch = scheduler.schedule()
    item = batch.requests[0]
    blocks = item.block_ids
    assert len(blocks) == 2
    assert item.slot_ids == tuple(blocks[p // 4] * 4 + p % 4 for p in range(5))


def test_failed_requests_free_their_blocks():
    scheduler = Scheduler(_requests(5, 5), max_num_seqs=2, max_num_batched_tokens=16, block_size=4)
    free_before = scheduler.allocator.num_free
    batch = scheduler.schedule()
    assert scheduler.allocator.num_free < free_before
    scheduler.fail([r.request_id for r in batch.requests], "mismatch")
    assert scheduler.allocator.num_free == free_before
    assert {s.status for s in scheduler.states.values()} == {RequestStatus.FAILED}
    assert not scheduler.has_unfinished()


def test_a_kv_cache_too_small_for_one_request_is_a_config_error():
    with pytest.raises(ConfigError, match="KV cache"):
        Scheduler(_requests(300), max_num_seqs=1, max_num_batched_tokens=8, block_size=128, num_blocks=1)


def test_simulated_batches_cover_every_token_of_the_workload():
    requests = _requests(7, 12, 3, max_tokens=4)
    batches = simulate_batches(requests, max_num_seqs=2, max_num_batched_tokens=8)
    prefill_tokens = sum(r.num_tokens for b in batches for r in b.requests if r.is_prefill)
    assert prefill_tokens == 7 + 12 + 3
    assert all(b.num_tokens <= 8 and b.num_reqs <= 2 for b in batches)


# --------------------------------------------------------------------------- prompts in many languages
# Realistic prompts (tests/realistic_data.py, Faker, seeded): scripts without spaces between
# words, non-Latin letters, accents and punctuation of every kind.


def test_prompts_in_any_language_tokenise_stably_inside_the_vocabulary():
    from tests.realistic_data import PROMPT_LOCALES, prompts

    seen = set()
    for locale, text in prompts(2, seed=3):
        tokens = tokenize(text, 1000)
        seen.add(locale)
        assert tokens, f"{locale}: {text!r} gave no token"
        assert all(0 <= t < 1000 for t in tokens), locale
        assert tokenize(text, 1000) == tokens, f"{locale}: not stable"
        assert tokenize("  " + text.replace(" ", "\n\t ") + " ", 1000) == tokens, f"{locale}: spacing changed tokens"
        assert tokenize(f"{text} {text}", 1000) == tokens * 2, f"{locale}: a repeated prompt tokenises twice"
    assert seen == set(PROMPT_LOCALES)


def test_a_workload_of_prompts_in_many_languages_is_served_whole_within_the_budgets():
    from tests.realistic_data import prompts

    requests = [
        Request(f"{locale}-{i}", text, tuple(tokenize(text, 151_936)), 2, arrival_step=i % 5)
        for i, (locale, text) in enumerate(prompts(2, seed=5))
    ]
    scheduler = Scheduler(requests, max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
                          vocab_size=151_936)
    batches = _run(scheduler)
    assert all(b.num_tokens <= 16 and b.num_reqs <= 4 for b in batches)
    prefilled: dict[str, list[int]] = {}
    for batch in batches:
        for r in batch.requests:
            if r.is_prefill:
                prefilled.setdefault(r.request_id, []).extend(r.token_ids)
    assert prefilled == {r.request_id: list(r.prompt_token_ids) for r in requests}, "every prompt token once, in order"
    assert len(scheduler.finished) == len(requests) and not scheduler.failed
