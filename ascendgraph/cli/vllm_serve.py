"""Pasted ``vllm serve`` command lines: ``ascendgraph explain -- vllm serve MODEL --flag ...``.

Theory of operation. Users debug with a real command line in hand. Everything after ``--``
is read as a ``vllm serve`` invocation and translated into ascendgraph's own flags:
flags ascendgraph models are used (`MODELLED_FLAGS`), real vLLM 0.32 flags it does not
model are collected and reported once as ignored, anything else is an error that suggests
the closest real flag. vLLM's spellings are honoured: ``--flag value``, ``--flag=value``,
``-O3`` / ``-O 3`` / ``--optimization-level 3``, and dotted keys into the JSON configs
(``-cc.cudagraph_mode=FULL``, ``--compilation-config.cudagraph_capture_sizes "[1,2]"``,
``-O.mode=3``, ``--additional-config.xlite_graph_config '{"enabled": true}'``).
Environment assignments before ``vllm`` (``ASCEND_LAUNCH_BLOCKING=1 vllm serve ...``) are
the environment of that configuration: the command resolves (and runs) with the process
environment plus these (`PastedCommand.env`); HCCL_OP_EXPANSION_MODE also becomes its flag.
The model argument selects a preset by name or architecture, else a local config.json;
anything else that is clearly a path must exist, and a Hugging Face id falls back to tiny.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from ascendgraph.config import parse_json_argument
from ascendgraph.errors import ConfigError
from ascendgraph.readers import MAX_NESTING, load_json_or_text, shown
from ascendgraph.models.backends import ATTENTION_BACKENDS
from ascendgraph.models.presets import PRESETS, local_config_path, preset_for_architecture
from ascendgraph.cli.vllm_flags import VLLM_FLAGS, VLLM_FLAGS_WITH_VALUE, VLLM_SWITCHES, VLLM_VERSION

__all__ = ["PASTE_COMMANDS", "PastedCommand", "translate_vllm_command", "resolve_model_argument", "dashed",
           "normalize_spellings"]

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
    env: dict[str, str] = field(default_factory=dict)  # assignments before `vllm serve`


def looks_like_path(model: str) -> bool:
    """A model argument that can only mean a local file or folder (not a Hugging Face id)."""
    return model.startswith(("/", "./", "../", "~")) or model in (".", "..") or model.endswith(".json")


def resolve_model_argument(model: str) -> tuple[str, Optional[str]]:
    """A `--model` value for a vLLM model argument, and a note when falling back to tiny.

    Order (a path is a path, as vLLM reads it): a local ``config.json`` (file or folder) that
    exists; a value that is clearly a path (``/``, ``./``, ``../``, ``~``, ``*.json``) but names
    no config.json is a ConfigError, even when its last part looks like a preset name
    (``/models/Qwen3-0.6B``); then a preset named like the model (``Qwen/Qwen3-0.6B`` ->
    ``qwen3-0.6b``); a preset whose architecture is the argument; else (a Hugging Face id)
    ``tiny`` with a warning.
    """
    config = local_config_path(model)
    if config is not None:
        return os.path.expanduser(model), None
    if looks_like_path(model):
        local = os.path.expanduser(model)
        what = "has no config.json" if os.path.isdir(local) else "does not exist"
        raise ConfigError(
            f"model path {model!r} {what}; pass an existing config.json (file or folder), a preset "
            f"({', '.join(PRESETS)}) or a Hugging Face id", key="model",
        )
    base = model.rstrip("/").rsplit("/", 1)[-1].lower()
    if base in PRESETS:
        return base, None
    by_architecture = preset_for_architecture(model)
    if by_architecture:
        return by_architecture, None
    return "tiny", (
        f"model {model!r} is not a preset ({', '.join(PRESETS)}), an architecture name or a local "
        "config.json: using the tiny preset (Qwen3ForCausalLM); pass the model's config.json folder to "
        "use its dimensions"
    )


# A shell variable name (POSIX, as bash takes it in an assignment): ASCII letters, digits, underscore.
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _looks_like_flag(token: str) -> bool:
    """A token that is a flag, not a value (``-1`` and ``-0.5`` are values)."""
    return token.startswith("-") and len(token) > 1 and not _NUMBER.match(token)


def _value_after(flag: str, rest: Sequence[str], index: int, what: str = "a value") -> str:
    """The value of ``flag`` at ``rest[index]``; a missing one (or the next flag) is an error."""
    if index >= len(rest) or _looks_like_flag(rest[index]):
        following = f" (got the flag {rest[index]!r} instead)" if index < len(rest) else ""
        raise ConfigError(f"vllm serve flag {flag} needs {what}{following}", key=flag)
    return rest[index]


def _json_object(flag: str, value: str) -> dict[str, Any]:
    """A JSON-object flag's value; bad JSON gets the same hint as the flag given directly."""
    if not value.strip():
        raise ConfigError(f"{flag} is empty; pass a JSON object such as '{{}}'", key=flag)
    return parse_json_argument(flag, value)


