"""The ``ascendgraph`` command line: explain (and the other commands as they land).

Conventions (README.md, "The commands"): human text and logs go to stderr, ``--json``
documents go to stdout alone; exit 0 success, 1 the run failed, 2 bad input (a one-line
error naming the value and the fix, never a traceback). Configuration flags use vLLM's
spelling so a ``vllm serve`` line translates one to one. Count flags have upper bounds
(`LIMITS`) so a mistyped number is refused instead of hanging a run.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import json
import logging
import os
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

from ascendgraph.config import SOCS, GraphConfig, parse_json_argument
from ascendgraph.errors import ConfigError, DeviceUnavailable, GraphModeError
from ascendgraph.readers import dump_json, read_int
from ascendgraph.models.backends import ATTENTION_BACKENDS
from ascendgraph.models.presets import PRESETS
from ascendgraph.cli.vllm_flags import VLLM_FLAGS, VLLM_SPECULATIVE_CONFIG_KEYS

__all__ = ["main", "build_parser", "add_config_arguments", "config_from_args", "COMMANDS", "Command",
           "register_command", "positive_int", "non_negative_int", "bounded_int", "seed_int", "non_empty_text",
           "json_object_text", "env_from_args", "check_limits", "flag_hint", "unrecognized_message",
           "format_warning", "cli_warnings", "package_version", "LIMITS", "MAX_SEED", "emit_json", "emit_text"]

PROG = "ascendgraph"
BAD_INPUT = 2
RUN_FAILED = 1
log = logging.getLogger("ascendgraph")


class CliUsageError(Exception):
    """Bad flags: reported on one line with exit code 2."""


# Upper bounds of the count flags, by argparse destination: generous for real deployments,
# small enough that a mistyped number is refused (exit 2) instead of hanging a run. Checked by
# the flags' own converters (`bounded_int`) and, for flags other modules define with plain
# converters (plan --seed, doctor --num-layers, ...), after parsing (`check_limits`).
MAX_SEED = 2**63 - 1  # torch generators and random.Random take any int below this
LIMITS: dict[str, tuple[int, int]] = {
    "seed": (0, MAX_SEED),
    "requests": (1, 1_000_000),
    "num_layers": (1, 1024),
    "tensor_parallel_size": (1, 65536),
    "data_parallel_size": (1, 65536),
    "pipeline_parallel_size": (1, 65536),
    "prefill_context_parallel_size": (1, 65536),
    "decode_context_parallel_size": (1, 65536),
    "block_size": (1, 65536),
    "max_loras": (0, 65536),
    "stream_limit": (1, 1_000_000),
}
# Keys of --speculative-config ascendgraph uses (the draft only adds tokens and layers).
MODELLED_SPECULATIVE_KEYS = ("num_speculative_tokens", "draft_num_hidden_layers", "num_hidden_layers")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) that name the (sub)command and point at
    its --help; unknown flags get the closest one; no abbreviations (``--num-layer``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliUsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")

    def parse_args(self, args: Optional[Sequence[str]] = None,  # type: ignore[override]
                   namespace: Optional[argparse.Namespace] = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            raise CliUsageError(unrecognized_message(_leaf_parser(self, parsed), extras, root=self))
        return parsed


def _leaf_parser(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser that parsed the last command word (``ascendgraph scenario run``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            child = action.choices.get(getattr(parsed, action.dest, None) or "")
            if child is not None:
                return _leaf_parser(child, parsed)
    return parser


def _command_name(parser: argparse.ArgumentParser) -> str:
    words = parser.prog.split()
    return words[1] if len(words) > 1 else ""


def flag_hint(parser: argparse.ArgumentParser, flag: str, root: Optional[argparse.ArgumentParser] = None) -> str:
    """Why ``flag`` is not a flag of ``parser`` and what to type instead ('' when no idea).
    ``root``: the top-level parser, whose own flags go before the command."""
    from ascendgraph.cli.vllm_serve import MODELLED_FLAGS, PASTE_COMMANDS

    options = parser._option_string_actions
    if root is not None and root is not parser and flag in root._option_string_actions:
        return f"; {flag} is an option of {root.prog} itself: put it before the command ({root.prog} {flag} ...)"
    dashed = "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag
    if dashed != flag and dashed in options:
        return f"; ascendgraph spells it {dashed} (dashes, not underscores)"
    target = MODELLED_FLAGS.get(dashed)
    if target is not None and target != dashed and target in options:
        example = " LEVEL, e.g. -O3 or -O 3" if target == "-O" else ""
        return f"; {dashed} is vLLM's spelling, ascendgraph takes {target}{example}"
    if dashed in VLLM_FLAGS:
        paste = (f": paste the whole line after -- (`{parser.prog} -- vllm serve MODEL ...`) to have it ignored"
                 if _command_name(parser) in PASTE_COMMANDS else "")
        return f"; {dashed} is a vllm serve flag ascendgraph does not model{paste}"
    close = difflib.get_close_matches(flag, sorted(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def unrecognized_message(parser: argparse.ArgumentParser, extras: Sequence[str],
                         root: Optional[argparse.ArgumentParser] = None) -> str:
    """The one-line error for arguments ``parser`` does not know, with a hint for the first flag."""
    flag = next((token.split("=", 1)[0] for token in extras if token.startswith("-")), None)
    hint = flag_hint(parser, flag, root) if flag else ""
    return f"{parser.prog}: error: unrecognized arguments: {' '.join(extras)}{hint} (see {parser.prog} --help)"


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = read_int(text, "")
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {_shown(text)}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = read_int(text, "")
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {_shown(text)}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _limit_error(dest: str, value: int) -> Optional[str]:
    low, high = LIMITS[dest]
    if low <= value <= high:
        return None
    if dest == "seed":
        return f"expected a seed 0 <= N < 2**63, got {value}"
    if value > high:
        return f"expected at most {high}, got {value}"
    return "expected a positive integer, got %d" % value if low == 1 else f"expected an integer >= {low}, got {value}"


def bounded_int(dest: str) -> Callable[[str], int]:
    """argparse type: an integer within ``LIMITS[dest]``."""
    low, high = LIMITS[dest]
    lenient = positive_int if low >= 1 else non_negative_int

    def convert(text: str) -> int:
        value = lenient(text)
        problem = _limit_error(dest, value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    convert.__name__ = f"{dest} ({low}..{high})"
    return convert


seed_int = bounded_int("seed")


def non_empty_text(what: str) -> Callable[[str], str]:
    """argparse type: a non-empty string (an empty path would mean the current directory)."""

    def convert(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"empty; pass {what}")
        return text

    return convert


def json_object_text(text: str) -> str:
    """argparse type of the JSON flags: refuses an empty value (checked as JSON later)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty; pass a JSON object such as '{}'")
    return text


