"""Every spelling vLLM 0.32's own parser accepts for a flag ascendgraph models, as data.

Run in the parity environment (``scripts/parity-env.sh``) to (re)write the data file the
default test run checks ascendgraph against (tests/unit/test_cli_flag_spellings.py)::

    "$(scripts/parity-env.sh | tail -n 1)" tests/parity/vllm_flag_spellings.py --write

How the spellings are found: vLLM's `EngineArgs.add_cli_args` builds its `vllm serve` engine
flags on a `FlexibleArgumentParser`. For each modelled destination we take the option
strings vLLM declares for it and try the spellings vLLM documents for its parser: ``--flag
V``, ``--flag=V``, underscores for dashes, the short aliases (``-tp 2``, ``-tp=2``),
``-O3`` / ``-O 3`` / ``-O=3``, ``--no-`` negations of boolean flags, and dotted keys into the
JSON flags (``--compilation-config.cudagraph_mode=FULL``, ``-cc.cudagraph_mode FULL``). A
spelling is kept when vLLM's parser accepts it and gives the same value as the canonical
spelling. The parity test (test_parity_flag_spellings.py) regenerates the list and fails
when the data file is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterator

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "vllm_flag_spellings.json"

# Modelled destinations -> a sample value (accepted by ascendgraph, different from its default).
SAMPLES: dict[str, str] = {
    "max_num_seqs": "8",
    "max_num_batched_tokens": "4096",
    "tensor_parallel_size": "2",
    "data_parallel_size": "2",
    "pipeline_parallel_size": "2",
    "prefill_context_parallel_size": "2",
    "decode_context_parallel_size": "2",
    "block_size": "256",
    "max_loras": "2",
    "performance_mode": "throughput",
    "optimization_level": "3",
    "seed": "3",
    "speculative_config": '{"num_speculative_tokens": 1}',
    "compilation_config": '{"cudagraph_mode": "FULL_DECODE_ONLY"}',
    "additional_config": '{"xlite_graph_config": {"enabled": true}}',
}
SWITCHES = ("enforce_eager", "enable_expert_parallel")
# Value forms tried on every integer destination: what vLLM's parser makes of each (its
# human-readable counts, leading zeros, underscores, signs, floats), or that it refuses it.
INT_DESTS = ("max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size", "data_parallel_size",
             "pipeline_parallel_size", "prefill_context_parallel_size", "decode_context_parallel_size",
             "block_size", "max_loras", "seed")
VALUE_FORMS = ("8", "08", "1_000", "8k", "8K", "1.5k", "0.5k", "1.2345k", "2M", "1m", "1g", "1G",
               "1.5K", "8kb", "8 k", "+8k", "1e3", "1.5", "0x10", "0k", "-1", "0")
# Dotted keys of the JSON flags: (destination, dotted key, value).
DOTTED = (
    ("compilation_config", "cudagraph_mode", "FULL_DECODE_ONLY"),
    ("additional_config", "xlite_graph_config.enabled", "true"),
    ("speculative_config", "num_speculative_tokens", "1"),
)


def _underscored(flag: str) -> str:
    return "--" + flag[2:].replace("-", "_")


def _long_forms(flag: str, value: str) -> Iterator[list[str]]:
    for name in dict.fromkeys([flag, _underscored(flag)]):
        yield [name, value]
        yield [f"{name}={value}"]


def candidates(option_strings: dict[str, list[str]]) -> Iterator[tuple[str, list[str], list[str]]]:
    """(destination, canonical tokens, candidate tokens) for every spelling worth trying."""
    for dest, value in SAMPLES.items():
        options = option_strings.get(dest, [])
        if not options:
            continue
        canonical = [options[0], value]
        for option in options:
            if option.startswith("--"):
                yield from ((dest, canonical, tokens) for tokens in _long_forms(option, value))
            else:
                yield dest, canonical, [option, value]
                yield dest, canonical, [f"{option}={value}"]
        if dest == "optimization_level":
            for tokens in (["-O" + value], ["-O", value], [f"-O={value}"]):
                yield dest, canonical, tokens
    for dest in SWITCHES:
        options = option_strings.get(dest, [])
        if not options:
            continue
        positive = [o for o in options if o.startswith("--") and not o.startswith("--no-")][0]
        negative = [o for o in options if o.startswith("--no-")]
        for option in options:
            if option.startswith("--no-"):
                continue
            for name in dict.fromkeys([option, _underscored(option) if option.startswith("--") else option]):
                yield dest, [positive], [name]
        for option in negative:
            for name in dict.fromkeys([option, _underscored(option)]):
                yield dest, [option], [name]
    for dest, key, value in DOTTED:
        options = option_strings.get(dest, [])
        if not options:
            continue
        nested: Any = json.loads(value) if value in ("true", "false") or value.isdigit() else value
        for part in reversed(key.split(".")):
            nested = {part: nested}
        canonical = [options[0], json.dumps(nested)]
        for option in options:
            names = [option] + ([_underscored(option)] if option.startswith("--") else [])
            for name in dict.fromkeys(names):
                yield dest, canonical, [f"{name}.{key}={value}"]
                yield dest, canonical, [f"{name}.{key}", value]


def _comparable(value: Any) -> Any:
    for attr in ("model_dump", "to_dict"):  # vLLM config objects
        method = getattr(value, attr, None)
        if callable(method):
            try:
                return _comparable(method())
            except TypeError:
                pass
    if hasattr(value, "__dataclass_fields__"):
        import dataclasses

        return _comparable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _comparable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_comparable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def vllm_parser() -> argparse.ArgumentParser:
    """vLLM 0.32's engine-argument parser (what `vllm serve` parses its flags with)."""
    from vllm import platforms

    if not getattr(platforms.current_platform, "device_type", ""):
        platforms.current_platform.device_type = "cpu"  # no accelerator here: only the parser is needed
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    return parser


