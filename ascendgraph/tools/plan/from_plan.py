"""`ascendgraph run --sizes-from-plan`: the workload-aware selection applied to the configuration a
run serves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ascendgraph.config import GraphConfig
from ascendgraph.errors import ConfigError
from ascendgraph.resolve import resolve
from ascendgraph.sizes import DEFAULT_MAX_STREAMS, sample_sizes, select_sizes
from ascendgraph.tools.plan.model import padding_counts, default_budget
from ascendgraph.tools.plan.formatting import percent, sizes_text
from ascendgraph.tools.plan.workload import generated_workload

__all__ = ["SizesFromPlan", "sizes_from_plan"]

# --------------------------------------------------------------------------- run --sizes-from-plan


@dataclass(frozen=True)
class SizesFromPlan:
    """The configuration `run --sizes-from-plan` serves, and how its sizes were chosen."""

    config: GraphConfig
    sizes: list[int]
    candidates: list[int]
    budget: int
    budget_source: str
    padding_waste: float
    padding_waste_even: float

    def describe(self) -> str:
        if not self.candidates:
            return "--sizes-from-plan: graphs are off; nothing to select"
        return (
            f"--sizes-from-plan: {len(self.sizes)} of {len(self.candidates)} capture sizes (budget {self.budget}, "
            f"{self.budget_source}), chosen for the workload: {sizes_text(self.sizes)}; expected padding waste "
            f"{percent(self.padding_waste)} (even sampling: {percent(self.padding_waste_even)})"
        )


def sizes_from_plan(
    config: GraphConfig,
    *,
    requests: int,
    seed: int,
    budget: Optional[int] = None,
    stream_limit: Optional[int] = None,
    hccl_op_expansion_mode: Optional[str] = None,
    env: Optional[dict[str, str]] = None,
) -> SizesFromPlan:
    """Workload-aware capture sizes for the workload `run` will serve (same requests and seed).

    The budget is ``budget`` when given, else what the stream plan allows (every
    configured size when they all fit). The returned config carries the sizes as
    ``cudagraph_capture_sizes`` (and no separate max: the largest size is always kept).
    """
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ConfigError(f"the budget must be a number of capture sizes >= 1, got {budget!r}", key="budget")
    resolution = resolve(config, env=env, stream_limit=stream_limit or DEFAULT_MAX_STREAMS,
                         hccl_op_expansion_mode=hccl_op_expansion_mode)
    plan = resolution.stream_plan
    if plan is None:
        return SizesFromPlan(config, [], [], 0, "none", 0.0, 0.0)
    if plan.max_num_sizes == 0 and budget is None:
        raise ConfigError(
            f"--sizes-from-plan: not even one capture size fits the stream budget ({plan.streams_per_size} streams "
            f"per size, {plan.max_streams} in all); raise --stream-limit, set HCCL_OP_EXPANSION_MODE=AIV, or run "
            "without graphs (--enforce-eager)",
            key="stream_limit",
        )
    workload = generated_workload(config, resolution.mode, requests=requests, seed=seed)
    candidates = list(plan.requested_sizes)
    chosen_budget = default_budget(plan) if budget is None else min(budget, len(candidates))
    chosen = select_sizes(candidates, chosen_budget, workload.counted)
    real, padded, _ = padding_counts(chosen, workload.counted)
    real_even, padded_even, _ = padding_counts(sample_sizes(candidates, chosen_budget), workload.counted)
    new_config = config.replace(cudagraph_capture_sizes=tuple(chosen), max_cudagraph_capture_size=None)
    return SizesFromPlan(
        config=new_config,
        sizes=chosen,
        candidates=candidates,
        budget=chosen_budget,
        budget_source="--budget" if budget is not None else "what the stream plan allows",
        padding_waste=padded / real - 1 if real else 0.0,
        padding_waste_even=padded_even / real_even - 1 if real_even else 0.0,
    )
