"""The rank layout of vLLM and its communication groups.

vLLM orders the ranks of one engine as ``[DP][PP][TP]`` (the innermost index moves fastest):
``rank = (dp_rank * pp + pp_rank) * tp + tp_rank``. Source: vLLM
``vllm/distributed/parallel_state.py``, ``initialize_model_parallel`` (``all_ranks`` is
``arange(world_size).reshape(-1, dp, pp, pcp, tp)``; pcp is 1 here). The groups:

* ``tp``: the ranks of one (dp, pp) that differ only in tp_rank (consecutive ranks);
* ``dp``: the ranks of one (pp, tp) that differ only in dp_rank;
* ``pp``: the ranks of one (dp, tp) that differ only in pp_rank;
* ``ep``: every rank of one pp stage, ``dp * tp`` of them (vLLM's expert-parallel group
  is DP x TP, the same function: the ``all_ranks`` transpose for EP);
* ``world``: every rank;
* ``dp_engine``: the members of ``dp``, as the engine core's own DP group (vLLM
  ``v1/engine/core.py`` ``DPEngineCoreProc``: a stateless group of its own, where
  ``ParallelConfig.sync_dp_state`` runs): a separate communicator from the workers' ``dp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from ascendgraph.errors import ConfigError

__all__ = ["GROUP_NAMES", "MAX_WORLD_SIZE", "RankCoords", "ParallelLayout"]

GROUP_NAMES = ("world", "dp", "pp", "tp", "ep", "dp_engine")
# A world that the rank simulation steps within about a minute on a 2-core machine (docs/ranks.md
# "Limits": about 70 ms per rank for its device and captures; 512 ranks: 38 s).
MAX_WORLD_SIZE = 512


@dataclass(frozen=True)
class RankCoords:
    """Where one rank sits: its global rank and its index in each dimension."""

    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int

    def __str__(self) -> str:
        return f"rank {self.rank} (dp {self.dp_rank}, pp {self.pp_rank}, tp {self.tp_rank})"


@dataclass(frozen=True)
class ParallelLayout:
    """``dp`` x ``pp`` x ``tp`` ranks in vLLM's order (see the module docstring)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} size must be an integer >= 1, got {value!r}", key=name)
        if self.world_size > MAX_WORLD_SIZE:
            raise ConfigError(
                f"dp x pp x tp = {self.world_size} ranks is more than the {MAX_WORLD_SIZE} the simulator steps; "
                "lower --data-parallel-size or --tensor-parallel-size",
                key="data_parallel_size",
            )

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def ep(self) -> int:
        """The expert-parallel group size: DP x TP."""
        return self.dp * self.tp

    def rank_of(self, dp_rank: int, pp_rank: int, tp_rank: int) -> int:
        return (dp_rank * self.pp + pp_rank) * self.tp + tp_rank

    def coords(self, rank: int) -> RankCoords:
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside 0..{self.world_size - 1}", key="rank")
        tp_rank = rank % self.tp
        pp_rank = (rank // self.tp) % self.pp
        dp_rank = rank // (self.tp * self.pp)
        return RankCoords(rank, dp_rank, pp_rank, tp_rank)

    def ranks(self) -> Iterator[RankCoords]:
        return (self.coords(r) for r in range(self.world_size))

    def group(self, name: str, rank: int) -> tuple[int, ...]:
        """The members of ``rank``'s group ``name`` (one of GROUP_NAMES), in rank order (cached:
        the world and EP groups are one shared tuple, so a lookup does not grow with the world)."""
        cache: dict[tuple[str, int], tuple[int, ...]] = self.__dict__.setdefault("_group_cache", {})
        found = cache.get((name, rank))
        if found is None:
            if name == "world":
                found = cache.setdefault(("world", -1), tuple(range(self.world_size)))
            elif name == "ep":
                stage = self.coords(rank).pp_rank
                found = cache.get(("ep", -1 - stage)) or cache.setdefault(("ep", -1 - stage), self._group(name, rank))
            else:
                found = self._group(name, rank)
            cache[(name, rank)] = found
        return found

    def _group(self, name: str, rank: int) -> tuple[int, ...]:
        c = self.coords(rank)
        if name == "world":
            return tuple(range(self.world_size))
        if name == "tp":
            return tuple(self.rank_of(c.dp_rank, c.pp_rank, t) for t in range(self.tp))
        if name in ("dp", "dp_engine"):
            return tuple(self.rank_of(d, c.pp_rank, c.tp_rank) for d in range(self.dp))
        if name == "pp":
            return tuple(self.rank_of(c.dp_rank, p, c.tp_rank) for p in range(self.pp))
        if name == "ep":
            return tuple(self.rank_of(d, c.pp_rank, t) for d in range(self.dp) for t in range(self.tp))
        raise ConfigError(f"unknown group {name!r}; groups: {', '.join(GROUP_NAMES)}", key="group")

    def groups(self, name: str) -> list[tuple[int, ...]]:
        """Every distinct group of kind ``name``."""
        seen: dict[tuple[int, ...], None] = {}
        for rank in range(self.world_size):
            seen.setdefault(self.group(name, rank), None)
        return list(seen)

    def describe(self) -> str:
        return f"dp={self.dp} pp={self.pp} tp={self.tp} (world {self.world_size}, ep {self.ep})"


def check_heads_split(config: Any) -> None:
    """Refuse what vLLM refuses before any rank starts (vLLM 0.32
    ModelConfig.verify_with_parallel_config):
    tensor parallelism splits the attention heads evenly, so their total must be a multiple of
    the tensor parallel size. Only a multi-rank run checks it: elsewhere the model is a stand-in
    and a tensor parallel size describes the user's deployment, not the simulated model."""
    heads, tp = config.model.num_attention_heads, config.tensor_parallel_size
    if heads % tp:
        fits = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        raise ConfigError(
            f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp}); "
            f"model {config.model.name!r} takes a tensor parallel size of {fits} (or pick a model with more heads)",
            key="tensor_parallel_size",
        )