def _parse(parser: argparse.ArgumentParser, tokens: list[str], dest: str) -> tuple[bool, Any]:
    try:
        namespace = parser.parse_args(tokens)
    except (SystemExit, Exception):  # noqa: BLE001 - a refused spelling is data, not an error
        return False, None
    return True, _comparable(getattr(namespace, dest))


def generate() -> dict[str, Any]:
    """The document written to tests/data/vllm_flag_spellings.json."""
    import vllm

    parser = vllm_parser()
    option_strings: dict[str, list[str]] = {}
    for action in parser._actions:  # vLLM's parser: reading its declared option strings is the point
        if action.dest in SAMPLES or action.dest in SWITCHES or action.dest in INT_DESTS:
            option_strings[action.dest] = list(action.option_strings)
    spellings, refused = [], []
    for dest, canonical, tokens in candidates(option_strings):
        ok_canonical, expected = _parse(parser, canonical, dest)
        ok, value = _parse(parser, tokens, dest)
        entry = {"dest": dest, "canonical": canonical, "tokens": tokens}
        if ok_canonical and ok and value == expected:
            spellings.append(entry)
        else:
            refused.append(entry)
    values: dict[str, dict[str, Any]] = {}
    for dest in INT_DESTS:
        options = option_strings.get(dest) or []
        if not options:
            continue
        values[dest] = {}
        for form in VALUE_FORMS:
            ok, value = _parse(parser, [options[0], form], dest)
            values[dest][form] = value if ok else None
    return {
        "vllm_version": vllm.__version__,
        "generated_by": "tests/parity/vllm_flag_spellings.py (in the parity environment)",
        "option_strings": option_strings,
        "spellings": spellings,
        "refused_by_vllm": refused,
        "int_values": values,
    }


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1) + "\n"


def main(argv: list[str]) -> int:
    text = render(generate())
    if "--write" in argv:
        DATA_FILE.write_text(text, encoding="utf-8")
        print(f"wrote {DATA_FILE}", file=sys.stderr)
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
