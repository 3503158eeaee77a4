"""`ascendgraph scenario run` over rank scenario files: a row per side, `--shard i/n`, and the
`--ray` flag's bad input (the Ray run itself: tests/ranks/test_ray.py, -m ray)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from ascendgraph.cli.app import main
from ascendgraph.errors import ConfigError
from ascendgraph.tools.scenario.items import load_items, select_shard
from ascendgraph.tools.scenario.ray_items import check_address

RANK_FILES = Path(__file__).parent / "scenario_files"
SINGLE_RANK_FILES = Path(__file__).parents[1] / "scenarios"


def test_a_rank_file_is_a_row_per_side_and_runs_through_scenario_run(capsys):
    code = main(["scenario", "run", "--json", str(RANK_FILES / "draft_steps_differ.toml")])
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    rows = {row["name"]: row for row in document["scenarios"]}
    assert set(rows) == {"draft_steps_differ[buggy]", "draft_steps_differ[fixed]"}
    assert rows["draft_steps_differ[buggy]"]["error"]["type"] == "CollectiveDeadlock"
    assert rows["draft_steps_differ[fixed]"]["outcome"] == "ok" and rows["draft_steps_differ[fixed]"]["passed"]
    assert document["summary"]["scenarios"] == 2 and document["summary"]["failed"] == 0


def test_scenario_list_lists_rank_files_a_row_per_side_with_their_kind(capsys):
    assert main(["scenario", "list", "--json", str(RANK_FILES), str(SINGLE_RANK_FILES / "task_queue_enable_2.toml")]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["scenarios"]}
    assert rows["sync_tensors_differ[buggy]"]["kind"] == "ranks"
    assert (rows["sync_tensors_differ[buggy]"]["expected"], rows["sync_tensors_differ[buggy]"]["error_type"]) == \
        ("error", "CollectiveMismatch")
    assert rows["sync_tensors_differ[fixed]"]["expected"] == "ok" and "#9689" in rows["sync_tensors_differ[fixed]"]["issue"]
    assert rows["task_queue_enable_2"]["kind"] == "engine"
    assert len(rows) == 2 * len(list(RANK_FILES.glob("*.toml"))) + 1
    assert main(["scenario", "list", str(RANK_FILES / "draft_steps_differ.toml")]) == 0
    text = capsys.readouterr().out
    assert "draft_steps_differ[buggy]  ranks   error (CollectiveDeadlock)" in text and text.endswith("2 scenarios\n")
    assert main(["scenario", "list", "--markdown", str(RANK_FILES / "draft_steps_differ.toml")]) == 0
    assert "| `draft_steps_differ[buggy]` | ranks |" in capsys.readouterr().out


def test_shards_cover_every_item_exactly_once():
    items = load_items([RANK_FILES, SINGLE_RANK_FILES])
    names = [item.name for item in items]
    shards = [select_shard(items, (index, 3)) for index in range(3)]
    assert sorted(item.name for shard in shards for item in shard) == sorted(names)
    assert all(shards) and len({item.name for item in shards[0]} & {item.name for item in shards[1]}) == 0


@pytest.mark.parametrize("shard", ["3/3", "0/0", "-1/2", "1", "a/b"])
def test_a_shard_outside_the_range_is_one_line_and_exit_2(capsys, shard):
    code = main(["scenario", "run", f"--shard={shard}", str(RANK_FILES)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and "--shard must be i/n" in err and repr(shard) in err


def _closed_port() -> int:
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_address_nothing_answers_at_is_refused_naming_it():
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(ConfigError, match=r"nothing answers there") as info:
        check_address(address)
    assert address in str(info.value)
    for bad in ("localhost", "host:port", "ray://:1", "127.0.0.1:70000"):
        with pytest.raises(ConfigError, match="is not an address"):
            check_address(bad)


def test_ray_flag_bad_input_is_one_line_and_exit_2_before_anything_runs(capsys):
    address = f"127.0.0.1:{_closed_port()}"
    code = main(["scenario", "run", "--ray", address, str(RANK_FILES / "draft_steps_differ.toml")])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""  # no table row: nothing ran
    line = captured.err.strip()
    assert line.count("\n") == 0
    # without the extra: what to install; with it: the address that does not answer
    assert "pip install 'ascendgraph[ray]'" in line or (address in line and "nothing answers there" in line)