def check_limits(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every count flag within `LIMITS`, whichever module defined it (exit 2 otherwise)."""
    leaf = _leaf_parser(parser, args)
    for action in leaf._actions:
        value = getattr(args, action.dest, None)
        if action.dest not in LIMITS or isinstance(value, bool) or not isinstance(value, int):
            continue
        problem = _limit_error(action.dest, value)
        if problem:
            flag = "/".join(action.option_strings) or action.dest
            raise CliUsageError(f"{leaf.prog}: error: argument {flag}: {problem} (see {leaf.prog} --help)")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The vLLM-style flags every command that resolves a configuration accepts."""
    model = parser.add_argument_group("model")
    model.add_argument("--model", default="tiny", metavar="PRESET|CONFIG.JSON",
                       help=f"a preset ({', '.join(PRESETS)}) or a Hugging Face config.json (file or folder); default tiny")
    model.add_argument("--num-layers", type=bounded_int("num_layers"), default=None, metavar="N",
                       help="override the model's num_hidden_layers (e.g. run qwen3-0.6b with 2 layers; "
                            f"at most {LIMITS['num_layers'][1]})")
    model.add_argument("--attention-backend", choices=sorted(ATTENTION_BACKENDS), default=None,
                       help="attention backend (default: the model's own: mla for MLA models, else ascend)")
    vllm = parser.add_argument_group("vLLM configuration (same spelling as `vllm serve`)")
    vllm.add_argument("--compilation-config", "-cc", type=json_object_text, default=None, metavar="JSON",
                      help='CompilationConfig as JSON, e.g. \'{"cudagraph_mode": "FULL_DECODE_ONLY"}\'')
    vllm.add_argument("--additional-config", type=json_object_text, default=None, metavar="JSON",
                      help='vLLM Ascend additional_config as JSON, e.g. \'{"ascend_compilation_config": {"enable_static_kernel": true}}\'')
    vllm.add_argument("-O", dest="optimization_level", default=None, metavar="LEVEL",
                      help="optimisation level 0-3 as in vLLM (-O0 eager ... -O3; vLLM also spells it "
                           "--optimization-level); default 2")
    vllm.add_argument("--max-num-seqs", type=positive_int, default=None, metavar="N", help="default 256")
    vllm.add_argument("--max-num-batched-tokens", type=positive_int, default=None, metavar="N", help="default 8192")
    vllm.add_argument("--num-speculative-tokens", type=non_negative_int, default=None, metavar="K",
                      help="speculative decoding: K draft tokens per step (q = 1 + K tokens per decoding request)")
    vllm.add_argument("--speculative-config", type=json_object_text, default=None, metavar="JSON",
                      help='vLLM SpeculativeConfig as JSON, e.g. \'{"method": "mtp", "num_speculative_tokens": 1}\'; '
                           "only num_speculative_tokens (and draft_num_hidden_layers) matter to graph mode")
    parallel = LIMITS["tensor_parallel_size"][1]
    vllm.add_argument("--tensor-parallel-size", "-tp", type=bounded_int("tensor_parallel_size"), default=None,
                      metavar="N", help=f"tensor parallel ranks (default 1, at most {parallel}): more "
                                        "communication streams per graph")
    vllm.add_argument("--data-parallel-size", "-dp", type=bounded_int("data_parallel_size"), default=None,
                      metavar="N", help=f"data parallel ranks (default 1, at most {parallel})")
    vllm.add_argument("--pipeline-parallel-size", "-pp", type=bounded_int("pipeline_parallel_size"), default=None,
                      metavar="N", help=f"pipeline parallel stages (default 1, at most {parallel})")
    vllm.add_argument("--prefill-context-parallel-size", "-pcp", type=bounded_int("prefill_context_parallel_size"),
                      default=None, metavar="N", help=f"prefill context parallel ranks (default 1, at most {parallel})")
    vllm.add_argument("--decode-context-parallel-size", "-dcp", type=bounded_int("decode_context_parallel_size"),
                      default=None, metavar="N", help=f"decode context parallel ranks (default 1, at most {parallel})")
    vllm.add_argument("--enable-expert-parallel", action="store_true", default=None,
                      help="expert parallelism for MoE models (vLLM's -ep; adds communication streams)")
    vllm.add_argument("--enable-sequence-parallel", action="store_true", default=None,
                      help="sequence parallelism (Ascend then keeps only capture sizes divisible by tp)")
    vllm.add_argument("--enforce-eager", action="store_true", default=None, help="no compilation, no graphs")
    vllm.add_argument("--block-size", type=bounded_int("block_size"), default=None, metavar="N",
                      help=f"KV cache block size (default 128, at most {LIMITS['block_size'][1]})")
    vllm.add_argument("--max-loras", type=bounded_int("max_loras"), default=None, metavar="N",
                      help="LoRA adapters per batch (default 0: LoRA off; --enable-lora in a pasted line means 1); "
                           "more than 0 adds LoRA dispatcher keys")
    vllm.add_argument("--performance-mode", choices=("balanced", "interactivity", "throughput"), default=None)
    stack = parser.add_argument_group("Ascend stack")
    stack.add_argument("--soc", choices=SOCS, default=None, type=str.upper, help="SoC generation (default A2)")
    stack.add_argument("--stream-limit", type=bounded_int("stream_limit"), default=None, metavar="N",
                       help="streams available to graph capture (the planner's MAX; default 1800, at most "
                            f"{LIMITS['stream_limit'][1]})")
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


def _checked_speculative_config(args: argparse.Namespace, *, warn: bool) -> Any:
    """--speculative-config checked against vLLM's SpeculativeConfig keys and --num-speculative-tokens.

    Real vLLM keys ascendgraph does not model are warned about once; unknown keys and a
    --num-speculative-tokens that disagrees with the JSON's are errors.
    """
    raw = getattr(args, "speculative_config", None)
    if raw is None:
        return None
    if isinstance(raw, str) and not raw.strip():
        raise ConfigError("--speculative-config is empty; pass a JSON object such as '{}'", key="speculative_config")
    spec = parse_json_argument("--speculative-config", raw)
    valid = sorted(set(VLLM_SPECULATIVE_CONFIG_KEYS) | set(MODELLED_SPECULATIVE_KEYS))
    for key in spec:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
            hint = (f"did you mean {close[0]!r}?" if close else
                    f"ascendgraph uses {', '.join(MODELLED_SPECULATIVE_KEYS)}; the other vLLM SpeculativeConfig "
                    "fields (method, model, ...) are accepted and ignored")
            raise ConfigError(f"unknown --speculative-config key {key!r} (not a vLLM SpeculativeConfig field); {hint}",
                              key="speculative_config")
    ignored = [key for key in spec if key not in MODELLED_SPECULATIVE_KEYS]
    if ignored and warn:
        log.warning("--speculative-config keys ignored (real vLLM settings ascendgraph does not model): %s",
                    ", ".join(ignored))
    flag_value = getattr(args, "num_speculative_tokens", None)
    json_value = spec.get("num_speculative_tokens")
    if flag_value is not None and json_value is not None and flag_value != json_value:
        raise ConfigError(
            f"--num-speculative-tokens {flag_value} conflicts with --speculative-config num_speculative_tokens "
            f"{json_value!r}; give the number once", key="num_speculative_tokens",
        )
    return raw


def _checked_json_flag(args: argparse.Namespace, name: str) -> Any:
    value = getattr(args, name, None)
    if isinstance(value, str) and not value.strip():
        flag = "--" + name.replace("_", "-")
        raise ConfigError(f"{flag} is empty; pass a JSON object such as '{{}}'", key=name)
    return value


def config_from_args(args: argparse.Namespace, *, warn: bool = True) -> GraphConfig:
    """A GraphConfig from parsed config flags; bad values raise ConfigError. ``warn``: log
    the ignored --speculative-config keys (once per command)."""
    engine_args: dict[str, Any] = {}
    for name in _ENGINE_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            engine_args[name] = value
    speculative = _checked_speculative_config(args, warn=warn)
    if speculative:
        engine_args["speculative_config"] = speculative
    return GraphConfig.from_vllm_args(
        compilation_config=_checked_json_flag(args, "compilation_config"),
        additional_config=_checked_json_flag(args, "additional_config"),
        model=args.model,
        num_layers=args.num_layers,
        **engine_args,
    )


def hccl_mode_from_args(args: argparse.Namespace) -> Optional[str]:
    return getattr(args, "hccl_op_expansion_mode", None)


def env_from_args(args: argparse.Namespace) -> Optional[dict[str, str]]:
    """The environment a command resolves and runs with: the process environment plus the
    assignments prefixed to a pasted line (``ASCEND_LAUNCH_BLOCKING=1 vllm serve ...``), as
    a real launch would see it; None (the process environment) when there are none. The
    process environment itself is never changed."""
    pasted = getattr(args, "pasted_env", None)
    if not pasted:
        return None
    return {**os.environ, **pasted}


def emit_json(document: dict[str, Any]) -> None:
    text = dump_json(document) + "\n"
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        exc._ascendgraph_stdout = True  # type: ignore[attr-defined]  # `main` reports it as a stdout failure
        raise


def emit_text(text: str) -> None:
    """A line on stderr; best effort (a closed or full stderr must not turn into a traceback)."""
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


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
        env=env_from_args(args),
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
    "ascendgraph.cli.run",      # run
    "ascendgraph.tools.plan",            # plan
    "ascendgraph.cli.scenario",    # scenario
    "ascendgraph.cli.profile",     # profile
    "ascendgraph.tools.doctor",          # doctor
    "ascendgraph.tools.diagnose",        # diagnose
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


def package_version() -> str:
    """The installed distribution's version (the package's __version__ when not installed)."""
    from importlib import metadata

    try:
        return metadata.version("ascendgraph")
    except metadata.PackageNotFoundError:
        return str(getattr(sys.modules.get("ascendgraph"), "__version__", "unknown"))


def build_parser() -> argparse.ArgumentParser:
    _load_command_modules()
    parser = _Parser(
        prog=PROG,
        description="vLLM graph mode on Ascend NPUs — explain, run, plan and test it on a CPU simulator "
        "or a real NPU.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}",
                        help="print the version and exit")
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


def format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                   line: Optional[str] = None) -> str:
    """Python warnings as the CLI prints them: ``warning: <message>`` on one line, without
    the source file and line (e.g. the static-kernel build notice)."""
    text = " ".join(str(message).split())
    return f"warning: {text}\n"


