"""Request workloads and the scheduler that turns them into batches.

Theory of operation. A workload is a list of `Request`s: a prompt of made-up words
(deterministic by seed; `sentence`), tokenised by a stable hash of each word into the
model's vocabulary, and an output length. Prompt and output lengths follow a `WorkloadSpec`
(uniform ranges by default); ``arrival_step`` lets a workload hold requests back until a
given step (bursty traffic).

The `Scheduler` is a small vLLM-v1-style continuous batcher. Every step it serves the
running requests first, then admits waiting ones, under two budgets — at most
``max_num_seqs`` requests and ``max_num_batched_tokens`` tokens per batch:

* a request still in its prompt gets a chunk of it (chunked prefill);
* a decoding request gets q = 1 + k tokens: its last token plus k made-up draft tokens
  (speculative decoding has no proposer here; only the shapes matter).

A batch whose requests all decode with q tokens each is a *uniform decode* batch — the
kind FULL_DECODE_ONLY graphs serve. After the model ran, `complete` applies the sampled
tokens: a prefill that finished its prompt emits its first token; a decode step accepts
some of its drafts (drawn from the seed) plus one sampled token. Paged KV blocks are
allocated as positions are reached and freed when a request finishes or fails.
"""

from __future__ import annotations

import enum
from collections import deque
import hashlib
import math
import random
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

from ascendgraph.errors import ConfigError

__all__ = [
    "Request",
    "WorkloadSpec",
    "generate_workload",
    "tokenize",
    "RequestStatus",
    "RequestState",
    "ScheduledRequest",
    "ScheduledBatch",
    "BlockAllocator",
    "Scheduler",
    "OutOfKVBlocks",
    "simulate_batches",
    "simulate_steps",
]

_WORD = re.compile(r"\w+|[^\w\s]")


def tokenize(text: str, vocab_size: int) -> list[int]:
    """Word-level tokens: a stable hash of each word (and punctuation mark) modulo the vocabulary."""
    if vocab_size < 1:
        raise ConfigError(f"vocab_size must be >= 1, got {vocab_size}", key="vocab_size")
    return [
        int.from_bytes(hashlib.blake2b(piece.lower().encode(), digest_size=8).digest(), "little") % vocab_size
        for piece in _WORD.findall(text)
    ]


@dataclass(frozen=True)
class Request:
    """One generation request."""

    request_id: str
    prompt: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_step: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


# The longest prompt (in words) or output (in tokens) a generated workload may ask for: a
# large model's whole context (128 Ki positions). Longer is a typo that would generate
# gigabytes of prompt text before the model's own position limit refuses it.
MAX_SEQUENCE_TOKENS = 131072


@dataclass(frozen=True)
class WorkloadSpec:
    """Length distributions of a generated workload (inclusive ranges)."""

    num_requests: int = 16
    seed: int = 0
    prompt_words: tuple[int, int] = (6, 48)
    output_tokens: tuple[int, int] = (4, 24)
    burst_size: int = 0  # > 0: requests arrive in bursts of this many, one burst every `burst_gap` steps
    burst_gap: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.num_requests, bool) or not isinstance(self.num_requests, int) or self.num_requests < 1:
            raise ConfigError(f"requests must be an integer >= 1, got {self.num_requests!r}", key="requests")
        for name in ("prompt_words", "output_tokens"):
            value = getattr(self, name)
            if (not isinstance(value, (tuple, list)) or len(value) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
                raise ConfigError(f"{name} must be a range (low, high) of integers, got {value!r}", key=name)
            low, high = value
            if not (1 <= low <= high <= MAX_SEQUENCE_TOKENS):
                raise ConfigError(f"{name} must be a range (low, high) with 1 <= low <= high <= "
                                  f"{MAX_SEQUENCE_TOKENS}, got {(low, high)}", key=name)


# Syllables of the made-up prompt words: letters only, so each word is one token.
_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
           "br", "cl", "dr", "gr", "pl", "st", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "nd", "st")


def sentence(rng: random.Random, words: int) -> str:
    """A capitalised sentence of ``words`` made-up words and a full stop: ``words + 1`` tokens.
    (The prompts' meaning never mattered, only their lengths and a stable text per seed; this
    replaced the Faker library, whose pytest plugin every pytest process of a user paid for.)"""
    text = " ".join(
        "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(rng.randint(1, 3)))
        for _ in range(words)
    )
    return text[:1].upper() + text[1:] + "."


