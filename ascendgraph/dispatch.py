"""The graph dispatcher: which graph (if any) a batch replays (docs/semantics.md §5).

Theory of operation. At start-up the dispatcher derives the set of *keys* — padded
batch descriptors — for each runtime mode (FULL, PIECEWISE) from the resolved mode, the
capture sizes and the LoRA cases. Those keys are the single source of truth: the engine
captures exactly them (in `capture_order`) and, per step, `dispatch` pads the batch and
returns the runtime mode plus the key to replay, or NONE with the bare descriptor when
no graph applies.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from itertools import product
from typing import AbstractSet, Optional, Sequence

from ascendgraph.errors import ConfigError
from ascendgraph.modes import GraphMode
from ascendgraph.sizes import padding_table

__all__ = ["BatchDescriptor", "GraphDispatcher", "captured_lora_counts"]


@dataclass(frozen=True)
class BatchDescriptor:
    """A padded batch shape; the key a graph is captured and replayed under.

    ``num_reqs=None`` means "any number of requests" (piecewise keys).
    """

    num_tokens: int
    num_reqs: Optional[int] = None
    uniform: bool = False
    has_lora: bool = False
    num_active_loras: int = 0

    def __str__(self) -> str:
        reqs = "any" if self.num_reqs is None else str(self.num_reqs)
        text = f"tokens={self.num_tokens} reqs={reqs}{' uniform' if self.uniform else ''}"
        if self.has_lora:
            text += f" loras={self.num_active_loras}"
        return text


def captured_lora_counts(max_loras: int, specialize_active_lora: bool) -> list[int]:
    """Active-LoRA counts that get their own graphs: powers of two up to max_loras, plus max_loras + 1."""
    if not specialize_active_lora:
        return [max_loras + 1]
    return [n for n in range(1, max_loras + 2) if (n & (n - 1)) == 0 or n == max_loras + 1]


class GraphDispatcher:
    """Keys per runtime mode, the capture order, and per-batch dispatch (vLLM's CudagraphDispatcher)."""

    def __init__(
        self,
        mode: GraphMode,
        *,
        capture_sizes: Sequence[int],
        max_num_seqs: int,
        uniform_decode_query_len: int = 1,
        max_loras: int = 0,
        specialize_active_lora: bool = False,
        specialize_lora: bool = True,
    ) -> None:
        self.mode = GraphMode.parse(mode)
        self.capture_sizes = sorted(set(capture_sizes))
        self.max_size = self.capture_sizes[-1] if self.capture_sizes else 0
        if max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {max_num_seqs}", key="max_num_seqs")
        if uniform_decode_query_len < 1:
            raise ConfigError(
                f"uniform_decode_query_len must be >= 1, got {uniform_decode_query_len}",
                key="num_speculative_tokens",
            )
        if max_loras < 0:
            raise ConfigError(f"max_loras must be >= 0, got {max_loras}", key="max_loras")
        self.max_num_seqs = max_num_seqs
        self.query_len = uniform_decode_query_len
        self.max_loras = max_loras
        # vLLM reads this flag from the LoRA config: without LoRA there is nothing to specialise.
        self.specialize_active_lora = specialize_active_lora and max_loras > 0
        self.specialize_lora = specialize_lora
        self._padded = padding_table(self.capture_sizes)
        self._keys: dict[GraphMode, set[BatchDescriptor]] = {GraphMode.PIECEWISE: set(), GraphMode.FULL: set()}
        self.lora_cases = self._lora_cases()
        self.captured_lora_counts = [n for n in self.lora_cases if n]
        self.keys_initialized = False
        self._initialise_keys()

    # -- keys ----------------------------------------------------------------------
    def _lora_cases(self) -> list[int]:
        if self.max_loras == 0:
            return [0]
        if self.specialize_lora:
            return [0] + captured_lora_counts(self.max_loras, self.specialize_active_lora)
        return [self.max_loras + 1]

    def _padded_descriptor(
        self, num_tokens: int, uniform: bool, has_lora: bool, num_active_loras: int
    ) -> BatchDescriptor:
        padded = self._padded[num_tokens]
        if uniform and self.mode.has_mode(GraphMode.FULL):
            if padded % self.query_len:
                raise ConfigError(
                    f"uniform decode batch of {num_tokens} tokens pads to {padded}, which is not a multiple of "
                    f"the decode query length {self.query_len}; capture sizes must be multiples of "
                    "1 + num_speculative_tokens for FULL decode graphs",
                    key="cudagraph_capture_sizes",
                )
            num_reqs = min(padded // self.query_len, self.max_num_seqs)
        else:
            uniform = False
            num_reqs = min(padded, self.max_num_seqs)
        return BatchDescriptor(padded, num_reqs, uniform, has_lora, num_active_loras)

    def _initialise_keys(self) -> None:
        mode = self.mode
        if mode is GraphMode.NONE:
            self.keys_initialized = True
            return
        mixed = mode.mixed_mode()
        if mixed is not GraphMode.NONE:
            for size, loras in product(self.capture_sizes, self.lora_cases):
                key = self._padded_descriptor(size, False, loras > 0, loras)
                if mixed is GraphMode.PIECEWISE:
                    key = replace(key, num_reqs=None, uniform=False)
                self._keys[mixed].add(key)
        if mode.decode_mode() is GraphMode.FULL and mode.separate_routine():
            limit = self.query_len * self.max_num_seqs
            decode_sizes = [s for s in self.capture_sizes if self.query_len <= s <= limit]
            for size, loras in product(decode_sizes, self.lora_cases):
                self._keys[GraphMode.FULL].add(self._padded_descriptor(size, True, loras > 0, loras))
        self.keys_initialized = True

    def keys(self, runtime_mode: GraphMode) -> list[BatchDescriptor]:
        """The keys of one runtime mode (FULL or PIECEWISE), largest first."""
        runtime_mode = GraphMode.parse(runtime_mode)
        if runtime_mode not in self._keys:
            raise ConfigError(
                f"keys exist for PIECEWISE and FULL only, not {runtime_mode.name}", key="runtime_mode"
            )
        return sorted(self._keys[runtime_mode], key=_capture_sort_key, reverse=True)

    def capture_order(self) -> list[tuple[GraphMode, BatchDescriptor]]:
        """Every key to capture: PIECEWISE first, then FULL; largest (tokens, loras) first."""
        if self.mode is GraphMode.NONE:
            return []
        return [(m, key) for m in (GraphMode.PIECEWISE, GraphMode.FULL) for key in self.keys(m)]

    def pad(self, num_tokens: int) -> Optional[int]:
        """The capture size num_tokens pads to, or None when it is not graphed."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return self._padded[num_tokens] if num_tokens <= self.max_size else None

    # -- dispatch ------------------------------------------------------------------
    def dispatch(
        self,
        num_tokens: int,
        *,
        uniform_decode: bool = False,
        has_lora: bool = False,
        num_active_loras: int = 0,
        valid_modes: Optional[AbstractSet[GraphMode]] = None,
        invalid_modes: Optional[AbstractSet[GraphMode]] = None,
    ) -> tuple[GraphMode, BatchDescriptor]:
        """The runtime mode and key for a batch; (NONE, BatchDescriptor(num_tokens)) when eager."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens must be an integer >= 0, got {num_tokens!r}")
        allowed = set(valid_modes) if valid_modes else set(GraphMode.runtime_modes())
        if invalid_modes:
            allowed -= set(invalid_modes)
        if not allowed:
            raise ConfigError(
                f"no runtime mode is allowed: valid_modes={_names(valid_modes)}, invalid_modes={_names(invalid_modes)}",
                key="valid_modes",
            )
        if (
            not self.keys_initialized
            or self.mode is GraphMode.NONE
            or num_tokens > self.max_size
            or allowed <= {GraphMode.NONE}
        ):
            return GraphMode.NONE, BatchDescriptor(num_tokens)

        loras = num_active_loras
        if has_lora and num_active_loras > 0:
            if self.specialize_active_lora:
                index = bisect.bisect_left(self.captured_lora_counts, num_active_loras)
                if index < len(self.captured_lora_counts):
                    loras = self.captured_lora_counts[index]
            else:
                if self.max_loras == 0:
                    raise ConfigError(
                        "has_lora=True but the dispatcher was built without LoRA (max_loras=0); "
                        "pass max_loras to GraphDispatcher",
                        key="max_loras",
                    )
                loras = self.max_loras + 1
        uniform = uniform_decode and self.mode.separate_routine()
        key = self._padded_descriptor(num_tokens, uniform, has_lora, loras)
        if GraphMode.FULL in allowed and key in self._keys[GraphMode.FULL]:
            return GraphMode.FULL, key
        if GraphMode.PIECEWISE in allowed:
            relaxed = replace(key, num_reqs=None, uniform=False)
            if relaxed in self._keys[GraphMode.PIECEWISE]:
                return GraphMode.PIECEWISE, relaxed
        if GraphMode.NONE not in allowed:
            raise ConfigError(
                f"no captured graph matches {key} and NONE is not allowed (allowed modes: {_names(allowed)}); "
                "allow NONE or capture a matching size",
                key="valid_modes",
            )
        return GraphMode.NONE, BatchDescriptor(num_tokens)


def _capture_sort_key(key: BatchDescriptor) -> tuple[int, int]:
    return (key.num_tokens, key.num_active_loras)


def _names(modes: Optional[AbstractSet[GraphMode]]) -> str:
    if modes is None:
        return "None"
    return "{" + ", ".join(sorted(m.name for m in modes)) + "}"
