"""The ``ascendgraph`` command line: `main`, the parser and what every command shares.

Each subcommand is a module of this package with a `COMMAND` (its name, help, flags and
runner), listed by `commands()`; the flags they share are `ascendgraph.cli.args`, the
translation of a pasted ``vllm serve`` line `ascendgraph.cli.vllm_serve`.

Conventions (README.md, "The commands"): a command's result goes to stdout (`emit_result`),
with ``--json`` the document alone (`emit_json`); logs, progress, warnings and errors go to
stderr (logging, `emit_text`), every log line in one format (`LOG_FORMAT`). Exit 0 success,
1 the run failed, 2 bad input (a one-line error naming the value and the fix, never a traceback).
"""

from __future__ import annotations

import argparse
import difflib
import gc
import logging
import os
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

from ascendgraph.cli.args import LIMITS, config_from_args, env_from_args, hccl_mode_from_args, limit_error
from ascendgraph.cli.vllm_flags import VLLM_FLAGS
from ascendgraph.errors import CliUsageError, ConfigError, DeviceUnavailable, GraphModeError
from ascendgraph.readers import shown
from ascendgraph.cli.streams import (INTERRUPTED, PIPE_CLOSED, TERMINATED, ClosedStdout, Terminated, emit_json,
                                     emit_result, emit_text, interrupt_handled, is_default_interrupt_handler,
                                     is_stdout_error, sigterm_unwinds, signals_never_lost, silence_stdout,
                                     write_stdout)

__all__ = ["main", "build_parser", "parse_command_line", "commands", "Command", "Parser", "CliUsageError", "check_limits", "flag_hint",
           "unrecognized_message", "format_warning", "cli_warnings", "package_version", "emit_json", "emit_result",
           "emit_text"]

