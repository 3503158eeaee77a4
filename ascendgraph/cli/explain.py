"""``ascendgraph explain``: how a configuration resolves (requested vs effective mode and why),
without running anything. The result goes to stdout: the human report, or with ``--json`` the
resolution document alone."""

from __future__ import annotations

import argparse
from typing import Any, Optional

from ascendgraph.cli.app import Command, emit_json, emit_result
from ascendgraph.cli.args import add_config_arguments, config_from_args, env_from_args, hccl_mode_from_args

__all__ = ["COMMAND"]


def add_explain_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="the dtype the run would use (default bfloat16); float32 is listed under 'lenient' "
                        "on sim and refused on npu")
    parser.add_argument("--device", choices=("sim", "npu"), default="sim",
                        help="the device the explanation is for (default sim); explain itself runs nothing")
    parser.add_argument("--json", action="store_true", help="print the resolution as JSON on stdout, instead of the text (nothing else on stdout)")


def run_explain(args: argparse.Namespace) -> int:
    from ascendgraph.explanation import format_resolution, resolution_to_json
    from ascendgraph.leniency import declared_leniencies
    from ascendgraph.resolve import resolve
    from ascendgraph.sizes import DEFAULT_MAX_STREAMS

    config = config_from_args(args)
    lenient = declared_leniencies(args.dtype, args.device)
    resolution = resolve(
        config,
        env=env_from_args(args),
        stream_limit=args.stream_limit or DEFAULT_MAX_STREAMS,
        hccl_op_expansion_mode=hccl_mode_from_args(args),
    )
    comms = _communicators(config, resolution)  # -dp / -tp > 1 (docs/ranks.md)
    if args.json:
        document = resolution_to_json(resolution)
        document["lenient"] = lenient
        if comms:
            document["communicators"] = comms[0]
        emit_json(document)
    else:
        text = format_resolution(resolution) + (f"\n\n{comms[1]}" if comms else "")
        if lenient:
            text += "\n\nlenient (the simulator runs it; an NPU would refuse it):\n" + "\n".join(
                f"  - {item}" for item in lenient
            )
        emit_result(text)
    return 0


def _communicators(config: Any, resolution: Any) -> Optional[tuple[list[dict[str, Any]], str]]:
    """(JSON, text) of the layout's communicators when it has more than one rank, else None."""
    from ascendgraph.parallel.communicators import communicators, communicators_to_json, format_communicators
    from ascendgraph.parallel.layout import ParallelLayout

    layout = ParallelLayout(dp=config.data_parallel_size, tp=config.tensor_parallel_size,
                            pp=config.pipeline_parallel_size)
    if layout.world_size <= 1:
        return None
    plan = resolution.stream_plan
    expansion = plan.expansion_mode if plan is not None else ""
    found = communicators(layout, moe=config.model.num_experts > 0, expansion_mode=expansion)
    return communicators_to_json(found), format_communicators(found, expansion_mode=expansion)


COMMAND = Command(
    "explain",
    "show how a configuration resolves: requested vs effective mode and why",
    "Resolve a vLLM / vLLM Ascend graph-mode configuration without running anything: the effective "
    "cudagraph_mode, every rule that changed it and why, the capture sizes, the npugraph_ex / static / "
    "super kernel flags and the stream plan.\n\nexample:\n  ascendgraph explain --compilation-config "
    "'{\"cudagraph_mode\":\"FULL\"}' --attention-backend mla",
    add_explain_arguments,
    run_explain,
)
