"""`ascendgraph run` with more than one rank (-dp / -tp / -pp): the flags of the multi-rank
simulation and the glue that runs it beside the single-rank engine (docs/ranks.md).

Kept apart from `ascendgraph.cli.run` so the run command gains only two calls. Every rank
runs on the simulator (`ascendgraph.runtime.ranks.run_ranks`); the report gains a ``ranks``
section (text) and key (``--json``); the exit code is 1 when either run failed.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Optional

from ascendgraph.errors import ConfigError

__all__ = ["add_rank_arguments", "world_size", "engine_faults", "run_ranks_for", "add_ranks_to_document"]

# Kept here (not imported from ascendgraph.parallel) so the parser stays light; a test keeps them equal.
DP_SYNC_POLICY_NAMES = ("fixed", "vllm_ascend", "vllm", "pre_6011")
IDLE_POLICY_NAMES = ("always_dummy", "external_launcher_only")
CAPTURE_AGREEMENT_NAMES = ("agreed", "per_rank")


def add_rank_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("many ranks (with -dp / -tp / -pp > 1; simulator only; docs/ranks.md)")
    group.add_argument("--dp-sync-policy", choices=DP_SYNC_POLICY_NAMES, default="fixed",
                       help="how DP ranks agree on each step: fixed (default), vllm_ascend (182b75ea, with the MC2 "
                            "skip path of #13826), vllm (coordinate_batch_across_dp), pre_6011 (modes not synced)")
    group.add_argument("--idle-policy", choices=IDLE_POLICY_NAMES, default="always_dummy",
                       help="a zero-token step with requests left: always_dummy (joins the DP sync; default) or "
                            "external_launcher_only (returns without it, vLLM #43547)")
    group.add_argument("--capture-agreement", choices=CAPTURE_AGREEMENT_NAMES, default="agreed",
                       help="agreed (default): capture lists compared and a capture failure aborts or falls back "
                            "on every rank together; per_rank: each rank decides alone")
    group.add_argument("--mc2-skip", action="store_true",
                       help="the MoE KV-consumer case where vLLM Ascend skips the DP all-reduce under MC2 "
                            "(decode needs MC2, and prefill too under one graph routine or the recompute scheduler)")


def world_size(args: argparse.Namespace) -> int:
    return ((getattr(args, "data_parallel_size", None) or 1) * (getattr(args, "tensor_parallel_size", None) or 1)
            * (getattr(args, "pipeline_parallel_size", None) or 1))


def engine_faults(faults: Optional[str], ranks: int) -> Optional[str]:
    """The plan the single-rank engine gets: the rules without a rank prefix, and with one rank
    also ``rank=0:`` rules (None if empty). A rank rule that no rank would act on is refused here,
    before anything runs (`ascendgraph.parallel.rank_faults`)."""
    if faults is None or "rank" not in faults:
        return faults
    from ascendgraph.parallel.rank_faults import engine_rules

    return engine_rules(faults, max(1, ranks))


def check_ranks_for(args: argparse.Namespace, config: Any) -> None:
    """Refuse a multi-rank layout the run cannot take before anything runs: ranks run on the
    simulator only, and the heads must split evenly over tensor parallelism."""
    if world_size(args) <= 1:
        return
    from ascendgraph.device import resolve_device_name

    if resolve_device_name(args.device) != "sim":
        raise ConfigError("more than one rank (-dp / -tp / -pp) runs on the simulator only: give --device sim",
                          key="device")
    from ascendgraph.parallel.layout import check_heads_split

    check_heads_split(config)


def run_ranks_for(args: argparse.Namespace, config: Any, env: Optional[dict[str, str]]) -> Optional[Any]:
    """Run every rank when the layout has more than one and the device is the simulator."""
    if world_size(args) <= 1:
        return None
    check_ranks_for(args, config)
    from ascendgraph.runtime.ranks import RankOptions, run_ranks

    options = RankOptions(
        dp_sync_policy=args.dp_sync_policy, idle_policy=args.idle_policy, capture_agreement=args.capture_agreement,
        on_capture_error=args.on_capture_error, faults=args.faults, seed=args.seed, requests=args.requests,
        mc2_skip=bool(args.mc2_skip), env=env if env is not None else dict(os.environ),
        sim_profile=args.sim_profile, stream_limits={},
    )
    return run_ranks(config, options)


def add_ranks_to_document(document: dict[str, Any], ranks: Any) -> None:
    """``--json``: the ``ranks`` key, and a failed multi-rank run's error at the top level too
    (``error`` is null only when both runs passed; ``error.source`` says which run failed)."""
    section = ranks.to_json()
    document["ranks"] = section
    if document.get("error") is None and section["error"] is not None:
        error = section["error"]
        document["error"] = {"type": error["type"], "message": error["message"], "source": "ranks"}