@contextmanager
def cli_warnings() -> Iterator[None]:
    """Format the Python warnings printed while a command runs with `format_warning`.

    Only the formatting changes: warnings stay real warnings (filters, ``pytest.warns`` and
    ``-W error`` see them as before), and the previous formatter is restored afterwards.
    """
    previous = warnings.formatwarning
    warnings.formatwarning = format_warning  # type: ignore[assignment]
    try:
        yield
    finally:
        warnings.formatwarning = previous


def _dests(child: argparse.ArgumentParser, tokens: Sequence[str]) -> dict[str, str]:
    """Option destinations named in a token list, with the spelling used (and its value)."""
    found: dict[str, str] = {}
    for index, token in enumerate(tokens):
        if not token.startswith("-"):
            continue
        name = token.split("=", 1)[0]
        action = child._option_string_actions.get(name)
        if action is None and not token.startswith("--") and len(token) > 2:
            action = child._option_string_actions.get(token[:2])  # -O3: a short flag with its value attached
            name = token
        if action is not None:
            shown = token
            if name == token and action.nargs != 0 and index + 1 < len(tokens):
                shown = f"{token} {tokens[index + 1]}"
            found[action.dest] = shown
    return found


@dataclass
class _Parsed:
    """Parsed arguments plus what a pasted line contributed besides flags."""

    args: argparse.Namespace
    ignored: list[str]
    notes: list[str]


