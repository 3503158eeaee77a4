"""`read_human_int`: vLLM's human-readable counts, under the bounded reader's digit limit."""

from __future__ import annotations

import pytest

from ascendgraph.errors import ConfigError
from ascendgraph.readers import MAX_INT_DIGITS, read_human_int


@pytest.mark.parametrize(
    "text,value",
    [("8", 8), ("8k", 8_000), ("8K", 8_192), ("1.5k", 1_500), ("1.2345k", 1_234), ("0.0001k", 0),
     ("2M", 2 * 1024**2), ("1g", 10**9), ("1T", 1024**4), (" 4k ", 4_000), (12, 12)],
)
def test_suffixes_are_decimal_lowercase_and_binary_uppercase(text, value):
    assert read_human_int(text, "--max-num-batched-tokens") == value


@pytest.mark.parametrize("text", ["1.5K", "8kb", "8 k", "+8k", "k", "1e3", "²k", "8kk", "0x10"])
def test_other_forms_are_refused_naming_where_they_came_from(text):
    with pytest.raises(ConfigError, match="--max-num-batched-tokens"):
        read_human_int(text, "--max-num-batched-tokens")


def test_a_suffix_cannot_smuggle_a_number_past_the_digit_bound():
    with pytest.raises(ConfigError, match="digits"):
        read_human_int("9" * (MAX_INT_DIGITS - 1) + "t", "x")
    with pytest.raises(ConfigError, match="digits"):
        read_human_int("9" * (MAX_INT_DIGITS + 1) + "k", "x")
