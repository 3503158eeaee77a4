"""`ascendgraph run`: the main job — resolve, compile, capture, serve a workload, report.

Its `COMMAND` is listed in `ascendgraph.cli.app.commands()`.
The report goes to stdout (``--json``: the report document alone); the progress bar and
logs go to stderr. Exit codes: 0 every request completed and matched eager;
1 the run failed (a request failed, a capture failed without ``--on-capture-error
eager``, a hang); 2 bad input (handled by `ascendgraph.cli.app.main`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from typing import Any, Callable, Optional

from ascendgraph.cli.app import Command, emit_json, emit_result, emit_text
from ascendgraph.cli.ranks_args import (add_rank_arguments, add_ranks_to_document, check_ranks_for, engine_faults,
                                        run_ranks_for, world_size)
from ascendgraph.cli.args import (
    MAX_SIMULATED_REQUESTS,
    add_config_arguments,
    bounded_int,
    config_from_args,
    env_from_args,
    non_empty_text,
    positive_int,
    seed_int,
)
from ascendgraph.errors import ConfigError
from ascendgraph.api import MAX_RUN_ATOL as MAX_ATOL  # a tolerance above 1 checks nothing
from ascendgraph.readers import read_float

__all__ = ["add_run_arguments", "run_command", "DEFAULT_REQUESTS", "MAX_SIMULATED_REQUESTS", "ON_CAPTURE_ERROR"]

log = logging.getLogger("ascendgraph")

# Kept here (not imported from ascendgraph.runtime.engine) so building the CLI parser does not import
# torch; tests check they equal the engine's.
DEFAULT_REQUESTS = 16
ON_CAPTURE_ERROR = ("raise", "eager")


def _non_negative_float(text: str) -> float:
    try:
        value = read_float(text, "")
    except ConfigError:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0 in ASCII digits, got {shown!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    if value > MAX_ATOL:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_ATOL:g} (a tolerance above 1 checks nothing), "
                                         f"got {text}")
    return value


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    run_group = parser.add_argument_group("run")
    run_group.add_argument("--device", choices=("sim", "npu", "auto"), default="auto",
                           help="device backend: the CPU simulator, a real NPU, or auto (npu when usable, else sim; "
                                "default %(default)s)")
    run_group.add_argument("--requests", type=bounded_int("requests"), default=DEFAULT_REQUESTS, metavar="N",
                           help=f"number of generated requests (default %(default)s, at most {MAX_SIMULATED_REQUESTS}; "
                                "size larger workloads with `ascendgraph plan --workload FILE`)")
    run_group.add_argument("--seed", type=seed_int, default=0, metavar="N",
                           help="seed of weights, prompts and fault draws (default 0; 0 <= N < 2**63)")
    run_group.add_argument("--on-capture-error", choices=ON_CAPTURE_ERROR, default="raise",
                           help="raise: a failed capture fails the run (exit 1); eager: log it, release the graphs "
                                "and serve eagerly")
    run_group.add_argument("--faults", default=None, metavar="SPEC",
                           help="sim fault plan, e.g. 'capture_begin=3*off->raise(207008)' (grammar: docs/faults.md)")
    run_group.add_argument("--sim-profile", default=None, metavar="NAME|FILE.json",
                           help="simulator profile: a name (A2, A3, 310P, A5, A2-old-hdk) or a calibration JSON "
                                "file; default: the --soc profile")
    run_group.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    run_group.add_argument("--atol", type=_non_negative_float, default=None,
                           help="tolerance of the check against eager (default 1e-4 float32, 2e-2 bfloat16)")
    run_group.add_argument("--json", action="store_true", help="print the report as JSON on stdout, instead of the text (nothing else on stdout)")
    # Workload-aware capture sizes (ascendgraph.tools.plan.sizes_from_plan; docs/plan.md).
    run_group.add_argument("--sizes-from-plan", action="store_true",
                           help="capture the sizes `ascendgraph plan` selects for this run's workload (--requests, "
                                "--seed): at most --budget sizes minimising expected padding, the largest kept")
    run_group.add_argument("--budget", type=positive_int, default=None, metavar="N",
                           help="with --sizes-from-plan: number of capture sizes to keep (default: as many as the "
                                "stream plan allows, i.e. every configured size when they all fit)")
    # Also accepted after the command name (`ascendgraph run -q`); SUPPRESS keeps the global value.
    run_group.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                           help="warnings and errors only (no progress bar)")
    run_group.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging")
    run_group.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                           help="traceback of the failure when the run fails; address checks on every replay")
    add_rank_arguments(parser)  # -dp / -tp > 1: every rank on the simulator (docs/ranks.md)
    # npugraph_ex issue: the quantised model variant and Ascend-format profiles (docs/npugraph_ex.md,
    # docs/profiling.md).
    extras = parser.add_argument_group("model variant and profiling")
    extras.add_argument("--quantization", choices=("w8a8", "w8a8_dynamic"), default=None,
                        help="W8A8-like model variant: int8 weights, activations quantised after each norm "
                             "statically (w8a8) or per token (w8a8_dynamic); default: not quantised")
    extras.add_argument("--profile-dir", type=non_empty_text("a directory, e.g. ./ascendgraph_profile"),
                        default=None, metavar="DIR",
                        help="profile capture and serving: op_statistic.csv, kernel_details.csv and "
                             "trace_view.json under DIR/<host>_<pid>_<time>_ascend_pt/ASCEND_PROFILER_OUTPUT/")


def _check_sim_profile_soc(args: argparse.Namespace) -> None:
    """--sim-profile X resolves as X's SoC; a different explicit --soc is a contradiction."""
    if getattr(args, "sim_profile", None) is None or getattr(args, "soc", None) is None:
        return
    from ascendgraph.device import get_device, soc_generation

    profile = get_device("sim", profile=args.sim_profile, meta_tensors=True).profile
    generation = soc_generation(profile.soc)
    if generation is not None and generation != args.soc:
        raise ConfigError(
            f"--soc {args.soc} contradicts --sim-profile {args.sim_profile} (a {generation} profile, SoC {profile.soc}); "
            "give one of them (--sim-profile alone resolves as its SoC)",
            key="soc",
        )