def _parse_with_pasted_line(parser: argparse.ArgumentParser, head: list[str], pasted: list[str]) -> _Parsed:
    """Parse ``head`` plus the translation of a pasted ``vllm serve`` line (after ``--``)."""
    from ascendgraph.cli.vllm_serve import PASTE_COMMANDS, translate_vllm_command

    args = parser.parse_args(head)
    command = getattr(args, "command", None)
    if command not in PASTE_COMMANDS:
        raise CliUsageError(
            f"{PROG}: error: only {', '.join(PASTE_COMMANDS)} accept a pasted `vllm serve` line after -- "
            f"(see {PROG} --help)"
        )
    child = args._children[command]
    try:
        translated = translate_vllm_command(
            pasted,
            accepts=lambda flag: flag in child._option_string_actions,
            own_flag=lambda flag: flag in child._option_string_actions,
        )
    except ConfigError as exc:
        raise CliUsageError(f"{PROG} {command}: error: {exc}") from None
    mine, theirs = _dests(child, head), _dests(child, translated.argv)
    for dest in sorted(set(mine) & set(theirs)):
        raise CliUsageError(
            f"{PROG} {command}: error: {mine[dest]} is given both before -- and in the pasted vllm serve line "
            f"({theirs[dest]}); give it once"
        )
    args = parser.parse_args(head + translated.argv)
    args.pasted_env = dict(translated.env)
    return _Parsed(args, translated.ignored, translated.notes)