def generate_workload(spec: WorkloadSpec, *, vocab_size: int) -> list[Request]:
    """Deterministic requests for a spec: the same seed gives the same prompts and lengths."""
    rng = random.Random(spec.seed)  # lengths and arrivals
    words_rng = random.Random(f"ascendgraph-prompt-words-{spec.seed}")  # the prompts' text
    requests = []
    for index in range(spec.num_requests):
        words = rng.randint(*spec.prompt_words)
        text = sentence(words_rng, words)
        tokens = tokenize(text, vocab_size) or [0]
        arrival = (index // spec.burst_size) * spec.burst_gap if spec.burst_size > 0 else 0
        requests.append(
            Request(
                request_id=f"req-{index}",
                prompt=text,
                prompt_token_ids=tuple(tokens),
                max_tokens=rng.randint(*spec.output_tokens),
                arrival_step=arrival,
            )
        )
    return requests


# --------------------------------------------------------------------------- scheduling


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


class OutOfKVBlocks(RuntimeError):
    """The KV cache has no free block left (the engine sizes it so this cannot happen)."""


class BlockAllocator:
    """Free-list allocator of paged KV-cache blocks."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ConfigError(f"the KV cache needs at least one block, got {num_blocks}", key="num_blocks")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise OutOfKVBlocks(f"all {self.num_blocks} KV-cache blocks are in use")
        return self._free.pop()

    def free(self, blocks: Iterable[int]) -> None:
        self._free.extend(reversed(list(blocks)))


@dataclass
class RequestState:
    """A request as the scheduler tracks it."""

    request: Request
    num_computed_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    failure: Optional[str] = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def in_prefill(self) -> bool:
        return self.num_computed_tokens < self.request.prompt_len

    @property
    def last_token(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.request.prompt_token_ids[-1]


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a batch: its query tokens at positions start .. start + n - 1."""

    request_id: str
    token_ids: tuple[int, ...]
    start_position: int
    is_prefill: bool
    num_draft_tokens: int
    slot_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    completes_prompt: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        """KV length once this step's tokens are written."""
        return self.start_position + self.num_tokens


@dataclass(frozen=True)
class ScheduledBatch:
    """The requests of one step, in the order their tokens are packed."""

    step: int
    requests: tuple[ScheduledRequest, ...]
    query_len: int  # 1 + k

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.requests)

    @property
    def num_reqs(self) -> int:
        return len(self.requests)

    @property
    def has_prefill(self) -> bool:
        return any(r.is_prefill for r in self.requests)

    @property
    def uniform_decode(self) -> bool:
        """Every request decodes with exactly q tokens (vLLM's uniform-decode test)."""
        return bool(self.requests) and all(
            not r.is_prefill and r.num_tokens == self.query_len for r in self.requests
        )

    @property
    def query_start_loc(self) -> list[int]:
        """Cumulative end offsets of each request's tokens (FIA's actual_seq_lengths)."""
        ends, total = [], 0
        for r in self.requests:
            total += r.num_tokens
            ends.append(total)
        return ends

    @property
    def seq_lens(self) -> list[int]:
        return [r.seq_len for r in self.requests]

    @property
    def kind(self) -> str:
        if self.uniform_decode:
            return "decode"
        return "prefill" if all(r.is_prefill for r in self.requests) else "mixed"


