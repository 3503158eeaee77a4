"""Graph modes, compilation modes and attention graph-support levels (docs/semantics.md §1).

A GraphMode is either a *runtime mode* (NONE, PIECEWISE, FULL: what a single forward
runs in) or a *pair* (decode_mode, mixed_mode) that says which runtime mode uniform
decode batches and mixed batches use. The names and values follow vLLM's CUDAGraphMode
so that a configuration written for vLLM reads the same here.
"""

from __future__ import annotations

import enum
from typing import Union

from ascendgraph.errors import ConfigError

__all__ = ["GraphMode", "CompilationMode", "AttentionGraphSupport"]


def _parse_enum(cls: type[enum.Enum], value: object, what: str) -> enum.Enum:
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        key = value.strip().upper()
        if key in cls.__members__:
            return cls.__members__[key]
    if isinstance(value, int) and not isinstance(value, bool):
        for member in cls:
            if member.value == value:
                return member
    valid = ", ".join(cls.__members__)
    raise ConfigError(f"invalid {what} {value!r}: expected one of {valid} (case-insensitive)")


class GraphMode(enum.Enum):
    """vLLM's CUDAGraphMode, ACLGraph on Ascend."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    # -- the (decode, mixed) pair -------------------------------------------------
    def separate_routine(self) -> bool:
        """True when uniform decode batches and mixed batches use different runtime modes."""
        return isinstance(self.value, tuple)

    def decode_mode(self) -> "GraphMode":
        return GraphMode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> "GraphMode":
        return GraphMode(self.value[1]) if self.separate_routine() else self

    def max_mode(self) -> "GraphMode":
        return GraphMode(max(self.decode_mode().value, self.mixed_mode().value))

    def has_mode(self, runtime_mode: "GraphMode") -> bool:
        return runtime_mode in (self.decode_mode(), self.mixed_mode())

    def has_full_graphs(self) -> bool:
        return self.has_mode(GraphMode.FULL)

    def has_piecewise_graphs(self) -> bool:
        return self.has_mode(GraphMode.PIECEWISE)

    def requires_piecewise_compilation(self) -> bool:
        return self.has_piecewise_graphs()

    def without_piecewise(self) -> "GraphMode":
        """PIECEWISE -> NONE, FULL_AND_PIECEWISE -> FULL_DECODE_ONLY, others unchanged."""
        return _WITHOUT_PIECEWISE.get(self, self)

    def is_runtime_mode(self) -> bool:
        return self in GraphMode.runtime_modes()

    @classmethod
    def runtime_modes(cls) -> frozenset["GraphMode"]:
        return frozenset({cls.NONE, cls.PIECEWISE, cls.FULL})

    @classmethod
    def from_pair(cls, decode_mode: "GraphMode", mixed_mode: "GraphMode") -> "GraphMode | None":
        """The member standing for (decode_mode, mixed_mode), or None if no member does."""
        for member in cls:
            if member.decode_mode() is decode_mode and member.mixed_mode() is mixed_mode:
                return member
        return None

    @classmethod
    def parse(cls, name: Union[str, "GraphMode"]) -> "GraphMode":
        """Parse a mode name case-insensitively (``"full_decode_only"``); bad names raise ConfigError."""
        return _parse_enum(cls, name, "cudagraph_mode")  # type: ignore[return-value]  # _parse_enum returns the member of the enum class it is given

    def __bool__(self) -> bool:
        return self is not GraphMode.NONE

    def __str__(self) -> str:
        return self.name


_WITHOUT_PIECEWISE = {
    GraphMode.PIECEWISE: GraphMode.NONE,
    GraphMode.FULL_AND_PIECEWISE: GraphMode.FULL_DECODE_ONLY,
}


class CompilationMode(enum.IntEnum):
    """vLLM's compilation modes; Ascend supports NONE and VLLM_COMPILE."""

    NONE = 0
    STOCK_TORCH_COMPILE = 1
    DYNAMO_TRACE_ONCE = 2
    VLLM_COMPILE = 3

    @classmethod
    def parse(cls, value: Union[str, int, "CompilationMode"]) -> "CompilationMode":
        return _parse_enum(cls, value, "compilation mode")  # type: ignore[return-value]  # _parse_enum returns the member of the enum class it is given

    def __str__(self) -> str:
        return self.name


class AttentionGraphSupport(enum.IntEnum):
    """How much of graph capture an attention backend supports (vLLM's AttentionCGSupport)."""

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2
    ALWAYS = 3

    @classmethod
    def parse(cls, value: Union[str, int, "AttentionGraphSupport"]) -> "AttentionGraphSupport":
        return _parse_enum(cls, value, "attention graph support")  # type: ignore[return-value]  # _parse_enum returns the member of the enum class it is given

    def __str__(self) -> str:
        return self.name
