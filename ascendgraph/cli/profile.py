"""`ascendgraph profile`: a short run written out as an Ascend-format profile.

It is ``ascendgraph run --profile-dir DIR`` with profile-friendly defaults (4 requests,
DIR ``./ascendgraph_profile``) followed by the busiest kernel types of the written
op_statistic.csv — so the seed's checks (``grep static_kernel op_statistic.csv``; compare
kernel_details.csv with and without super kernel) take one command each. Its `COMMAND` is
listed in `ascendgraph.cli.app.commands()`; torch is imported only when the run starts. Exit codes as ``run``.
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path
from typing import Any, Optional

from ascendgraph.cli.app import Command, emit_result
from ascendgraph.cli.run import add_run_arguments, run_command

__all__ = ["DEFAULT_PROFILE_DIR", "DEFAULT_PROFILE_REQUESTS", "profile_command", "top_op_types"]

DEFAULT_PROFILE_DIR = "ascendgraph_profile"
DEFAULT_PROFILE_REQUESTS = 4
TOP_OP_TYPES = 8


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.set_defaults(profile_dir=DEFAULT_PROFILE_DIR, requests=DEFAULT_PROFILE_REQUESTS)


def top_op_types(op_statistic: Path, limit: int = TOP_OP_TYPES) -> list[dict[str, Any]]:
    """The first ``limit`` rows of an op_statistic.csv (sorted by total time when written)."""
    with op_statistic.open(newline="") as handle:
        return list(csv.DictReader(handle))[:limit]


def _profile_file(report_json: dict[str, Any]) -> Path | None:
    profile = report_json.get("profile") or {}
    directory = profile.get("dir")
    path = Path(directory) / "op_statistic.csv" if directory else None
    return path if path is not None and path.is_file() else None


def _holds_no_file(directory: Path) -> bool:
    return all(not files for _, _, files in os.walk(directory))


def remove_if_empty(directory: Path) -> bool:
    """Remove ``directory`` (and its empty sub-folders) when it holds no file; True when removed."""
    if not directory.is_dir() or not _holds_no_file(directory):
        return False
    for root, _, _ in sorted(os.walk(directory), key=lambda entry: len(entry[0]), reverse=True):
        os.rmdir(root)
    return True


def _new_directory(path: Optional[str]) -> Optional[Path]:
    """The outermost folder a run writing to ``path`` would create (None when ``path`` exists)."""
    if not path:
        return None
    directory = Path(path).absolute()
    if directory.exists():
        return None
    while not directory.parent.exists() and directory.parent != directory:
        directory = directory.parent
    return directory


def profile_command(args: argparse.Namespace) -> int:
    captured: dict[str, Any] = {}
    created = _new_directory(getattr(args, "profile_dir", None))
    code = 1
    try:
        code = run_command(args, on_report=lambda report: captured.update(report.to_json()))
    finally:
        # A failed run must not leave an empty profile folder behind (only one it created).
        if code != 0 and created is not None:
            remove_if_empty(created)
    op_statistic = _profile_file(captured)
    if op_statistic is not None and not args.json:
        rows = top_op_types(op_statistic)
        emit_result(f"top kernel types by device time ({op_statistic}):")
        for row in rows:
            emit_result(
                f"  {row['OP Type']:<40} {row['Core Type']:<15} count {row['Count']:>5}  "
                f"total {row['Total Time(us)']:>10} us  {row['Ratio(%)']:>6} %"
            )
    return code


COMMAND = Command(
    "profile",
    "run a short workload and write op_statistic.csv, kernel_details.csv and trace_view.json",
    "`ascendgraph run --profile-dir DIR` with profile defaults (4 requests, DIR ./ascendgraph_profile): "
    "capture and serving are profiled (the simulator's kernel records on its virtual clock, or "
    "torch_npu's profiler on an NPU) and written as an Ascend profile under "
    "DIR/<host>_<pid>_<time>_ascend_pt/ASCEND_PROFILER_OUTPUT/. Exit codes as `run`.\n\nexamples:\n"
    "  ascendgraph profile -cc '{\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}' --additional-config "
    "'{\"ascend_compilation_config\":{\"enable_static_kernel\":true}}'\n"
    "  grep static_kernel ascendgraph_profile/*_ascend_pt/ASCEND_PROFILER_OUTPUT/op_statistic.csv\n"
    "  ascendgraph profile --quantization w8a8_dynamic --dtype bfloat16 --profile-dir /tmp/prof",
    add_profile_arguments,
    profile_command,
)
