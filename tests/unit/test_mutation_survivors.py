"""Tests written to kill survivors of the mutation run (docs/testing.md, "Mutation testing")."""

from __future__ import annotations

import pytest

from ascendgraph.errors import ConfigError
from ascendgraph.modes import AttentionGraphSupport, CompilationMode, GraphMode


@pytest.mark.parametrize("enum_type", [GraphMode, CompilationMode, AttentionGraphSupport])
@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_not_an_enum_value_although_it_equals_0_or_1(enum_type, value):
    # modes.py `isinstance(value, int) and not isinstance(value, bool)`: with `or`, True would
    # parse as the member whose value is 1 (PIECEWISE, ...) instead of being refused
    with pytest.raises(ConfigError, match="invalid"):
        enum_type.parse(value)


def test_integers_still_parse_by_value():
    assert CompilationMode.parse(3) is CompilationMode.VLLM_COMPILE
    assert GraphMode.parse("piecewise") is GraphMode.PIECEWISE
