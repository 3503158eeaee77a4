"""Files that are not UTF-8 text, given where a JSON file is expected (`--model config.json`,
`--sim-profile FILE.json`): exit 2 with one line naming the file, never a UnicodeDecodeError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascendgraph.cli.app import main
from ascendgraph.errors import ConfigError
from ascendgraph.models.presets import model_spec_from

BINARY = b"\x89PNG\r\n\x1a\n\xff\xfe\xfd" + bytes(range(128, 256)) * 8


def _binary(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_bytes(BINARY)
    return path


def test_a_binary_model_config_is_not_a_text_file(tmp_path):
    path = _binary(tmp_path, "config.json")
    for given in (path, tmp_path):  # the file, or its folder
        with pytest.raises(ConfigError, match=r"model config .*config\.json: not a text file") as info:
            model_spec_from(str(given))
        assert info.value.key == "model"


def test_explain_with_a_binary_model_config_exits_2_in_one_line(tmp_path, capsys):
    path = _binary(tmp_path, "bin.json")
    assert main(["explain", "--model", str(path)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{path}: not a text file" in err


@pytest.mark.parametrize(
    "content, expected",
    [
        (BINARY, "not a text file"),
        (json.dumps({"base": "A2", "memory_bytes": None}).encode(), "memory_bytes must be an integer from 1 to", ),
        (json.dumps({"base": "A2", "cost": {"host_launch_us": "fast"}}).encode(), 'cost.host_launch_us must be'),
    ],
    ids=["binary", "null memory", "string cost"],
)
def test_run_with_a_bad_sim_profile_exits_2_in_one_line(tmp_path, capsys, content, expected):
    path = tmp_path / "sp.json"
    path.write_bytes(content)
    assert main(["run", "--device", "sim", "--sim-profile", str(path), "--requests", "1"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"profile file {path}" in err and expected in err, err