class Scheduler:
    """Continuous batching under max_num_seqs / max_num_batched_tokens (chunked prefill)."""

    def __init__(
        self,
        requests: Sequence[Request],
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        num_speculative_tokens: int = 0,
        block_size: int = 128,
        num_blocks: Optional[int] = None,
        vocab_size: int = 2,
        seed: int = 0,
    ) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ConfigError("max_num_seqs and max_num_batched_tokens must be >= 1", key="max_num_seqs")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.num_speculative_tokens = num_speculative_tokens
        self.query_len = 1 + num_speculative_tokens
        if self.query_len > max_num_batched_tokens:
            raise ConfigError(
                f"a decoding request needs 1 + num_speculative_tokens = {self.query_len} tokens per step, more than "
                f"max_num_batched_tokens={max_num_batched_tokens}",
                key="max_num_batched_tokens",
            )
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.states = {r.request_id: RequestState(r) for r in requests}
        if len(self.states) != len(requests):
            raise ConfigError("request ids must be unique", key="requests")
        self.max_blocks_per_request = max(
            (self.blocks_needed(r) for r in requests), default=1
        )
        if num_blocks is None:
            num_blocks = self.max_blocks_per_request * min(max_num_seqs, max(len(requests), 1))
        if num_blocks < self.max_blocks_per_request:
            raise ConfigError(
                f"the KV cache has {num_blocks} blocks but one request may need {self.max_blocks_per_request} "
                f"(block_size {block_size}); give it more blocks",
                key="num_blocks",
            )
        self.allocator = BlockAllocator(num_blocks)
        # A deque: admitting from the head is O(1), so a million requests schedule in linear time.
        self._waiting: deque[str] = deque(r.request_id for r in requests)
        self._running: list[str] = []
        self._waiting_retired = 0  # retired requests still in `_waiting` (removed in batches)
        self._rng = random.Random(seed)
        self.step = 0

    def blocks_needed(self, request: Request) -> int:
        """KV blocks a request can ever need (prompt + outputs + one step of drafts)."""
        longest = request.prompt_len + request.max_tokens + self.query_len
        return max(1, math.ceil(longest / self.block_size))

    # -- state ---------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return bool(self._running) or len(self._waiting) > self._waiting_retired

    @property
    def finished(self) -> list[RequestState]:
        return [s for s in self.states.values() if s.status is RequestStatus.FINISHED]

    @property
    def failed(self) -> list[RequestState]:
        return [s for s in self.states.values() if s.status is RequestStatus.FAILED]

    def draft_tokens(self, state: RequestState) -> tuple[int, ...]:
        """Made-up draft tokens (deterministic): only the shapes matter."""
        base = state.last_token
        return tuple((base * 31 + 7 * (i + 1)) % self.vocab_size for i in range(self.num_speculative_tokens))

    # -- scheduling ----------------------------------------------------------------
    def _ensure_blocks(self, state: RequestState, upto_position: int) -> None:
        needed = upto_position // self.block_size + 1
        while len(state.block_ids) < needed:
            state.block_ids.append(self.allocator.allocate())

    def _slots(self, state: RequestState, start: int, count: int) -> tuple[int, ...]:
        bs = self.block_size
        return tuple(state.block_ids[p // bs] * bs + p % bs for p in range(start, start + count))

    def _scheduled(self, state: RequestState, budget: int) -> Optional[ScheduledRequest]:
        start = state.num_computed_tokens
        if state.in_prefill:
            count = min(state.request.prompt_len - start, budget)
            if count <= 0:
                return None
            tokens = state.request.prompt_token_ids[start : start + count]
            drafts = 0
            completes = start + count == state.request.prompt_len
        else:
            if budget < self.query_len:
                return None
            tokens = (state.last_token, *self.draft_tokens(state))
            count = len(tokens)
            drafts = self.num_speculative_tokens
            completes = False
        self._ensure_blocks(state, start + count - 1)
        return ScheduledRequest(
            request_id=state.request_id,
            token_ids=tuple(tokens),
            start_position=start,
            is_prefill=state.in_prefill,
            num_draft_tokens=drafts,
            slot_ids=self._slots(state, start, count),
            block_ids=tuple(state.block_ids),
            completes_prompt=completes,
        )

    def schedule(self) -> Optional[ScheduledBatch]:
        """The next batch, or None when nothing is runnable this step (waiting for arrivals)."""
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        for request_id in list(self._running):
            if len(scheduled) >= self.max_num_seqs or budget <= 0:
                break
            item = self._scheduled(self.states[request_id], budget)
            if item is not None:
                scheduled.append(item)
                budget -= item.num_tokens
        self._drop_retired_heads()
        while self._waiting and len(self._running) < self.max_num_seqs and budget > 0:
            state = self.states[self._waiting[0]]
            if state.request.arrival_step > self.step:
                break
            if self.allocator.num_free < self.blocks_needed(state.request):
                break  # admit only what the KV cache can always hold (no preemption here)
            item = self._scheduled(state, budget)
            if item is None:
                break
            self._waiting.popleft()
            self._drop_retired_heads()
            self._running.append(state.request_id)
            state.status = RequestStatus.RUNNING
            scheduled.append(item)
            budget -= item.num_tokens
        if not scheduled and not self._running and self._waiting:
            head = self.states[self._waiting[0]].request
            if head.arrival_step <= self.step:  # pragma: no cover - prevented by the KV sizing check
                raise OutOfKVBlocks(f"request {head.request_id} can never be admitted: not enough KV blocks")
        batch = ScheduledBatch(self.step, tuple(scheduled), self.query_len) if scheduled else None
        self.step += 1
        return batch

    # -- results -------------------------------------------------------------------
    def accepted_drafts(self, request_id: str) -> int:
        """How many of a decode step's drafts are accepted (drawn from the seed)."""
        return self._rng.randint(0, self.num_speculative_tokens) if self.num_speculative_tokens else 0

    def complete(self, batch: ScheduledBatch, sampled: Mapping[str, Sequence[int]]) -> list[str]:
        """Apply a step's results. ``sampled[id]`` holds, per query token, the token the
        model predicts after it. Returns the ids of requests that finished."""
        done = []
        for item in batch.requests:
            state = self.states[item.request_id]
            if state.status is not RequestStatus.RUNNING:
                continue
            predictions = list(sampled[item.request_id])
            if item.is_prefill:
                state.num_computed_tokens += item.num_tokens
                if item.completes_prompt:
                    state.output_token_ids.append(predictions[-1])
            else:
                accepted = self.accepted_drafts(item.request_id)
                drafts = list(item.token_ids[1 : 1 + accepted])
                state.num_computed_tokens += 1 + accepted
                state.output_token_ids.extend(drafts + [predictions[accepted]])
            if len(state.output_token_ids) >= state.request.max_tokens:
                del state.output_token_ids[state.request.max_tokens :]
                self._retire(state, RequestStatus.FINISHED)
                done.append(state.request_id)
        return done

    def fail(self, request_ids: Iterable[str], reason: str) -> None:
        """Mark requests failed (e.g. a step that differed from eager) and free their blocks."""
        for request_id in request_ids:
            state = self.states[request_id]
            if state.status in (RequestStatus.FINISHED, RequestStatus.FAILED):
                continue
            state.failure = reason
            self._retire(state, RequestStatus.FAILED)

    def fail_all(self, reason: str) -> None:
        self.fail([*self._running, *(i for i in self._waiting if self.states[i].status is RequestStatus.WAITING)],
                  reason)

    def _drop_retired_heads(self) -> None:
        while self._waiting and self.states[self._waiting[0]].status is not RequestStatus.WAITING:
            self._waiting.popleft()
            self._waiting_retired -= 1

    def _retire(self, state: RequestState, status: RequestStatus) -> None:
        was = state.status
        state.status = status
        self.allocator.free(state.block_ids)
        state.block_ids = []
        if was is RequestStatus.RUNNING:  # at most max_num_seqs of them: a short list
            self._running.remove(state.request_id)
        elif was is RequestStatus.WAITING:  # a failed waiting request: dropped from the queue lazily
            self._waiting_retired += 1
            if self._waiting_retired * 2 > len(self._waiting):  # amortised O(1) per request
                self._waiting = deque(i for i in self._waiting
                                      if self.states[i].status is RequestStatus.WAITING)
                self._waiting_retired = 0


def simulate_batches(
    requests: Sequence[Request],
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_speculative_tokens: int = 0,
    block_size: int = 128,
    vocab_size: int = 2,
    seed: int = 0,
) -> list[ScheduledBatch]:
    """The batches the scheduler forms for a workload, without running a model (every
    prediction is token 0). Planners use ``[b.num_tokens for b in ...]`` as the workload's
    batch-size distribution."""
    return [batch for batch in simulate_steps(
        requests, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        num_speculative_tokens=num_speculative_tokens, block_size=block_size, vocab_size=vocab_size, seed=seed)
        if batch is not None]


def simulate_steps(
    requests: Sequence[Request],
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_speculative_tokens: int = 0,
    block_size: int = 128,
    vocab_size: int = 2,
    seed: int = 0,
) -> list[Optional[ScheduledBatch]]:
    """Every scheduler step until the workload is done: its batch, or None for a step where
    requests are left but none is schedulable yet (each waits for its arrival step): a
    zero-token step."""
    scheduler = Scheduler(
        requests,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        num_speculative_tokens=num_speculative_tokens,
        block_size=block_size,
        vocab_size=vocab_size,
        seed=seed,
    )
    steps: list[Optional[ScheduledBatch]] = []
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        steps.append(batch)
        if batch is not None:
            scheduler.complete(batch, {r.request_id: [0] * r.num_tokens for r in batch.requests})
    return steps
