"""The ``ascendgraph`` command line: explain (and the other commands as they land).

Conventions (INTERFACES.md): human text and logs go to stderr, ``--json`` documents go
to stdout alone; exit 0 success, 1 the run failed, 2 bad input (a one-line error, never a
traceback). Configuration flags use vLLM's spelling so a ``vllm serve`` line translates
one to one.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ascendgraph.config import SOCS, GraphConfig
from ascendgraph.errors import ConfigError, DeviceUnavailable, GraphModeError
from ascendgraph.models.backends import ATTENTION_BACKENDS
from ascendgraph.models.presets import PRESETS

__all__ = ["main", "build_parser", "add_config_arguments", "config_from_args", "COMMANDS", "Command",
           "register_command", "positive_int", "non_negative_int", "emit_json", "emit_text"]

PROG = "ascendgraph"
BAD_INPUT = 2
RUN_FAILED = 1
log = logging.getLogger("ascendgraph")


class CliUsageError(Exception):
    """Bad flags: reported on one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) that point at --help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliUsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The vLLM-style flags every command that resolves a configuration accepts."""
    model = parser.add_argument_group("model")
    model.add_argument("--model", default="tiny", metavar="PRESET|CONFIG.JSON",
                       help=f"a preset ({', '.join(PRESETS)}) or a Hugging Face config.json (file or folder); default tiny")
    model.add_argument("--num-layers", type=positive_int, default=None, metavar="N",
                       help="override the model's num_hidden_layers (e.g. run qwen3-0.6b with 2 layers)")
    model.add_argument("--attention-backend", choices=sorted(ATTENTION_BACKENDS), default=None,
                       help="attention backend (default: the model's own: mla for MLA models, else ascend)")
    vllm = parser.add_argument_group("vLLM configuration (same spelling as `vllm serve`)")
    vllm.add_argument("--compilation-config", "-cc", default=None, metavar="JSON",
                      help='CompilationConfig as JSON, e.g. \'{"cudagraph_mode": "FULL_DECODE_ONLY"}\'')
    vllm.add_argument("--additional-config", default=None, metavar="JSON",
                      help='vLLM Ascend additional_config as JSON, e.g. \'{"ascend_compilation_config": {"enable_static_kernel": true}}\'')
    vllm.add_argument("-O", dest="optimization_level", default=None, metavar="LEVEL",
                      help="optimisation level 0-3 as in vLLM (-O0 eager ... -O3); default 2")
    vllm.add_argument("--max-num-seqs", type=positive_int, default=None, metavar="N", help="default 256")
    vllm.add_argument("--max-num-batched-tokens", type=positive_int, default=None, metavar="N", help="default 8192")
    vllm.add_argument("--num-speculative-tokens", type=non_negative_int, default=None, metavar="K",
                      help="speculative decoding: K draft tokens per step (q = 1 + K tokens per decoding request)")
    vllm.add_argument("--speculative-config", default=None, metavar="JSON",
                      help='e.g. \'{"num_speculative_tokens": 1}\'')
    vllm.add_argument("--tensor-parallel-size", "-tp", type=positive_int, default=None, metavar="N")
    vllm.add_argument("--data-parallel-size", "-dp", type=positive_int, default=None, metavar="N")
    vllm.add_argument("--pipeline-parallel-size", "-pp", type=positive_int, default=None, metavar="N")
    vllm.add_argument("--prefill-context-parallel-size", "-pcp", type=positive_int, default=None, metavar="N")
    vllm.add_argument("--decode-context-parallel-size", "-dcp", type=positive_int, default=None, metavar="N")
    vllm.add_argument("--enable-expert-parallel", action="store_true", default=None)
    vllm.add_argument("--enable-sequence-parallel", action="store_true", default=None,
                      help="sequence parallelism (Ascend then keeps only capture sizes divisible by tp)")
    vllm.add_argument("--enforce-eager", action="store_true", default=None, help="no compilation, no graphs")
    vllm.add_argument("--block-size", type=positive_int, default=None, metavar="N", help="KV cache block size (default 128)")
    vllm.add_argument("--max-loras", type=non_negative_int, default=None, metavar="N")
    vllm.add_argument("--performance-mode", choices=("balanced", "interactivity", "throughput"), default=None)
    stack = parser.add_argument_group("Ascend stack")
    stack.add_argument("--soc", choices=SOCS, default=None, type=str.upper, help="SoC generation (default A2)")
    stack.add_argument("--stream-limit", type=positive_int, default=None, metavar="N",
                       help="streams available to graph capture (the planner's MAX; default 1800)")
    stack.add_argument("--hccl-op-expansion-mode", default=None, metavar="MODE",
                       help="HCCL_OP_EXPANSION_MODE (AIV, or FFTS+/AICPU); default: read from the environment")


_ENGINE_FLAGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "num_speculative_tokens",
    "tensor_parallel_size",
    "data_parallel_size",
    "pipeline_parallel_size",
    "prefill_context_parallel_size",
    "decode_context_parallel_size",
    "enable_expert_parallel",
    "enable_sequence_parallel",
    "enforce_eager",
    "block_size",
    "max_loras",
    "performance_mode",
    "soc",
    "attention_backend",
    "optimization_level",
)


def config_from_args(args: argparse.Namespace) -> GraphConfig:
    """A GraphConfig from parsed config flags; bad values raise ConfigError."""
    engine_args: dict[str, Any] = {}
    for name in _ENGINE_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            engine_args[name] = value
    if getattr(args, "speculative_config", None):
        engine_args["speculative_config"] = args.speculative_config
    return GraphConfig.from_vllm_args(
        compilation_config=args.compilation_config,
        additional_config=args.additional_config,
        model=args.model,
        num_layers=args.num_layers,
        **engine_args,
    )


def hccl_mode_from_args(args: argparse.Namespace) -> Optional[str]:
    return getattr(args, "hccl_op_expansion_mode", None)


def emit_json(document: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def emit_text(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------- explain


def _add_explain_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the resolution as JSON on stdout")


def _run_explain(args: argparse.Namespace) -> int:
    from ascendgraph.explanation import format_resolution, resolution_to_json
    from ascendgraph.resolve import resolve
    from ascendgraph.sizes import DEFAULT_MAX_STREAMS

    config = config_from_args(args)
    resolution = resolve(
        config,
        stream_limit=args.stream_limit or DEFAULT_MAX_STREAMS,
        hccl_op_expansion_mode=hccl_mode_from_args(args),
    )
    if args.json:
        emit_json(resolution_to_json(resolution))
    else:
        emit_text(format_resolution(resolution))
    return 0


# --------------------------------------------------------------------------- command table


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: list[Command] = [
    Command(
        "explain",
        "show how a configuration resolves: requested vs effective mode and why",
        "Resolve a vLLM / vLLM Ascend graph-mode configuration without running anything: the effective "
        "cudagraph_mode, every rule that changed it and why, the capture sizes, the npugraph_ex / static / "
        "super kernel flags and the stream plan.\n\nexample:\n  ascendgraph explain --compilation-config "
        "'{\"cudagraph_mode\":\"FULL\"}' --attention-backend mla",
        _add_explain_arguments,
        _run_explain,
    ),
]


def register_command(command: Command) -> None:
    """Add a command (used by modules that own a command, e.g. the engine's `run`)."""
    if any(c.name == command.name for c in COMMANDS):
        return
    COMMANDS.append(command)


# Modules that own a command register it on import (`register_command`); missing ones are skipped.
COMMAND_MODULES = (
    "ascendgraph.engine_cli",      # run
    "ascendgraph.plan",            # plan
    "ascendgraph.scenario_cli",    # scenario
    "ascendgraph.profile_cli",     # profile
    "ascendgraph.doctor",          # doctor
    "ascendgraph.diagnose",        # diagnose
)


def _load_command_modules() -> None:
    # Each module registers its command on import; a module that does not exist yet is skipped.
    import importlib

    for module in COMMAND_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def build_parser() -> argparse.ArgumentParser:
    _load_command_modules()
    parser = _Parser(
        prog=PROG,
        description="vLLM graph mode on Ascend NPUs — explain, run, plan and test it on a CPU simulator "
        "or a real NPU.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    parser.add_argument("--debug", action="store_true", help="show a traceback when a run fails")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    children: dict[str, argparse.ArgumentParser] = {}
    parser.set_defaults(_children=children)
    for command in COMMANDS:
        child = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(child)
        child.set_defaults(_command=command)
        children[command.name] = child
    return parser


def _configure_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("ascendgraph")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def _dests(child: argparse.ArgumentParser, tokens: Sequence[str]) -> dict[str, str]:
    """Option destinations named in a token list, with the spelling used."""
    found: dict[str, str] = {}
    for token in tokens:
        if token.startswith("-"):
            name = token.split("=", 1)[0]
            action = child._option_string_actions.get(name)
            if action is not None:
                found[action.dest] = name
    return found


def _parse_with_pasted_line(
    parser: argparse.ArgumentParser, head: list[str], pasted: list[str]
) -> tuple[argparse.Namespace, list[str], list[str]]:
    """Parse ``head`` plus the translation of a pasted ``vllm serve`` line (after ``--``)."""
    from ascendgraph.vllm_cli import PASTE_COMMANDS, translate_vllm_command

    args = parser.parse_args(head)
    command = getattr(args, "command", None)
    if command not in PASTE_COMMANDS:
        raise CliUsageError(
            f"{PROG}: error: only {', '.join(PASTE_COMMANDS)} accept a pasted `vllm serve` line after -- "
            f"(see {PROG} --help)"
        )
    child = args._children[command]
    try:
        translated = translate_vllm_command(pasted, accepts=lambda flag: flag in child._option_string_actions)
    except ConfigError as exc:
        raise CliUsageError(f"{PROG} {command}: error: {exc}") from None
    mine, theirs = _dests(child, head), _dests(child, translated.argv)
    for dest in sorted(set(mine) & set(theirs)):
        raise CliUsageError(
            f"{PROG} {command}: error: {mine[dest]} is given both before -- and in the pasted vllm serve line; "
            "give it once"
        )
    return parser.parse_args(head + translated.argv), translated.ignored, translated.notes


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    tokens = list(sys.argv[1:] if argv is None else argv)
    ignored: list[str] = []
    notes: list[str] = []
    try:
        if "--" in tokens:
            split = tokens.index("--")
            args, ignored, notes = _parse_with_pasted_line(parser, tokens[:split], tokens[split + 1:])
        else:
            args = parser.parse_args(tokens)
    except CliUsageError as exc:
        emit_text(str(exc))
        return BAD_INPUT
    if getattr(args, "_command", None) is None:
        parser.print_help(sys.stderr)
        return BAD_INPUT
    _configure_logging(args)
    if ignored:
        log.warning("ignoring vllm serve flags ascendgraph does not model: %s", ", ".join(ignored))
    for note in notes:
        log.warning("%s", note)
    command: Command = args._command
    try:
        return command.run(args)
    except CliUsageError as exc:
        emit_text(str(exc))
        return BAD_INPUT
    except (ConfigError, GraphModeError, DeviceUnavailable) as exc:
        first_line = str(exc).strip()
        emit_text(f"{PROG} {command.name}: error: {first_line}")
        return BAD_INPUT
    except KeyboardInterrupt:
        emit_text(f"{PROG} {command.name}: interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    # Run through the imported module so commands registered by other modules land in the
    # same COMMANDS table (this file is `__main__` here, not `ascendgraph.cli`).
    from ascendgraph.cli import main as _main

    sys.exit(_main())