def _json_value(text: str, flag: str) -> Any:
    return load_json_or_text(text, flag, key=flag)


def _set_dotted(target: dict[str, Any], dotted: str, value: Any, flag: str) -> None:
    if dotted.count(".") >= MAX_NESTING:
        raise ConfigError(f"{shown(flag)[:40]}...: a dotted key more than {MAX_NESTING} levels deep", key=flag)
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


def dashed(flag: str) -> str:
    """A long flag's name with underscores as dashes, up to the first dot, as vLLM's parser reads
    it (``--max_num_seqs=8`` -> ``--max-num-seqs=8``, ``--compilation_config.cudagraph_mode``
    -> ``--compilation-config.cudagraph_mode``); anything else unchanged."""
    if not flag.startswith("--"):
        return flag
    name, dot, rest = flag[2:].partition(".")
    return "--" + name.replace("_", "-") + dot + rest


def normalize_spellings(tokens: Sequence[str], known: Callable[[str], bool]) -> list[str]:
    """ascendgraph's own flags in every spelling vLLM's parser accepts, rewritten to the one
    argparse knows: underscores in a long name (``--max_num_seqs``) become dashes when the
    dashed flag is ``known``, and dotted keys of the JSON flags (``-cc.cudagraph_mode=FULL``,
    ``--compilation-config.cudagraph_capture_sizes "[1,2]"``, ``-sc.num_speculative_tokens 1``)
    merge into that flag's JSON, over a JSON value given whole. ``-O3``, ``-O=3`` and
    ``--no-enforce-eager`` need no rewriting (argparse reads them as they are)."""
    out: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if not token.startswith("-") or _NUMBER.match(token):
            out.append(token)
            continue
        name, has_inline, inline = token.partition("=")
        if dashed(name) != name and known(dashed(name).partition(".")[0]):
            name = dashed(name)
        base, dot, keys = name.partition(".")
        target = JSON_FLAGS.get(base) if base != "-O" else None
        if dot and target is not None and known(target):
            if not has_inline:
                inline = _value_after(name, tokens, index)
                index += 1
            _set_dotted(dotted.setdefault(target, {}), keys, _json_value(inline, name), name)
            continue
        out.append(name + (has_inline + inline if has_inline else ""))
    if not dotted:
        return out
    # A JSON flag given whole and key by key: one value, the keys over the whole (as vLLM merges).
    merged_out: list[str] = []
    index = 0
    while index < len(out):
        name, has_inline, inline = out[index].partition("=")
        target = JSON_FLAGS.get(name) if name != "-O" else None
        if target in dotted:
            text = inline if has_inline else (out[index + 1] if index + 1 < len(out) else "")
            index += 1 if has_inline else 2
            base_value = _json_object(name, text)
            for key, item in dotted[target].items():
                if isinstance(item, dict) and isinstance(base_value.get(key), dict):
                    base_value[key] = {**base_value[key], **item}
                else:
                    base_value[key] = item
            dotted[target] = base_value
            continue
        merged_out.append(out[index])
        index += 1
    for target, value in dotted.items():
        merged_out += [target, json.dumps(value)]
    return merged_out


