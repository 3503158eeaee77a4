"""``ascendgraph plan``: plan capture sizes before deploying (streams, pool memory, capture time,
workload-aware sizes). The planner itself is `ascendgraph.tools.plan`; this module reads the
flags and prints the plan."""

from __future__ import annotations

import argparse
import logging
from typing import Optional

from ascendgraph.cli.app import CliUsageError, Command, emit_json, emit_result, import_torch_whole
from ascendgraph.cli.args import (
    add_config_arguments, config_from_args, env_from_args, hccl_mode_from_args, positive_int, seed_int,
)
from ascendgraph.sizes import DEFAULT_MAX_STREAMS
from ascendgraph.tools.plan import (
    DEFAULT_REQUESTS,
    DEFAULT_SAMPLE_SIZES,
    MEASURE_METHODS,
    PLOT_MISSING,
    Workload,
    check_plot_path,
    file_workload,
    format_plan,
    make_plan,
    matplotlib_available,
    plan_to_json,
    plot_padding_waste,
)

__all__ = ["COMMAND", "add_plan_arguments", "plan_command"]

log = logging.getLogger("ascendgraph")


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    group = parser.add_argument_group("plan")
    source = group.add_mutually_exclusive_group()
    source.add_argument("--workload", default=None, metavar="FILE",
                        help="batch sizes to plan for: one batch size in tokens per line (# comments allowed)")
    source.add_argument("--requests", type=positive_int, default=None, metavar="N",
                        help=f"generate the workload: N requests through the engine's scheduler "
                             f"(default {DEFAULT_REQUESTS}, as `ascendgraph run`)")
    group.add_argument("--seed", type=seed_int, default=0, help="seed of the generated workload (default 0)")
    group.add_argument("--budget", type=positive_int, default=None, metavar="N",
                       help="number of capture sizes each selection may keep (each size costs the stream plan's "
                            "graphs and streams per size); default: as many as the streams allow")
    group.add_argument("--measure", choices=MEASURE_METHODS, default="sample",
                       help="capture on the simulator with meta tensors to predict pool memory and capture time: "
                            "a sample of the sizes (default), all of them, or off")
    group.add_argument("--sample-sizes", type=positive_int, default=DEFAULT_SAMPLE_SIZES, metavar="K",
                       help=f"sizes the sample captures (default {DEFAULT_SAMPLE_SIZES}; the ends of every "
                            "key family are always added)")
    group.add_argument("--sim-profile", default=None, metavar="NAME|FILE.json",
                       help="simulator profile of the measurement (default: the --soc profile)")
    group.add_argument("--check", action="store_true",
                       help="exit 1 when the configured sizes do not fit the streams (a CI gate before deploying)")
    group.add_argument("--plot", default=None, metavar="FILE.png",
                       help="draw padding waste per batch size for both selections (needs matplotlib: "
                            "pip install 'ascendgraph[plot]')")
    group.add_argument("--json", action="store_true", help="print the plan as JSON on stdout, instead of the text (nothing else on stdout)")


def plan_command(args: argparse.Namespace) -> int:
    if args.plot is not None:
        if not matplotlib_available():
            raise CliUsageError(f"ascendgraph plan: error: {PLOT_MISSING}")
        check_plot_path(args.plot)
    config = config_from_args(args)
    workload: Optional[Workload] = None
    if args.workload is not None:
        workload = file_workload(args.workload, max_tokens=config.max_num_batched_tokens)
    if args.measure != "off":
        log.info("measuring capture cost on the simulator (meta tensors)...")
    result = make_plan(
        config,
        workload,
        budget=args.budget,
        stream_limit=args.stream_limit or DEFAULT_MAX_STREAMS,
        hccl_op_expansion_mode=hccl_mode_from_args(args),
        requests=args.requests or DEFAULT_REQUESTS,
        seed=args.seed,
        measure=args.measure,
        sample=args.sample_sizes,
        sim_profile=args.sim_profile,
        env=env_from_args(args),
        # torch only when measuring: a plan whose measurement is cached never imports it
        before_measure=import_torch_whole,
    )
    if args.plot is not None:
        if result.even is None:
            result.warnings.append("--plot: graphs are off, nothing to draw")
        else:
            result.warnings.extend(plot_padding_waste(result, args.plot))
            result.plot = args.plot
    if args.json:
        emit_json(plan_to_json(result))
    else:
        emit_result(format_plan(result))
    if args.check and ((result.plan is not None and not result.plan.fits) or result.measure_error):
        return 1
    return 1 if result.measure_error else 0


COMMAND = Command(
    "plan",
    "plan capture sizes before deploying: streams, pool memory, capture time, workload-aware sizes",
    "Answer before the fact: do the capture sizes fit the stack's streams (and if not, which size fails "
    "first and what fits), what will capture cost in graph-pool memory and time (measured on the simulator "
    "with meta tensors, so large models need no memory), and which N sizes to capture for a workload: even "
    "sampling (vLLM Ascend's) vs workload-aware selection, each with its expected padding waste. Exit 0 with "
    "a plan (also when the sizes do not fit; --check makes that exit 1), 1 when the measurement failed, 2 on "
    "bad input.\n\nexamples:\n  ascendgraph plan\n  ascendgraph plan --stream-limit 60 --budget 6\n"
    "  ascendgraph plan --model qwen3-0.6b --workload batches.txt --budget 8 --json\n"
    "  ascendgraph plan --requests 64 --seed 1 --budget 8 --plot waste.png",
    add_plan_arguments,
    plan_command,
)