PROG = "ascendgraph"
BAD_INPUT = 2
RUN_FAILED = 1
log = logging.getLogger("ascendgraph")


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) that name the (sub)command and point at
    its --help; unknown flags get the closest one; no abbreviations (``--num-layer``).

    It keeps its own record of what was added, through argparse's public methods only:
    `flags` (option string -> action), `actions` (in order, groups included) and
    `subcommands` (name -> child parser), so hints, limits and the pasted-line check never
    read argparse's private tables.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.flags: dict[str, argparse.Action] = {}
        self.actions: list[argparse.Action] = []
        self.subcommands: dict[str, Parser] = {}
        self.subcommand_dest: Optional[str] = None
        self._built = False  # argparse's own __init__ makes its default groups: those stay plain
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._built = True

    def record(self, action: argparse.Action) -> argparse.Action:
        self.actions.append(action)
        for name in action.option_strings:
            self.flags[name] = action
        return action

    def add_argument(self, *names: Any, **kwargs: Any) -> argparse.Action:
        return self.record(super().add_argument(*names, **kwargs))

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        group = super().add_argument_group(*args, **kwargs)
        return _RecordingGroup(group, self) if self._built else group

    def add_mutually_exclusive_group(self, **kwargs: Any) -> "_RecordingGroup":  # type: ignore[override]  # returns our recording subclass of argparse's group
        return _RecordingGroup(super().add_mutually_exclusive_group(**kwargs), self)

    def add_subparsers(self, **kwargs: Any) -> "_Subcommands":  # type: ignore[override]  # returns our recording subclass of argparse's subparsers action
        kwargs.setdefault("parser_class", Parser)
        action = super().add_subparsers(**kwargs)
        self.subcommand_dest = action.dest
        return _Subcommands(action, self)

    def _print_message(self, message: str, file: Any = None) -> None:
        """--help, --version and usage go through the stdout writer: a full or closed stdout is
        the same one-line error (exit 1) as for any result, never a silent exit 0."""
        if message and (file is None or file is sys.stdout):
            write_stdout(message)
        elif message:
            emit_text(message.rstrip("\n"))

    def error(self, message: str) -> None:  # type: ignore[override]  # raises instead of exiting (argparse declares NoReturn)
        raise CliUsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")

    def parse_args(self, args: Optional[Sequence[str]] = None,  # type: ignore[override]  # narrower than argparse's overloads: always a fresh Namespace
                   namespace: Optional[argparse.Namespace] = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            raise CliUsageError(unrecognized_message(_leaf_parser(self, parsed), extras, root=self))
        return parsed


class _RecordingGroup:
    """An argument group (or mutually exclusive group) that records its flags in its `Parser`."""

    def __init__(self, group: Any, parser: Parser) -> None:
        self._group = group
        self._parser = parser

    def add_argument(self, *names: Any, **kwargs: Any) -> argparse.Action:
        return self._parser.record(self._group.add_argument(*names, **kwargs))

    def add_mutually_exclusive_group(self, **kwargs: Any) -> "_RecordingGroup":
        return _RecordingGroup(self._group.add_mutually_exclusive_group(**kwargs), self._parser)


class _Subcommands:
    """What `Parser.add_subparsers` returns: ``add_parser`` records each child by name."""

    def __init__(self, action: Any, parser: Parser) -> None:
        self._action = action
        self._parser = parser

    def add_parser(self, name: str, **kwargs: Any) -> "Parser":
        child = self._action.add_parser(name, **kwargs)
        self._parser.subcommands[name] = child
        return child


def _leaf_parser(parser: Parser, parsed: argparse.Namespace) -> Parser:
    """The (sub)parser that parsed the last command word (``ascendgraph scenario run``)."""
    if parser.subcommand_dest is not None:
        child = parser.subcommands.get(getattr(parsed, parser.subcommand_dest, None) or "")
        if child is not None:
            return _leaf_parser(child, parsed)
    return parser


def _command_name(parser: Parser) -> str:
    words = parser.prog.split()
    return words[1] if len(words) > 1 else ""


def flag_hint(parser: Parser, flag: str, root: Optional[Parser] = None) -> str:
    """Why ``flag`` is not a flag of ``parser`` and what to type instead ('' when no idea).
    ``root``: the top-level parser, whose own flags go before the command."""
    from ascendgraph.cli.vllm_serve import MODELLED_FLAGS, PASTE_COMMANDS

    options = parser.flags
    if root is not None and root is not parser and flag in root.flags:
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


def unrecognized_message(parser: Parser, extras: Sequence[str], root: Optional[Parser] = None) -> str:
    """The one-line error for arguments ``parser`` does not know, with a hint for the first flag."""
    flag = next((token.split("=", 1)[0] for token in extras if token.startswith("-")), None)
    hint = flag_hint(parser, flag, root) if flag else ""
    return f"{parser.prog}: error: unrecognized arguments: {' '.join(extras)}{hint} (see {parser.prog} --help)"


def check_limits(parser: Parser, args: argparse.Namespace) -> None:
    """Every count flag within `LIMITS`, whichever module defined it (exit 2 otherwise)."""
    leaf = _leaf_parser(parser, args)
    for action in leaf.actions:
        value = getattr(args, action.dest, None)
        if action.dest not in LIMITS or isinstance(value, bool) or not isinstance(value, int):
            continue
        problem = limit_error(action.dest, value)
        if problem:
            flag = "/".join(action.option_strings) or action.dest
            raise CliUsageError(f"{leaf.prog}: error: argument {flag}: {problem} (see {leaf.prog} --help)")


# --------------------------------------------------------------------------- command table


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, one-line help, --help description, flags and runner (exit code)."""

    name: str
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def commands() -> list[Command]:
    """Every subcommand in the order ``--help`` lists them: one module each in ascendgraph/cli/."""
    from ascendgraph.cli import diagnose, doctor, explain, plan, profile, run, scenario

    return [explain.COMMAND, run.COMMAND, plan.COMMAND, scenario.COMMAND, profile.COMMAND, doctor.COMMAND,
            diagnose.COMMAND]


def package_version() -> str:
    """The installed distribution's version (the package's __version__ when not installed)."""
    from importlib import metadata

    try:
        return metadata.version("ascendgraph")
    except metadata.PackageNotFoundError:
        return str(getattr(sys.modules.get("ascendgraph"), "__version__", "unknown"))


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG,
        description="vLLM graph mode on Ascend NPUs — explain, run, plan and test it on a CPU simulator "
        "or a real NPU.",
        epilog="conventions:\n"
        "  a command's result goes to stdout (with --json: one JSON document and nothing else);\n"
        "  logs, progress and warnings go to stderr as `LEVEL ascendgraph: message`.\n"
        "  Flags take every spelling `vllm serve` takes: --max_num_seqs=8, -O3, --optimization-level 3,\n"
        "  -cc.cudagraph_mode=FULL, --no-enforce-eager.\n"
        "  Exit codes: 0 success, 1 the run failed, 2 bad input.\n"
        "  How the code is laid out: docs/ARCHITECTURE.md",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}",
                        help="print the version and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    parser.add_argument("--debug", action="store_true", help="show a traceback when a run fails")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands():
        child = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(child)
        child.set_defaults(command_entry=command)
    return parser


# One format for every line ascendgraph logs, whichever module logs it, and for the Python
# warnings printed while a command runs: ``LEVEL ascendgraph: message`` on stderr.
LOG_FORMAT = "%(levelname)s ascendgraph: %(message)s"


class OneLineFormatter(logging.Formatter):
    """A log record's message on one line, text from inputs escaped (`ascendgraph.readers.shown`):
    a newline or an escape sequence in a flag, a path or a config name cannot forge a second
    line or drive the terminal. A traceback (``--debug``) still follows on its own lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = shown(record.message)
        return super().formatMessage(record)


