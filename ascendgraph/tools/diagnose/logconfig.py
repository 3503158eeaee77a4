"""The configuration a log prints (vLLM's args, vLLM Ascend's capture lines), collected
line by line."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from ascendgraph.errors import (
    ConfigError,
)
from ascendgraph.modes import GraphMode
from ascendgraph.readers import MAX_INT_DIGITS
from ascendgraph.tools.diagnose.classes import LogLine


# --------------------------------------------------------------------------- configuration


@dataclass
class LogConfig:
    """The graph-mode configuration a log shows; ``sources`` gives the line of each value."""

    cudagraph_mode: Optional[str] = None
    capture_sizes: Optional[list[int]] = None
    captured_cases: list[int] = field(default_factory=list)
    captured_phases: list[str] = field(default_factory=list)  # runtime modes seen capturing: FULL, PIECEWISE
    decode_only_full: bool = True
    num_hidden_layers: Optional[int] = None
    tensor_parallel_size: Optional[int] = None
    data_parallel_size: Optional[int] = None
    prefill_context_parallel_size: Optional[int] = None
    decode_context_parallel_size: Optional[int] = None
    max_num_seqs: Optional[int] = None
    enable_expert_parallel: Optional[bool] = None
    enforce_eager: Optional[bool] = None
    hccl_op_expansion_mode: Optional[str] = None
    architecture: Optional[str] = None
    sources: dict[str, int] = field(default_factory=dict)

    def copy(self) -> "LogConfig":
        return LogConfig(**{**self.__dict__, "captured_cases": list(self.captured_cases),
                            "captured_phases": list(self.captured_phases), "sources": dict(self.sources)})

    def set(self, name: str, value: Any, line: int) -> None:
        setattr(self, name, value)
        self.sources[name] = line

    @property
    def sizes(self) -> list[int]:
        """The configured sizes, else the sizes the log shows being captured."""
        if self.capture_sizes:
            return sorted(set(self.capture_sizes))
        return sorted(set(self.captured_cases))

    def mode(self) -> tuple[Optional[GraphMode], str]:
        """The graph mode and where it came from ("log", "capture lines", "assumed")."""
        if self.cudagraph_mode:
            try:
                return GraphMode.parse(self.cudagraph_mode), "log"
            except ConfigError:
                pass
        phases = set(self.captured_phases)
        if phases == {"PIECEWISE"}:
            return GraphMode.PIECEWISE, "capture lines"
        if phases == {"FULL", "PIECEWISE"}:
            return GraphMode.FULL_AND_PIECEWISE, "capture lines"
        if phases == {"FULL"}:
            return (GraphMode.FULL_DECODE_ONLY if self.decode_only_full else GraphMode.FULL), "capture lines"
        return None, "not in the log"

    @property
    def is_moe(self) -> bool:
        return bool(self.architecture and "moe" in self.architecture.lower())

    def as_dict(self) -> dict[str, Any]:
        mode, mode_source = self.mode()
        return {
            "cudagraph_mode": mode.name if mode else None,
            "cudagraph_mode_source": mode_source,
            "capture_sizes": self.sizes or None,
            "num_hidden_layers": self.num_hidden_layers,
            "tensor_parallel_size": self.tensor_parallel_size,
            "data_parallel_size": self.data_parallel_size,
            "prefill_context_parallel_size": self.prefill_context_parallel_size,
            "decode_context_parallel_size": self.decode_context_parallel_size,
            "max_num_seqs": self.max_num_seqs,
            "enable_expert_parallel": self.enable_expert_parallel,
            "enforce_eager": self.enforce_eager,
            "hccl_op_expansion_mode": self.hccl_op_expansion_mode,
            "architecture": self.architecture,
            "sources": dict(self.sources),
        }


_CONFIG_PREFILTER = re.compile(r"cudagraph|parallel|layers|hccl_op_expansion_mode|ffts\+|eager|architecture"
                               r"|captur|num_seqs|num-seqs|-tp|-dp|-pcp|-dcp")
_Q = r"""['"]?"""
_SIZES = re.compile(rf"(?<![\w]){_Q}cudagraph_capture_sizes{_Q}\s*[:=]\s*\[([\d,\s]*)\]")
_MODE = re.compile(
    rf"(?<![\w]){_Q}cudagraph_mode{_Q}\s*[:=]\s*"
    r"(?:<CUDAGraphMode\.(?P<enum>\w+)[^>]*>|[\[(]\s*(?P<a>\d)\s*,\s*(?P<b>\d)\s*[\])]"
    r"|['\"]?(?:CUDAGraphMode\.)?(?P<word>[A-Za-z_]+|\d)['\"]?)"
)
_INT_KEYS = ("tensor_parallel_size", "data_parallel_size", "prefill_context_parallel_size",
             "decode_context_parallel_size", "num_hidden_layers", "max_num_seqs")
_INT_VALUE = re.compile(rf"(?<![\w]){_Q}({'|'.join(_INT_KEYS)}){_Q}\s*[:=]\s*['\"]?(\d+)")
_INT_FLAG = re.compile(
    r"(?<!\S)--(tensor-parallel-size|data-parallel-size|prefill-context-parallel-size|"
    r"decode-context-parallel-size|max-num-seqs)(?:=|\s+)(\d+)"
)
_SHORT_FLAG = re.compile(r"(?<!\S)-(tp|dp|pcp|dcp)(?:=|\s+)(\d+)")
_SHORT_FLAGS = {"tp": "tensor_parallel_size", "dp": "data_parallel_size",
                "pcp": "prefill_context_parallel_size", "dcp": "decode_context_parallel_size"}
_LAYERS_NOTE = re.compile(r"\(layers:\s*(\d+)\)")
_BOOL_VALUE = re.compile(rf"(?<![\w]){_Q}(enable_expert_parallel|enforce_eager){_Q}\s*[:=]\s*(True|False|true|false)")
# A flag on a pasted command line: followed by the line's end, a continuation backslash or another flag
# (not "re-run with --enforce-eager to ..." in prose).
_BOOL_FLAG = re.compile(r"(?<!\S)--(enable-expert-parallel|enforce-eager)(?=\s*\\?\s*$|\s+-)")
_ARCHITECTURE = re.compile(rf"{_Q}architectures{_Q}\s*[:=]\s*\[\s*['\"](\w+)['\"]|resolved architecture:\s*(\w+)",
                           re.IGNORECASE)
_HCCL = re.compile(r"HCCL_OP_EXPANSION_MODE['\"]?\s*[=:]\s*['\"]?([A-Za-z_+]+)")
_FFTS_WARNING = "communication is performed using ffts+"
_CASES = re.compile(r"starting to capture acl graphs for cases:\s*\[([\d,\s]*)\],\s*mode:\s*(\w+)"
                    r"(?:,\s*uniform_decode:\s*(true|false))?", re.IGNORECASE)
_CAPTURE_BAR = re.compile(r"capturing (?:cuda|acl|npu) graphs \((decode|mixed prefill-decode),\s*(\w+)\)",
                          re.IGNORECASE)


def _log_int(text: str) -> Optional[int]:
    """A number the log prints, when it is one: ASCII digits, at most MAX_INT_DIGITS of them
    (a longer one is corrupt text, not a setting, and is ignored)."""
    if not text.isascii() or not text.isdigit() or len(text) > MAX_INT_DIGITS:
        return None
    return int(text)


def _int_list(text: str) -> list[int]:
    values = [_log_int(v) for v in re.findall(r"[0-9]+", text)]
    return [] if None in values else [v for v in values if v is not None]


def _set_int(config: LogConfig, key: str, text: str, number: int) -> None:
    value = _log_int(text)
    if value is not None:
        config.set(key, value, number)


def _mode_name(match: "re.Match[str]") -> Optional[str]:
    if match.group("enum"):
        return match.group("enum")
    if match.group("a") is not None:
        try:
            member = GraphMode.from_pair(GraphMode(_log_int(match.group("a"))), GraphMode(_log_int(match.group("b"))))
        except ValueError:
            return None
        return member.name if member else None
    word = match.group("word")
    if word in ("None", "null"):  # a repr of "not set", not the mode NONE
        return None
    if word.isdigit():
        try:
            return GraphMode(_log_int(word)).name
        except ValueError:
            return None
    return word.upper()


def update_config(config: LogConfig, line: LogLine, lower: Optional[str] = None) -> None:
    """Take whatever graph-mode settings this line shows (later lines win)."""
    message = line.message
    lower = message.lower() if lower is None else lower
    if not _CONFIG_PREFILTER.search(lower):
        return
    number = line.number
    # Each pattern runs only when its key word is on the line: most lines carry none.
    if "cudagraph_capture_sizes" in lower:
        for match in _SIZES.finditer(message):
            sizes = _int_list(match.group(1))
            if sizes:
                config.set("capture_sizes", sizes, number)
    if "cudagraph_mode" in lower:
        for match in _MODE.finditer(message):
            name = _mode_name(match)
            if name:
                config.set("cudagraph_mode", name, number)
    if "_size" in lower or "num_hidden_layers" in lower or "max_num_seqs" in lower:
        for key, value in _INT_VALUE.findall(message):
            _set_int(config, key, value, number)
    if "-" in message:
        for flag, value in _INT_FLAG.findall(message):
            _set_int(config, flag.replace("-", "_"), value, number)
        for flag, value in _SHORT_FLAG.findall(message):
            _set_int(config, _SHORT_FLAGS[flag], value, number)
        for flag in _BOOL_FLAG.findall(message):
            config.set(flag.replace("-", "_"), True, number)
    if "layers:" in lower:
        for value in _LAYERS_NOTE.findall(message):
            _set_int(config, "num_hidden_layers", value, number)
    if "enable_expert_parallel" in lower or "enforce_eager" in lower:
        for key, value in _BOOL_VALUE.findall(message):
            config.set(key, value.lower() == "true", number)
    if "architecture" in lower:
        for listed, resolved in _ARCHITECTURE.findall(message):
            config.set("architecture", listed or resolved, number)
    if _FFTS_WARNING in lower:
        config.set("hccl_op_expansion_mode", "FFTS+", number)
    elif "hccl_op_expansion_mode" in lower:
        for match in _HCCL.finditer(message):
            # "... set HCCL_OP_EXPANSION_MODE=AIV" is advice (vLLM Ascend's FFTS+ warning, our hints).
            if re.search(r"\bset\s*$", message[max(0, match.start() - 8):match.start()], re.IGNORECASE):
                continue
            config.set("hccl_op_expansion_mode", match.group(1).upper(), number)
    if "captur" in lower:
        for sizes_text, mode, uniform in _CASES.findall(message):
            config.captured_cases = sorted(set(config.captured_cases) | set(_int_list(sizes_text)))
            config.sources.setdefault("captured_cases", number)
            _add_phase(config, mode.upper(), uniform.lower() == "true" if uniform else None)
        for kind, mode in _CAPTURE_BAR.findall(message):
            _add_phase(config, mode.upper(), kind.lower() == "decode")


def _add_phase(config: LogConfig, mode: str, uniform_decode: Optional[bool]) -> None:
    if mode not in ("FULL", "PIECEWISE"):
        return
    if mode not in config.captured_phases:
        config.captured_phases.append(mode)
    if mode == "FULL" and uniform_decode is False:
        config.decode_only_full = False