def _parse(parser: argparse.ArgumentParser, tokens: list[str]) -> _Parsed:
    if "--" in tokens:
        split = tokens.index("--")
        parsed = _parse_with_pasted_line(parser, tokens[:split], tokens[split + 1:])
    else:
        parsed = _Parsed(parser.parse_args(tokens), [], [])
    check_limits(parser, parsed.args)
    return parsed


# Commands that resolve with `env_from_args` themselves; for the others a pasted line's
# environment is checked by `_check_pasted_env` before they run.
ENV_AWARE_COMMANDS = ("explain", "run", "plan")


def _check_pasted_env(args: argparse.Namespace, command: "Command") -> None:
    """Resolve once with the pasted line's environment, so an assignment that makes the
    configuration impossible (``ASCEND_LAUNCH_BLOCKING=1``) is refused as a launch would be."""
    env = env_from_args(args)
    if env is None or command.name in ENV_AWARE_COMMANDS:
        return
    from ascendgraph.resolve import resolve
    from ascendgraph.sizes import DEFAULT_MAX_STREAMS

    resolve(config_from_args(args, warn=False), env=env,
            stream_limit=getattr(args, "stream_limit", None) or DEFAULT_MAX_STREAMS,
            hccl_op_expansion_mode=hccl_mode_from_args(args))