def _configure_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(LOG_FORMAT))
    root = logging.getLogger("ascendgraph")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                   line: Optional[str] = None) -> str:
    """Python warnings as the CLI prints them: one line in the log format (``WARNING
    ascendgraph: <message>``), without the source file and line (e.g. the static-kernel build
    notice, whose text stays as it is)."""
    text = " ".join(str(message).split())
    return LOG_FORMAT % {"levelname": "WARNING", "message": text} + "\n"


@contextmanager
def cli_warnings() -> Iterator[None]:
    """Format the Python warnings printed while a command runs with `format_warning`.

    Only the formatting changes: warnings stay real warnings (filters, ``pytest.warns`` and
    ``-W error`` see them as before), and the previous formatter is restored afterwards.
    """
    previous = warnings.formatwarning
    warnings.formatwarning = format_warning
    try:
        yield
    finally:
        warnings.formatwarning = previous


def _dests(child: Parser, tokens: Sequence[str]) -> dict[str, str]:
    """Option destinations named in a token list, with the spelling used (and its value)."""
    found: dict[str, str] = {}
    for index, token in enumerate(tokens):
        if not token.startswith("-"):
            continue
        name = token.split("=", 1)[0]
        action = child.flags.get(name)
        if action is None and not token.startswith("--") and len(token) > 2:
            action = child.flags.get(token[:2])  # -O3: a short flag with its value attached
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


