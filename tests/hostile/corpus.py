"""The hostile-input corpus: command lines and API calls an adversarial user would try.

Every case is built from tables (values x places), so the corpus grows with the parser: the
number flags are found by walking `build_parser()`, every subcommand gets its own cases.
A case says only what it feeds; the contract is asserted the same way for all of them
(tests/hostile/test_cli_corpus.py): exit 2, one line on stderr, no traceback, and under
``--json`` one strict JSON document on stdout.

Sizes are tiny on purpose: each case is refused before any engine starts, in-process.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ascendgraph.cli.app import build_parser

BIG_INT = "9" * 5000  # beyond Python's own int-conversion limit (4300 digits)
LONG_INT = "1" + "0" * 20  # 21 digits: one more than the readers take
DEEP_LIST = "[" * 5000 + "]" * 5000  # deeper than the interpreter's recursion limit
NESTED_65 = '{"a": ' * 65 + "1" + "}" * 65  # one level more than the readers take

# JSON texts every JSON flag must refuse (as a flag, in a pasted line, in a file).
HOSTILE_JSON: dict[str, str] = {
    "big-int": '{"level": %s}' % BIG_INT,
    "21-digit-int": '{"level": %s}' % LONG_INT,
    "negative-big-int": '{"a": -%s}' % BIG_INT,
    "deep-list": DEEP_LIST,
    "nested-65": NESTED_65,
    "nan": '{"a": NaN}',
    "infinity": '{"a": Infinity}',
    "minus-infinity": '{"a": -Infinity}',
    "overflow-float": '{"a": 1e999}',
    "long-float": '{"a": 1.%s}' % ("5" * 100),
    "not-json": "{bad json",
    "truncated": '{"a": ',
    "array": "[1, 2]",
    "number": "5",
    "string": '"FULL"',
    "null": "null",
    "single-quotes": "{'cudagraph_mode': 'FULL'}",
    "trailing-garbage": '{"a": 1} x',
    "nul-byte": '{"a": "\x00"}x',
    "control-chars": "{\x01\x02}",
    "bad-unicode-escape": '{"a": "\\ud800\\uZZZZ"}',
    "deep-dict": '{"a":' * 3000 + "1" + "}" * 3000,
}
JSON_FLAGS = ("--compilation-config", "--additional-config", "--speculative-config")

# Integer texts no count flag takes.
HOSTILE_INTS: dict[str, str] = {
    "superscript-two": "²",
    "arabic-indic": "١٢",
    "fullwidth": "１２",
    "thousands-digits": BIG_INT,
    "21-digits": LONG_INT,
    "negative": "-1",
    "float": "1.5",
    "exponent": "1e3",
    "hex": "0x10",
    "underscore": "1_000",
    "nan": "nan",
    "inf": "inf",
    "empty": "",
    "blank": "   ",
    "word": "eight",
    "nul": "8\x00",
}
HOSTILE_LEVELS = {"seven": "7", "negative": "-1", "thousands-digits": BIG_INT, "superscript": "²",
                  "word": "fast", "O9": "O9", "float": "2.0"}
HOSTILE_ATOL = {"1e9": "1e9", "nan": "nan", "inf": "inf", "negative": "-1", "superscript": "²",
                "overflow": "1e999", "two": "2", "word": "tight", "long": "1." + "0" * 100}
HOSTILE_FAULTS = {
    "superscript-count": "capture_begin=²*off->raise(207008)",
    "thousands-digit-count": f"capture_begin={BIG_INT}*off->raise(207008)",
    "21-digit-count": f"capture_begin={LONG_INT}*off->raise(207008)",
    "delay-inf": "replay=delay(inf)",
    "delay-nan": "replay=delay(nan)",
    "delay-1e308": "replay=delay(1e308)",
    "delay-above-an-hour": "replay=delay(3600001)",
    "delay-negative": "replay=delay(-1)",
    "delay-arabic": "replay=delay(١)",
    "percent-nan": "replay=nan%hang",
    "percent-200": "replay=200%hang",
    "unknown-site": "bogus=hang",
    "unknown-code": "capture_begin=raise(1)",
    "twice": "replay=hang;replay=hang",
    "no-term": "replay=",
    "unterminated": "replay=delay(5",
    "perturb-nan": "replay=perturb(nan)",
    "perturb-inf": "replay=perturb(inf)",
    "perturb-superscript": "replay=perturb(²)",
}


@dataclass(frozen=True)
class Case:
    """One hostile command line; ``files`` are written under the corpus folder first."""

    id: str
    argv: tuple[str, ...]
    json_flag: bool = False  # the command takes --json: the case also runs with it


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _walk(child, (*path, name))
        elif action.option_strings and path:
            yield path, action


def _is_count_flag(action: argparse.Action) -> bool:
    name = getattr(action.type, "__name__", "")
    return name in ("positive_int", "non_negative_int") or " (" in name  # bounded_int converters: "requests (1..N)"


def _commands() -> dict[tuple[str, ...], set[str]]:
    """Command path -> its option strings."""
    found: dict[tuple[str, ...], set[str]] = {}
    for path, action in _walk(build_parser(), ()):
        found.setdefault(path, set()).update(action.option_strings)
    return found


# Arguments a command needs besides the hostile one (kept tiny and refused before any work).
def _base(command: tuple[str, ...], files: "CorpusFiles") -> tuple[str, ...]:
    if command == ("diagnose",):
        return ("diagnose", str(files.good_log))
    if command == ("scenario", "run"):
        return ("scenario", "run", str(files.good_scenario_folder))
    if command == ("scenario", "list"):
        return ("scenario", "list", str(files.good_scenario_folder))
    if command in (("plan",),):
        return ("plan", "--measure", "off")
    return command


class CorpusFiles:
    """Hostile files of every type a reader takes, written once per test session."""

    def __init__(self, root: Path, *, write: bool = True) -> None:
        """``write`` False: only the paths (to name the cases at collection time)."""
        self.root = root
        self.write = write
        self.good_scenario_folder = root / "good_scenarios"
        self.folder = root / "a_folder"
        if write:
            root.mkdir(parents=True, exist_ok=True)
            self.good_scenario_folder.mkdir(exist_ok=True)
            self.folder.mkdir(exist_ok=True)
        self.good_log = self._write("good.log", "INFO vllm serve started\n")
        self._write("good_scenarios/ok.toml",
                    'kind = "device"\ndescription = "x"\n[action]\nname = "capture_graphs"\n[expect]\noutcome = "ok"\n')

    def _write(self, name: str, content: "str | bytes") -> Path:
        path = self.root / name
        if not self.write:
            return path
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    def json_files(self) -> dict[str, Path]:
        files = {name: self._write(f"{name}.json", text) for name, text in HOSTILE_JSON.items()}
        files["binary"] = self._write("binary.json", b"\x89PNG\r\n\x1a\n\xff\xfe" + bytes(range(256)))
        files["nul-filled"] = self._write("nul.json", b"\x00" * 4096)
        files["latin-1"] = self._write("latin1.json", '{"name": "caf\xe9"}'.encode("latin-1"))
        files["empty"] = self._write("empty.json", "")
        files["missing"] = self.root / "missing.json"
        files["folder"] = self.folder
        return files

    def toml_scenarios(self) -> dict[str, Path]:
        head = 'description = "hostile"\n'
        tail = '\n[expect]\noutcome = "error"\nerror_type = "ConfigError"\n'
        bodies = {
            "big-int": f"[run]\nrequests = {BIG_INT}",
            "21-digit-int": f"[run]\nseed = {LONG_INT}",
            "deep-array": f"[run]\nprompt_words = {'[' * 3000}{']' * 3000}",
            "nested-65": "[config]\ncompilation_config = " + "{a = " * 65 + "1" + "}" * 65,
            "nan": "[run]\natol = nan",
            "inf": "[run]\natol = inf",
            "profile-A9": '[device]\nprofile = "A9"',
            "optimization-level-7": "[config]\noptimization_level = 7",
            "cudagraph-mode-5": "[config]\ncompilation_config = {cudagraph_mode = 5}",
            "static-kernel-yes": '[config]\nadditional_config = {ascend_compilation_config = {enable_static_kernel = "yes"}}',
            "seed-negative": "[run]\nseed = -1",
            "requests-absurd": "[run]\nrequests = 100000000000",
            "prompt-words-1e9": "[run]\nprompt_words = [1, 1000000000]",
            "output-tokens-1e9": "[run]\noutput_tokens = [1, 1000000000]",
            "atol-1e9": "[run]\natol = 1e9",
            "num-threads-0": "[run]\nnum_threads = 0",
            "enforce-eager-yes": '[config]\nenforce_eager = "yes"',
            "json-flag-big-int": f"[config]\ncompilation_config = '{{\"level\": {BIG_INT}}}'",
            "json-flag-nan": "[config]\ncompilation_config = '{\"a\": NaN}'",
            "faults-superscript": '[device]\nfaults = "capture_begin=²*off->raise(207008)"',
            "faults-delay-inf": '[device]\nfaults = "replay=delay(inf)"',
            "model-missing": '[config]\nmodel = "no/such/model/config.json"',
            "unknown-key": "[run]\nrequets = 4",
            "not-toml": "[run\nrequests = 4",
        }
        files = {name: self._write(f"scenario-{name}.toml", head + body + tail) for name, body in bodies.items()}
        files["binary"] = self._write("scenario-binary.toml", bytes(range(256)) * 4)
        files["nul-filled"] = self._write("scenario-nul.toml", b"\x00" * 4096)
        files["missing"] = self.root / "missing.toml"
        return files

    def logs(self) -> dict[str, Path]:
        return {
            "nul-filled": self._write("nul.log", b"\x00" * 100_000),
            "binary": self._write("binary.log", bytes(range(256)) * 512),
            "missing": self.root / "missing.log",
            "folder": self.folder,
        }

    def workloads(self) -> dict[str, Path]:
        return {
            "big-int": self._write("wl-big.txt", BIG_INT + "\n"),
            "21-digits": self._write("wl-21.txt", LONG_INT + "\n"),
            "superscript": self._write("wl-sup.txt", "²\n"),
            "arabic": self._write("wl-arabic.txt", "١٢\n"),
            "negative": self._write("wl-neg.txt", "-4\n"),
            "binary": self._write("wl-binary.txt", bytes(range(256)) * 4),
            "nul-filled": self._write("wl-nul.txt", b"\x00" * 4096),
            "empty": self._write("wl-empty.txt", "# nothing\n"),
            "missing": self.root / "missing.txt",
        }


def _pick(table: dict[str, str], full: bool, count: int, offset: int) -> dict[str, str]:
    """All of ``table`` (full profile), or ``count`` of its entries starting at ``offset``
    (rotating, so that across the flags of a command every entry is used)."""
    if full or count >= len(table):
        return dict(table)
    names = list(table)
    chosen = [names[(offset + i) % len(names)] for i in range(count)]
    return {name: table[name] for name in chosen}


PASTE_COMMANDS = (("explain",), ("plan",), ("run",))


def cli_cases(files: CorpusFiles, *, full: bool = False) -> list[Case]:
    """Every hostile command line of the corpus. The default profile takes every hostile value
    at least once per reader and every flag of every command at least once; ``full`` (the
    `slow` profile) takes every value at every place."""
    cases: list[Case] = []
    commands = _commands()
    json_commands = {path for path, options in commands.items() if "--json" in options}
    rotation = 0

    def add(case_id: str, command: tuple[str, ...], *extra: str) -> None:
        cases.append(Case(case_id, (*_base(command, files), *extra), json_flag=command in json_commands))

    def pick(table: dict[str, str], count: int, *, everything: bool = False) -> dict[str, str]:
        nonlocal rotation
        rotation += count
        return _pick(table, full or everything, count, rotation - count)

    # 1. Every count flag of every command, with hostile integer texts.
    for path, action in _walk(build_parser(), ()):
        if not _is_count_flag(action):
            continue
        flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") else action.option_strings[0]
        for name, text in pick(HOSTILE_INTS, 2).items():
            add(f"{' '.join(path)}:{flag}={name}", path, f"{flag}={text}")
    # 2. JSON flags, given directly and in a pasted vllm serve line (explain: every value).
    for path, options in commands.items():
        for flag in JSON_FLAGS:
            if flag not in options:
                continue
            for name, text in pick(HOSTILE_JSON, 4, everything=path == ("explain",)).items():
                add(f"{' '.join(path)}:{flag}={name}", path, f"{flag}={text}")
            if path in PASTE_COMMANDS:
                for name, text in pick(HOSTILE_JSON, 3, everything=path == ("explain",)).items():
                    add(f"{' '.join(path)}:pasted {flag}={name}", path, "--", "vllm", "serve", "tiny", flag, text)
    # 3. Dotted options and -O in a pasted line; -O and --atol directly; conflicts.
    dotted = {"big-int": BIG_INT, "21-digits": LONG_INT, "nan": "NaN", "deep": DEEP_LIST, "infinity": "Infinity"}
    for path in PASTE_COMMANDS:
        everything = path == ("explain",)
        for name, text in pick(dotted, 2, everything=everything).items():
            add(f"{path[0]}:pasted -cc.level={name}", path, "--", "vllm", "serve", "tiny", f"-cc.level={text}")
            add(f"{path[0]}:pasted -O.mode={name}", path, "--", "vllm", "serve", "tiny", f"-O.mode={text}")
        for name, text in pick(HOSTILE_LEVELS, 2, everything=everything).items():
            add(f"{path[0]}:-O={name}", path, f"-O{text}")
            add(f"{path[0]}:pasted -O={name}", path, "--", "vllm", "serve", "tiny", "-O", text)
        for before, pasted in ((("-O3",), ("-O0",)), (("-tp", "2"), ("-tp", "4")),
                               (("--max-num-seqs", "8"), ("--max-num-seqs", "16")),
                               (("--block-size", "64"), ("--block-size", "128"))):
            add(f"{path[0]}:conflict {before[0]}", path, *before, "--", "vllm", "serve", "tiny", *pasted)
    for path in (("run",), ("profile",)):
        everything = path == ("run",)
        for name, text in pick(HOSTILE_ATOL, 3, everything=everything).items():
            add(f"{path[0]}:--atol={name}", path, f"--atol={text}")
        for name, text in pick(HOSTILE_FAULTS, 4, everything=everything).items():
            add(f"{path[0]}:--faults={name}", path, "--faults", text)
    # 4. File readers: --model config.json, --sim-profile, scenario files, logs, plan --workload.
    json_files = {name: str(path) for name, path in files.json_files().items()}
    model_files = {name: path for name, path in json_files.items() if name != "folder"}
    for path, options in commands.items():
        if "--model" in options:
            for name, file in pick(model_files, 4, everything=path == ("explain",)).items():
                add(f"{' '.join(path)}:--model {name}", path, "--model", file)
        if "--sim-profile" in options:
            for name, file in pick(json_files, 4, everything=path == ("plan",)).items():
                add(f"{' '.join(path)}:--sim-profile {name}", path, "--sim-profile", file)
    for name, file in files.toml_scenarios().items():
        add(f"scenario run:{name}", ("scenario", "run"), str(file))
        add(f"scenario list:{name}", ("scenario", "list"), str(file))
    for name, file in files.logs().items():
        cases.append(Case(f"diagnose:{name}", ("diagnose", str(file)), json_flag=True))
    for name, file in files.workloads().items():
        add(f"plan:--workload {name}", ("plan",), "--workload", str(file))
    # 5. Unknown flags, commands and values close to real ones.
    for path, options in commands.items():
        add(f"{' '.join(path)}:unknown flag", path, "--definitely-not-a-flag")
        for option in sorted(o for o in options if o.startswith("--") and o not in ("--json", "--help"))[:2]:
            add(f"{' '.join(path)}:misspelt {option}", path, option[:-1] + "x" + option[-1:])
    cases.append(Case("unknown command", ("explian",)))
    cases.append(Case("empty pasted line", ("explain", "--")))
    cases.append(Case("pasted line of another program", ("explain", "--", "python", "serve.py")))
    return cases


def json_document(stdout: str) -> dict:
    """The one strict JSON document on stdout (NaN/Infinity refused)."""

    def refuse(constant: str) -> float:
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(stdout, parse_constant=refuse)


ApiCall = Callable[[], object]