def run_command(args: argparse.Namespace, on_report: Optional[Callable[[Any], None]] = None) -> int:
    """The ``run`` command; ``on_report`` (used by ``ascendgraph profile``) sees the Report."""
    config = config_from_args(args)
    env = env_from_args(args)
    _check_sim_profile_soc(args)
    if getattr(args, "budget", None) is not None and not getattr(args, "sizes_from_plan", False):
        raise ConfigError("--budget needs --sizes-from-plan (it limits the sizes the plan selects)", key="budget")
    if getattr(args, "sizes_from_plan", False):
        from ascendgraph.tools.plan import sizes_from_plan

        selected = sizes_from_plan(config, requests=args.requests, seed=args.seed, budget=args.budget,
                                   stream_limit=args.stream_limit, hccl_op_expansion_mode=args.hccl_op_expansion_mode,
                                   env=env)
        emit_text(selected.describe())
        config = selected.config
    check_ranks_for(args, config)  # before the one-rank run, not after it
    quiet = bool(getattr(args, "quiet", False))
    verbose = bool(getattr(args, "verbose", False))
    debug = bool(getattr(args, "debug", False))
    if quiet or verbose:  # flags given after `run` are parsed after logging was configured
        logging.getLogger("ascendgraph").setLevel(logging.DEBUG if verbose else logging.WARNING)
    from ascendgraph.runtime.engine import run  # torch is imported only when a run starts

    report = run(
        config,
        device=args.device,
        requests=args.requests,
        seed=args.seed,
        on_capture_error=args.on_capture_error,
        stream_limit=args.stream_limit,
        hccl_op_expansion_mode=args.hccl_op_expansion_mode,
        faults=engine_faults(args.faults, world_size(args)),
        sim_profile=args.sim_profile,
        dtype=args.dtype,
        atol=args.atol,
        quantization=getattr(args, "quantization", None),
        profile_dir=getattr(args, "profile_dir", None),
        env=env,
        debug=debug,
        progress=(not quiet) and sys.stderr.isatty(),
        # The simulator issues many small ops: one intra-op thread is faster (and much faster
        # on a busy machine). OMP_NUM_THREADS, when set, wins.
        num_threads=None if os.environ.get("OMP_NUM_THREADS") else 1,
    )
    ranks = run_ranks_for(args, config, env)  # None for one rank
    if on_report is not None:
        on_report(report)
    if debug and report.exception is not None:
        emit_text("".join(traceback.format_exception(report.exception)).rstrip())
    if args.json:
        document = report.to_json()
        if ranks is not None:
            add_ranks_to_document(document, ranks)
        emit_json(document)
    else:
        emit_result(report.format_text() + ("" if ranks is None else "\n" + ranks.format_text()))
    return max(report.exit_code, 0 if ranks is None else ranks.exit_code)


COMMAND = Command(
    "run",
    "compile, capture and serve a workload on a device; check every step against eager",
    "The main job: resolve the configuration, build the model (random weights), compile it with the "
    "ascendgraph backend, capture ACL graphs for every dispatcher key, serve a generated workload "
    "(mixed prefill/decode batches, padding, replay, FULL-graph parameter updates) and check every "
    "step against an eager reference. Exit 0 when every request completed, 1 when the run failed, "
    "2 on bad input.\n\nexamples:\n  ascendgraph run\n  ascendgraph run --compilation-config "
    "'{\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}' --json\n  ascendgraph run --stream-limit 40 "
    "--on-capture-error eager",
    add_run_arguments,
    run_command,
)
