"""Pasted ``vllm serve`` command lines: ``ascendgraph explain -- vllm serve MODEL --flag ...``.

Theory of operation. Users debug with a real command line in hand. Everything after ``--``
is read as a ``vllm serve`` invocation and translated into ascendgraph's own flags:
flags ascendgraph models are used (`MODELLED_FLAGS`), real vLLM 0.32 flags it does not
model are collected and reported once as ignored, anything else is an error that suggests
the closest real flag. vLLM's spellings are honoured: ``--flag value``, ``--flag=value``,
``-O3`` / ``-O 3`` / ``--optimization-level 3``, and dotted keys into the JSON configs
(``-cc.cudagraph_mode=FULL``, ``--compilation-config.cudagraph_capture_sizes "[1,2]"``,
``-O.mode=3``, ``--additional-config.xlite_graph_config '{"enabled": true}'``).
Environment assignments before ``vllm`` (``HCCL_OP_EXPANSION_MODE=AIV vllm serve ...``)
are honoured for the variables ascendgraph reads as flags.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from ascendgraph.errors import ConfigError
from ascendgraph.models.backends import ATTENTION_BACKENDS
from ascendgraph.models.presets import PRESETS, preset_for_architecture
from ascendgraph.vllm_flags import VLLM_FLAGS, VLLM_FLAGS_WITH_VALUE, VLLM_SWITCHES, VLLM_VERSION

__all__ = ["PASTE_COMMANDS", "PastedCommand", "translate_vllm_command", "resolve_model_argument"]

PASTE_COMMANDS = ("explain", "run", "plan")

# vLLM flag -> ascendgraph flag (same value). Aliases map to the same target.
MODELLED_FLAGS: dict[str, str] = {
    "--max-num-seqs": "--max-num-seqs",
    "--max-num-batched-tokens": "--max-num-batched-tokens",
    "--tensor-parallel-size": "--tensor-parallel-size",
    "-tp": "--tensor-parallel-size",
    "--data-parallel-size": "--data-parallel-size",
    "-dp": "--data-parallel-size",
    "--pipeline-parallel-size": "--pipeline-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "--prefill-context-parallel-size": "--prefill-context-parallel-size",
    "-pcp": "--prefill-context-parallel-size",
    "--decode-context-parallel-size": "--decode-context-parallel-size",
    "-dcp": "--decode-context-parallel-size",
    "--enable-expert-parallel": "--enable-expert-parallel",
    "-ep": "--enable-expert-parallel",
    "--enforce-eager": "--enforce-eager",
    "--block-size": "--block-size",
    "--max-loras": "--max-loras",
    "--performance-mode": "--performance-mode",
    "--optimization-level": "-O",
    "--speculative-config": "--speculative-config",
    "-sc": "--speculative-config",
    "--seed": "--seed",
}
# JSON-valued flags that may also be given key by key (dotted).
JSON_FLAGS: dict[str, str] = {
    "--compilation-config": "--compilation-config",
    "-cc": "--compilation-config",
    "-O": "--compilation-config",  # -O.key=value is compilation config shorthand
    "--additional-config": "--additional-config",
    "--speculative-config": "--speculative-config",
    "-sc": "--speculative-config",
}
# Flags whose value needs translating; each returns (ascendgraph argv, note or None).
_DTYPES = {"bfloat16": "bfloat16", "float32": "float32", "float": "float32"}
ENV_FLAGS = {"HCCL_OP_EXPANSION_MODE": "--hccl-op-expansion-mode"}


@dataclass
class PastedCommand:
    """The translation of a pasted command line."""

    argv: list[str]
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    model: Optional[str] = None


def resolve_model_argument(model: str) -> tuple[str, Optional[str]]:
    """A `--model` value for a vLLM model argument, and a note when falling back to tiny.

    Order: a preset named like the model (``Qwen/Qwen3-0.6B`` -> ``qwen3-0.6b``); a preset
    whose architecture is the argument; a local ``config.json`` (file or folder); else
    ``tiny`` with a warning.
    """
    base = model.rstrip("/").rsplit("/", 1)[-1].lower()
    if base in PRESETS:
        return base, None
    by_architecture = preset_for_architecture(model)
    if by_architecture:
        return by_architecture, None
    candidate = os.path.join(model, "config.json") if os.path.isdir(model) else model
    if os.path.isfile(candidate):
        return model, None
    return "tiny", (
        f"model {model!r} is not a preset ({', '.join(PRESETS)}), an architecture name or a local "
        "config.json: using the tiny preset (Qwen3ForCausalLM); pass the model's config.json folder to "
        "use its dimensions"
    )


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _set_dotted(target: dict[str, Any], dotted: str, value: Any, flag: str) -> None:
    keys = [k for k in dotted.split(".") if k]
    if not keys:
        raise ConfigError(f"{flag}: empty key in a dotted option", key=flag)
    node = target
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{flag}.{dotted}: {key!r} already holds a value, not an object", key=flag)
        node = child
    node[keys[-1]] = value


def _closest(flag: str) -> str:
    close = difflib.get_close_matches(flag, sorted(VLLM_FLAGS), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _split_env(tokens: list[str]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    index = 0
    while index < len(tokens) and "=" in tokens[index] and not tokens[index].startswith("-"):
        name, _, value = tokens[index].partition("=")
        if not name.isidentifier():
            break
        env[name] = value
        index += 1
    return env, tokens[index:]


def translate_vllm_command(
    tokens: Sequence[str], *, accepts: Callable[[str], bool] = lambda flag: True
) -> PastedCommand:
    """Translate a ``vllm serve ...`` token list into ascendgraph flags.

    ``accepts(flag)`` says whether the target command takes an ascendgraph flag (e.g.
    ``--seed`` exists for ``run`` but not for ``explain``); flags it refuses are ignored.
    """
    env, rest = _split_env(list(tokens))
    if rest[:2] != ["vllm", "serve"]:
        shown = " ".join(list(tokens)[:3])
        raise ConfigError(
            f"expected a `vllm serve MODEL ...` command line after --, got {shown!r}", key="--"
        )
    rest = rest[2:]
    result = PastedCommand(argv=[])
    json_configs: dict[str, dict[str, Any]] = {}
    dotted_configs: dict[str, dict[str, Any]] = {}
    lora_enabled = False
    max_loras_given = False

    for name, value in env.items():
        if name in ENV_FLAGS:
            result.argv += [ENV_FLAGS[name], value]
        else:
            result.notes.append(f"environment assignment {name}={value} in the pasted line is not applied; "
                                "export it in your shell if it matters")

    def add(flag: str, *values: str) -> None:
        if accepts(flag):
            result.argv.extend([flag, *values])
        else:
            result.ignored.append(flag if not values else f"{flag} {values[0]}")

    index = 0
    while index < len(rest):
        token = rest[index]
        index += 1
        if not token.startswith("-"):
            if result.model is not None:
                raise ConfigError(f"unexpected argument {token!r} in the pasted vllm serve line (the model is "
                                  f"already {result.model!r})", key="--")
            result.model = token
            continue
        flag, has_inline, inline = token.partition("=")
        # -O3, -O 3: the optimisation level.
        if flag.startswith("-O") and not flag.startswith("-O.") and flag != "-O":
            level = flag[2:]
            add("-O", level)
            continue
        if flag == "-O" and not has_inline:
            if index >= len(rest):
                raise ConfigError("-O needs a level (0-3)", key="-O")
            add("-O", rest[index])
            index += 1
            continue
        base, dot, dotted = flag.partition(".")
        if dot:
            if base not in JSON_FLAGS:
                raise ConfigError(f"dotted option {flag!r}: only {', '.join(sorted(JSON_FLAGS))} take dotted keys",
                                  key=flag)
            if not has_inline:
                if index >= len(rest):
                    raise ConfigError(f"{flag} needs a value", key=flag)
                inline = rest[index]
                index += 1
            _set_dotted(dotted_configs.setdefault(JSON_FLAGS[base], {}), dotted, _json_value(inline), flag)
            continue
        if flag not in VLLM_FLAGS:
            raise ConfigError(
                f"unknown vllm serve flag {flag!r} (not a vLLM {VLLM_VERSION} option){_closest(flag)}", key=flag
            )
        takes_value = flag in VLLM_FLAGS_WITH_VALUE
        value: Optional[str] = None
        if takes_value:
            if has_inline:
                value = inline
            else:
                if index >= len(rest):
                    raise ConfigError(f"vllm serve flag {flag} needs a value", key=flag)
                value = rest[index]
                index += 1
        elif has_inline:
            raise ConfigError(f"vllm serve flag {flag} takes no value, got {token!r}", key=flag)

        if flag == "--model":
            result.model = value
        elif flag in JSON_FLAGS and flag != "-O":
            target = JSON_FLAGS[flag]
            parsed = _json_value(value or "")
            if not isinstance(parsed, dict):
                raise ConfigError(f"{flag} must be a JSON object, got {value!r}", key=flag)
            json_configs.setdefault(target, {}).update(parsed)
        elif flag == "--dtype":
            dtype = _DTYPES.get((value or "").lower())
            if dtype is None:
                result.ignored.append(f"--dtype {value}")
            else:
                add("--dtype", dtype)
        elif flag == "--attention-backend":
            if value and value.lower() in ATTENTION_BACKENDS:
                add("--attention-backend", value.lower())
            else:
                result.ignored.append(f"--attention-backend {value}")
        elif flag == "--enable-lora":
            lora_enabled = True
        elif flag in MODELLED_FLAGS:
            if flag == "--max-loras":
                max_loras_given = True
            target = MODELLED_FLAGS[flag]
            if flag in VLLM_SWITCHES:
                add(target)
            else:
                add(target, value or "")
        elif flag.startswith("--no-") and ("--" + flag[5:]) in MODELLED_FLAGS:
            pass  # the negative of a modelled switch is its default
        else:
            result.ignored.append(flag)

    if lora_enabled and not max_loras_given:
        add("--max-loras", "1")
    for target in sorted(set(json_configs) | set(dotted_configs)):
        merged = dict(json_configs.get(target, {}))
        for key, item in dotted_configs.get(target, {}).items():
            if isinstance(item, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **item}
            else:
                merged[key] = item
        add(target, json.dumps(merged))
    if result.model is not None:
        model, note = resolve_model_argument(result.model)
        add("--model", model)
        if note:
            result.notes.append(note)
    return result
