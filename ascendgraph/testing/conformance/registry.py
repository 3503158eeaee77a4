"""The conformance registry: cases, their backend tags and the ``device`` parametrisation."""

from __future__ import annotations

import pytest
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["ALL", "SimOnly", "sim_only", "case", "CASES", "BACKEND_NAMES"]

BACKEND_NAMES = ("sim", "npu")


@dataclass(frozen=True)
class SimOnly:
    reason: str


ALL = "all"


def sim_only(reason: str) -> SimOnly:
    return SimOnly(reason)


CASES: dict[str, Any] = {}


def case(tag: Any) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a conformance case and parametrise its ``device`` over the backends."""

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        npu_marks: list[Any] = [pytest.mark.npu]
        if isinstance(tag, SimOnly):
            npu_marks.append(pytest.mark.skip(reason=f"sim only: {tag.reason}"))
        elif tag != ALL:
            raise ValueError(f"conformance tag must be ALL or sim_only(reason), got {tag!r}")
        params = [pytest.param("sim", id="sim"), pytest.param("npu", id="npu", marks=npu_marks)]
        fn.conformance_tag = tag  # type: ignore[attr-defined]  # tags a test function for the registry
        wrapped = pytest.mark.parametrize("device", params, indirect=True)(fn)
        CASES[fn.__name__] = wrapped
        return wrapped

    return decorate
