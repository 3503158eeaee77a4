"""``ascendgraph diagnose``: find graph-capture failures in a vLLM / vLLM Ascend log and say what
to do.

The reading and classification are `ascendgraph.tools.diagnose`; this module reads the flags and
prints the diagnosis."""

from __future__ import annotations

import argparse

from ascendgraph.cli.app import Command, emit_json, emit_result
from ascendgraph.cli.args import positive_int
from ascendgraph.sizes import DEFAULT_MAX_STREAMS
from ascendgraph.tools.diagnose import diagnose_file, diagnosis_to_json, format_diagnosis

__all__ = ["COMMAND"]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logfile", metavar="LOGFILE|-",
                        help="a vLLM / vLLM Ascend log (plain or .gz), or - to read standard input")
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON on stdout, instead of the text (nothing else on stdout)")
    parser.add_argument("--num-layers", type=positive_int, default=None, metavar="N",
                        help="num_hidden_layers for the stream plan (overrides the log; needed when it does not show it)")
    parser.add_argument("--stream-limit", type=positive_int, default=DEFAULT_MAX_STREAMS, metavar="N",
                        help=f"streams available to graph capture (the planner's MAX; default {DEFAULT_MAX_STREAMS})")


def _run(args: argparse.Namespace) -> int:
    diagnosis = diagnose_file(args.logfile, num_layers=args.num_layers, stream_limit=args.stream_limit)
    if args.json:
        emit_json(diagnosis_to_json(diagnosis))
    else:
        emit_result(format_diagnosis(diagnosis))
    return diagnosis.exit_code


COMMAND = Command(
    "diagnose",
    "find graph-capture failures in a vLLM / vLLM Ascend log and say what to do",
    "Read a vLLM / vLLM Ascend log (or standard input) and report every graph-capture failure: its "
    "line, its class (stream exhaustion, old HDK stack, resource allocation, input address mismatch, "
    "ASCEND_LAUNCH_BLOCKING, out of memory during capture, ...) and the guidance. When the log shows "
    "the configuration, print its stream plan and a capture-size list that fits.\n"
    "Exit 0 when nothing is found, 1 when failures are found, 2 when the log cannot be read.\n\n"
    "example:\n  ascendgraph diagnose vllm.log\n  kubectl logs my-pod | ascendgraph diagnose - --json",
    _add_arguments,
    _run,
)