def _parse_with_pasted_line(parser: Parser, head: list[str], pasted: list[str]) -> _Parsed:
    """Parse ``head`` plus the translation of a pasted ``vllm serve`` line (after ``--``)."""
    from ascendgraph.cli.vllm_serve import PASTE_COMMANDS, translate_vllm_command

    args = parser.parse_args(head)
    command = getattr(args, "command", None)
    if command not in PASTE_COMMANDS:
        raise CliUsageError(
            f"{PROG}: error: only {', '.join(PASTE_COMMANDS)} accept a pasted `vllm serve` line after -- "
            f"(see {PROG} --help)"
        )
    child = parser.subcommands[command]
    try:
        translated = translate_vllm_command(
            pasted,
            accepts=lambda flag: flag in child.flags,
            own_flag=lambda flag: flag in child.flags,
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


def _own_spellings(parser: Parser, tokens: list[str]) -> list[str]:
    """The command's own flags in vLLM's spellings rewritten to the ones argparse knows
    (`ascendgraph.cli.vllm_serve.normalize_spellings`); tokens before the command unchanged."""
    from ascendgraph.cli.vllm_serve import normalize_spellings

    position = next((i for i, token in enumerate(tokens) if token in parser.subcommands), None)
    if position is None:
        return tokens
    child = parser.subcommands[tokens[position]]
    try:
        rest = normalize_spellings(tokens[position + 1:], known=lambda flag: flag in child.flags)
    except ConfigError as exc:
        raise CliUsageError(f"{child.prog}: error: {exc}") from None
    return [*tokens[: position + 1], *rest]


def parse_command_line(parser: Parser, tokens: Sequence[str]) -> _Parsed:
    """Parse a whole command line: the command's own flags (in any vLLM spelling) and, after
    ``--``, a pasted ``vllm serve`` line; every count flag checked against its limit."""
    tokens = list(tokens)
    if "--" in tokens:
        split = tokens.index("--")
        parsed = _parse_with_pasted_line(parser, _own_spellings(parser, tokens[:split]), tokens[split + 1:])
    else:
        parsed = _Parsed(parser.parse_args(_own_spellings(parser, tokens)), [], [])
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
    so a machine reading stdout always gets one document. Text from the input is escaped
    (`ascendgraph.readers.shown`): the error is one line whatever the input held."""
    message = shown(message)
    emit_text(message)
    if wants_json:
        emit_json({"schema_version": 1, "exit_code": BAD_INPUT, "error": {"type": error_type, "message": message}})
    return BAD_INPUT


# Commands that run torch. torch's start-up imports numpy from C++ and, when that import is
# interrupted, carries on without numpy instead of raising: a Ctrl-C in the first second or
# two of `ascendgraph run` was silently lost and the run went on. So torch is imported first,
# with Ctrl-C held back until the import is complete, then raised as the KeyboardInterrupt
# the handlers below turn into exit 130. `plan` imports torch the same way, and only when it
# measures (`import_torch_whole`): a measurement the plan cache holds needs no torch.
COMMANDS_USING_TORCH = ("run", "scenario", "profile")


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) back until the block ends, then raise it. A no-op off the main
    thread or when someone else owns SIGINT (a test runner, an embedding program)."""
    import signal
    import threading

    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not is_default_interrupt_handler(handler):
        yield
        return
    received: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
    if received:
        raise KeyboardInterrupt


def _check_working_directory() -> None:
    """torch's native libraries (oneMKL) abort the process when the working directory was
    deleted under it: refuse up front, in one line, instead of a fatal error with empty stdout."""
    try:
        os.getcwd()
    except FileNotFoundError:
        raise ConfigError("the current working directory no longer exists (it was deleted or moved); "
                          "cd to an existing folder and run the command again", key="cwd") from None
    except OSError:
        pass


def import_torch_whole() -> None:
    """Import torch as the commands of COMMANDS_USING_TORCH do (Ctrl-C held back until it is done)."""
    _import_torch_whole()


def _import_torch_whole() -> None:
    _check_working_directory()
    fresh = "torch" not in sys.modules
    with _interrupts_deferred():
        import numpy  # noqa: F401  (before torch: its C++ start-up imports numpy)
        import torch  # noqa: F401
    if fresh:
        # The objects importing torch made (modules, functions, classes: about 110,000) live as
        # long as the process. Frozen, the cyclic garbage collector no longer walks them in every
        # full collection of the run (measured: half of the run's 0.55 s of full collections).
        # Only when this call imported torch: a process that had torch already (a test calling
        # `main`) keeps its collector as it was. The Dynamo deferral first: it finds torch's
        # wrapped functions through the collector (gc.get_referrers), which sees no frozen
        # object (frozen before it, the warm run imported Dynamo again, 0.5 s).
        from ascendgraph.dynamo_gate import defer_torch_dynamo_guards

        defer_torch_dynamo_guards()
        gc.freeze()


def _run_command(command: "Command", args: argparse.Namespace, wants_json: bool = False) -> int:
    try:
        if command.name in COMMANDS_USING_TORCH:
            _import_torch_whole()
        _check_pasted_env(args, command)
        with cli_warnings():
            return command.run(args)
    except CliUsageError as exc:
        return _bad_input(str(exc), "UsageError", wants_json)
    except (ConfigError, GraphModeError, DeviceUnavailable) as exc:
        first_line = str(exc).strip()
        return _bad_input(f"{PROG} {command.name}: error: {first_line}", type(exc).__name__, wants_json)
    except KeyboardInterrupt:
        interrupt_handled()
        return _stopped(f"{PROG} {command.name}: interrupted", "KeyboardInterrupt", INTERRUPTED, wants_json)
    except Terminated:
        interrupt_handled()
        return _stopped(f"{PROG} {command.name}: terminated (SIGTERM)", "Terminated", TERMINATED, wants_json)


def _stopped(message: str, error_type: str, code: int, wants_json: bool) -> int:
    """Ctrl-C or SIGTERM: one line on stderr and, under ``--json``, the document saying so (a
    reader of stdout always gets one document). Outputs being written were removed on the way."""
    emit_text(message)
    if wants_json:
        try:
            emit_json({"schema_version": 1, "exit_code": code, "error": {"type": error_type, "message": message}})
        except OSError:
            pass
    return code


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The console script. Output plumbing is settled here, once, the way well-behaved command
    line tools do it: a reader that closed the pipe (``| head``, ``| true``) ends the command
    quietly; stdout that cannot be written (``> /dev/full``, ``>&-``) is a one-line error
    (exit 1); Ctrl-C is exit 130. Never a traceback."""
    try:
        with sigterm_unwinds(), signals_never_lost():
            return _main(argv)
    except KeyboardInterrupt:
        emit_text(f"{PROG}: interrupted")
        return INTERRUPTED
    except Terminated:
        emit_text(f"{PROG}: terminated (SIGTERM)")
        return TERMINATED
    except BrokenPipeError:
        silence_stdout()
        return PIPE_CLOSED
    except OSError as exc:
        if not is_stdout_error(exc):
            raise
        silence_stdout()
        emit_text(f"{PROG}: error: cannot write to stdout: {exc.strerror or exc}")
        return RUN_FAILED


def _main(argv: Optional[Sequence[str]] = None) -> int:
    if sys.stdout is None:
        sys.stdout = ClosedStdout()
    parser = build_parser()
    tokens = list(sys.argv[1:] if argv is None else argv)
    wants_json = _wants_json(tokens)
    try:
        parsed = parse_command_line(parser, tokens)
    except CliUsageError as exc:
        return _bad_input(str(exc), "UsageError", wants_json)
    args = parsed.args
    if getattr(args, "command_entry", None) is None:
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
    return _run_command(args.command_entry, args, wants_json)


if __name__ == "__main__":  # pragma: no cover
    # Run through the imported module: the command modules import `ascendgraph.cli.app`, and
    # this file is `__main__` here (two copies of Command would not compare equal).
    from ascendgraph.cli.app import main as _entry

    sys.exit(_entry())
