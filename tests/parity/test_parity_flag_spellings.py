"""The flag-spelling data the default run checks ascendgraph against is what vLLM's parser
says today: regenerate it from the installed vLLM and fail when tests/data is stale."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="the parity environment (scripts/parity-env.sh) has vLLM")

import vllm_flag_spellings  # noqa: E402  (beside this file; tests/parity/conftest.py puts it on sys.path)


def test_the_checked_in_spellings_are_what_vllm_accepts():
    fresh = vllm_flag_spellings.render(vllm_flag_spellings.generate())
    stored = vllm_flag_spellings.DATA_FILE.read_text(encoding="utf-8")
    assert json.loads(stored) == json.loads(fresh), (
        "tests/data/vllm_flag_spellings.json is stale: regenerate it with "
        '"$(scripts/parity-env.sh | tail -n 1)" tests/parity/vllm_flag_spellings.py --write'
    )
