"""``ascendgraph doctor``: check this machine's stack and environment for graph mode.

The checks are `ascendgraph.tools.doctor`; this module reads the flags and prints the report."""

from __future__ import annotations

import argparse

from ascendgraph.cli.app import Command, emit_json, emit_result
from ascendgraph.cli.args import positive_int
from ascendgraph.tools.doctor import ReferenceConfig, doctor, format_report, report_to_json

__all__ = ["COMMAND"]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout, instead of the text (nothing else on stdout)")
    defaults = ReferenceConfig()
    ref = parser.add_argument_group(
        "stream-budget reference (the config the HCCL_OP_EXPANSION_MODE check plans for)"
    )
    ref.add_argument("--num-layers", type=positive_int, default=defaults.num_hidden_layers, metavar="N",
                     help=f"num_hidden_layers (default {defaults.num_hidden_layers}, Qwen3-0.6B)")
    ref.add_argument("--tensor-parallel-size", "-tp", type=positive_int, default=defaults.tensor_parallel_size,
                     metavar="N", help=f"default {defaults.tensor_parallel_size}")
    ref.add_argument("--data-parallel-size", "-dp", type=positive_int, default=defaults.data_parallel_size,
                     metavar="N", help=f"default {defaults.data_parallel_size}")
    ref.add_argument("--max-num-seqs", type=positive_int, default=defaults.max_num_seqs, metavar="N",
                     help=f"sets the default capture sizes (default {defaults.max_num_seqs})")
    ref.add_argument("--stream-limit", type=positive_int, default=defaults.stream_limit, metavar="N",
                     help=f"streams available to graph capture (default {defaults.stream_limit})")


def _run(args: argparse.Namespace) -> int:
    reference = ReferenceConfig(
        num_hidden_layers=args.num_layers,
        tensor_parallel_size=args.tensor_parallel_size,
        data_parallel_size=args.data_parallel_size,
        max_num_seqs=args.max_num_seqs,
        stream_limit=args.stream_limit,
    )
    report = doctor(reference=reference)
    if args.json:
        emit_json(report_to_json(report))
    else:
        emit_result(format_report(report))
    return report.exit_code


COMMAND = Command(
    "doctor",
    "check this machine's stack and environment for graph mode",
    "Show the Python / torch / torch_npu / CANN / HDK / xlite versions, whether --device npu works "
    "here and why not, every environment variable that changes graph mode, and a warning for each "
    "value that breaks or weakens it. Exit 1 when something breaks graph mode, else 0.\n\n"
    "example:\n  ascendgraph doctor\n  ascendgraph doctor --json -tp 4 --num-layers 48",
    _add_arguments,
    _run,
)