def _wants_json(tokens: Sequence[str]) -> bool:
    """``--json`` among ascendgraph's own arguments (not inside a pasted ``vllm serve`` line)."""
    own = tokens[: tokens.index("--")] if "--" in tokens else tokens
    return "--json" in own


def _bad_input(message: str, error_type: str, wants_json: bool) -> int:
    """Exit 2: the one-line error on stderr and, under ``--json``, an error document on stdout
    so a machine reading stdout always gets one document."""
    emit_text(message)
    if wants_json:
        emit_json({"schema_version": 1, "exit_code": BAD_INPUT, "error": {"type": error_type, "message": message}})
    return BAD_INPUT


def _run_command(command: "Command", args: argparse.Namespace, wants_json: bool = False) -> int:
    try:
        _check_pasted_env(args, command)
        with cli_warnings():
            return command.run(args)
    except CliUsageError as exc:
        return _bad_input(str(exc), "UsageError", wants_json)
    except (ConfigError, GraphModeError, DeviceUnavailable) as exc:
        first_line = str(exc).strip()
        return _bad_input(f"{PROG} {command.name}: error: {first_line}", type(exc).__name__, wants_json)
    except KeyboardInterrupt:
        emit_text(f"{PROG} {command.name}: interrupted")
        return 130


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The console script. Output plumbing is settled here, once, the way well-behaved command
    line tools do it: a reader that closed the pipe (``| head``, ``| true``) ends the command
    quietly; stdout that cannot be written (``> /dev/full``, ``>&-``) is a one-line error
    (exit 1); Ctrl-C is exit 130. Never a traceback."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        emit_text(f"{PROG}: interrupted")
        return INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return PIPE_CLOSED
    except OSError as exc:
        if not _is_stdout_error(exc):
            raise
        _silence_stdout()
        emit_text(f"{PROG}: error: cannot write to stdout: {exc.strerror or exc}")
        return RUN_FAILED


INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process ended by Ctrl-C
PIPE_CLOSED = 141  # 128 + SIGPIPE, what a shell reports when the reader went away


class _ClosedStdout:
    """Stands in for ``sys.stdout`` when file descriptor 1 is closed (``ascendgraph ... >&-``):
    writing to it is the same OSError a write to a closed descriptor gives."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed")

    def flush(self) -> None:
        return None


def _is_stdout_error(exc: OSError) -> bool:
    if getattr(exc, "_ascendgraph_stdout", False):
        return True
    return exc.filename is None and exc.errno in (errno.ENOSPC, errno.EBADF)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        if sys.stdout is not None and not isinstance(sys.stdout, _ClosedStdout):
            try:
                os.dup2(devnull, sys.stdout.fileno())
            except (OSError, ValueError, AttributeError):
                pass
        sys.stdout = open(devnull, "w")
    except OSError:
        pass


def _main(argv: Optional[Sequence[str]] = None) -> int:
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()  # type: ignore[assignment]
    parser = build_parser()
    tokens = list(sys.argv[1:] if argv is None else argv)
    wants_json = _wants_json(tokens)
    try:
        parsed = _parse(parser, tokens)
    except CliUsageError as exc:
        return _bad_input(str(exc), "UsageError", wants_json)
    args = parsed.args
    if getattr(args, "_command", None) is None:
        parser.print_help(sys.stderr)
        return BAD_INPUT
    _configure_logging(args)
    if parsed.ignored:
        log.warning("ignoring vllm serve flags ascendgraph does not model: %s", ", ".join(parsed.ignored))
    for note in parsed.notes:
        log.warning("%s", note)
    pasted_env = getattr(args, "pasted_env", None)
    if pasted_env:
        log.info("environment of the pasted line: %s", " ".join(f"{k}={v}" for k, v in pasted_env.items()))
    return _run_command(args._command, args, wants_json)


if __name__ == "__main__":  # pragma: no cover
    # Run through the imported module so commands registered by other modules land in the
    # same COMMANDS table (this file is `__main__` here, not `ascendgraph.cli.app`).
    from ascendgraph.cli.app import main as _main

    sys.exit(_main())