def _closest(flag: str) -> str:
    close = difflib.get_close_matches(flag, sorted(VLLM_FLAGS), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _split_env(tokens: list[str]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    index = 0
    while index < len(tokens) and "=" in tokens[index] and not tokens[index].startswith("-"):
        name, _, value = tokens[index].partition("=")
        if not _SHELL_NAME.fullmatch(name):
            odd = next((char for char in name if not (char.isascii() and (char.isalnum() or char == "_"))), None)
            if name.isidentifier() and odd is not None:
                raise ConfigError(
                    f"{shown(name)}={shown(value)} is not an environment assignment: {odd!r} (U+{ord(odd):04X}) "
                    "is not an ASCII letter, digit or underscore, so a shell runs it as a command; "
                    "retype the variable name", key="--")
            break
        env[name] = value
        index += 1
    return env, tokens[index:]


def _unknown_flag(flag: str, own_flag: Callable[[str], bool]) -> ConfigError:
    if own_flag(flag):
        return ConfigError(f"{flag} is an ascendgraph flag, not a vllm serve flag: put it before --", key=flag)
    return ConfigError(f"unknown vllm serve flag {flag!r} (not a vLLM {VLLM_VERSION} option){_closest(flag)}", key=flag)


def translate_vllm_command(
    tokens: Sequence[str],
    *,
    accepts: Callable[[str], bool] = lambda flag: True,
    own_flag: Callable[[str], bool] = lambda flag: False,
) -> PastedCommand:
    """Translate a ``vllm serve ...`` token list into ascendgraph flags.

    ``accepts(flag)`` says whether the target command takes an ascendgraph flag (e.g.
    ``--seed`` exists for ``run`` but not for ``explain``); flags it refuses are ignored.
    ``own_flag(flag)``: whether a flag that is not vLLM's is one of the target command's
    own (then the error says to put it before ``--``).
    """
    env, rest = _split_env(list(tokens))
    if rest[:2] != ["vllm", "serve"]:
        shown = " ".join(list(tokens)[:3])
        raise ConfigError(
            f"expected a `vllm serve MODEL ...` command line after --, got {shown!r}", key="--"
        )
    rest = rest[2:]
    result = PastedCommand(argv=[], env=dict(env))
    json_configs: dict[str, dict[str, Any]] = {}
    dotted_configs: dict[str, dict[str, Any]] = {}
    lora_enabled = False
    max_loras_given, max_loras_value = False, ""
    switches: dict[str, bool] = {}  # a modelled switch -> its last setting (--x / --no-x)

    for name, env_value in env.items():
        if name in ENV_FLAGS:
            result.argv += [ENV_FLAGS[name], env_value]

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
        flag = dashed(flag)
        # -O3, -O=3, -O 3: the optimisation level.
        if flag.startswith("-O") and not flag.startswith("-O.") and flag != "-O":
            level = flag[2:]
            add("-O", level)
            continue
        if flag == "-O" and has_inline:
            add("-O", inline)
            continue
        if flag == "-O" and not has_inline:
            add("-O", _value_after("-O", rest, index, "a level (0-3)"))
            index += 1
            continue
        base, dot, dotted = flag.partition(".")
        if dot:
            if base not in JSON_FLAGS:
                raise ConfigError(f"dotted option {flag!r}: only {', '.join(sorted(JSON_FLAGS))} take dotted keys",
                                  key=flag)
            if not has_inline:
                inline = _value_after(flag, rest, index)
                index += 1
            _set_dotted(dotted_configs.setdefault(JSON_FLAGS[base], {}), dotted, _json_value(inline, flag), flag)
            continue
        if flag not in VLLM_FLAGS:
            raise _unknown_flag(flag, own_flag)
        takes_value = flag in VLLM_FLAGS_WITH_VALUE
        value: Optional[str] = None
        if takes_value:
            if has_inline:
                value = inline
            else:
                value = _value_after(flag, rest, index)
                index += 1
        elif has_inline:
            raise ConfigError(f"vllm serve flag {flag} takes no value, got {token!r}", key=flag)

        if flag == "--model":
            result.model = value
        elif flag in JSON_FLAGS and flag != "-O":
            json_configs.setdefault(JSON_FLAGS[flag], {}).update(_json_object(flag, value or ""))
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
        elif flag == "--max-loras":
            max_loras_given, max_loras_value = True, value or ""
        elif flag in MODELLED_FLAGS:
            target = MODELLED_FLAGS[flag]
            if flag in VLLM_SWITCHES:
                switches[target] = True
            else:
                add(target, value or "")
        elif flag.startswith("--no-") and ("--" + flag[5:]) in MODELLED_FLAGS:
            switches[MODELLED_FLAGS["--" + flag[5:]]] = False  # vLLM's BooleanOptionalAction: the last one wins
        else:
            result.ignored.append(flag)

    for target, on in switches.items():
        negative = "--no-" + target[2:]
        if on:
            add(target)
        elif accepts(negative):
            add(negative)
        else:
            result.ignored.append(negative)
    # vLLM: --max-loras belongs to the LoRA config, which exists only with --enable-lora (max_loras >= 1).
    if lora_enabled:
        if max_loras_given and max_loras_value.strip() == "0":
            raise ConfigError("--max-loras 0 with --enable-lora: vLLM requires max_loras >= 1; "
                              "drop --enable-lora to serve without LoRA", key="--max-loras")
        add("--max-loras", max_loras_value if max_loras_given else "1")
    elif max_loras_given:
        result.notes.append("--max-loras has no effect without --enable-lora (as in vLLM): LoRA stays off")
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
