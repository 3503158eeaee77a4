"""Files that are not files. Every reader refuses every special input in
one line (exit 2, never a hang: each case has a timeout); every writer refuses every special
output and leaves it as it was; broken cache entries are misses with one warning; temporary
outputs are removed on every exit path. In-process through `main`."""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import stat
from pathlib import Path

import pytest

from ascendgraph.cli.app import main
from ascendgraph.errors import ConfigError
from ascendgraph.readers import (
    check_output_path,
    live_temporaries,
    load_cache_json,
    open_input,
    read_cache_entry,
    user_cache_root,
    write_output,
)

from .special_inputs import DEVICE_OUTPUTS, READERS, SPECIAL_INPUTS, SPECIAL_OUTPUTS

CASES = [(reader, kind) for reader in READERS for kind in SPECIAL_INPUTS]


def _one_line_refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (argv, code, err[-400:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-1000:]
    assert out == ""
    return err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reader, kind", CASES, ids=[f"{r.name}:{k}" for r, k in CASES])
def test_every_reader_refuses_every_special_input_in_one_line(reader, kind, tmp_path, capsys):
    path = SPECIAL_INPUTS[kind](tmp_path / f"input{reader.suffix}")
    err = _one_line_refusal(reader.argv(str(path)), capsys)
    assert "Traceback" not in err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(SPECIAL_INPUTS))
def test_a_special_config_json_inside_a_model_folder_is_refused(kind, tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    SPECIAL_INPUTS[kind](folder / "config.json")
    err = _one_line_refusal(["explain", "--model", str(folder)], capsys)
    assert "config.json" in err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(set(SPECIAL_INPUTS) - {"folder"}))
def test_a_special_profile_base_is_refused(kind, tmp_path, capsys):
    base = SPECIAL_INPUTS[kind](tmp_path / "base.json")
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"name": "x", "soc": "A3", "base": str(base)}))
    _one_line_refusal(["plan", "--measure", "off", "--sim-profile", str(profile)], capsys)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(SPECIAL_INPUTS))
def test_a_special_file_inside_a_scenario_folder_is_refused_by_name(kind, tmp_path, capsys):
    folder = tmp_path / "scenarios"
    folder.mkdir()
    SPECIAL_INPUTS[kind](folder / "odd.toml")
    if kind == "folder":  # a folder named *.toml holds no scenario: the folder has none at all
        err = _one_line_refusal(["scenario", "list", str(folder)], capsys)
        assert "no *.toml" in err
        return
    err = _one_line_refusal(["scenario", "run", str(folder)], capsys)
    assert "odd.toml" in err


@pytest.mark.parametrize("kind", sorted(SPECIAL_INPUTS))
def test_open_input_never_blocks_and_names_what_the_path_is(kind, tmp_path):
    path = SPECIAL_INPUTS[kind](tmp_path / "x")
    with pytest.raises(ConfigError) as caught:
        open_input(path, "the input")
    assert str(caught.value).startswith("the input: ")
    assert "\n" not in str(caught.value)


def test_open_input_takes_a_regular_file_within_its_limit(tmp_path):
    path = tmp_path / "ok.txt"
    path.write_bytes(b"12345")
    with open_input(path, "ok") as handle:
        assert handle.read() == b"12345"
    with pytest.raises(ConfigError, match="at most 4 bytes"):
        open_input(path, "ok", limit=4)


# --------------------------------------------------------------------------- outputs


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(SPECIAL_OUTPUTS))
def test_plot_never_replaces_a_special_file(kind, tmp_path, capsys):
    path = SPECIAL_OUTPUTS[kind](tmp_path / "waste.png")
    before = os.lstat(path)
    _one_line_refusal(["plan", "--measure", "off", "--plot", str(path)], capsys)
    after = os.lstat(path)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["waste.png"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", DEVICE_OUTPUTS)
def test_plot_to_a_device_or_proc_file_is_refused(device, capsys):
    before = os.stat(device)
    err = _one_line_refusal(["plan", "--measure", "off", "--plot", device], capsys)
    assert "regular file" in err and os.stat(device).st_ino == before.st_ino


@pytest.mark.parametrize("kind", sorted(SPECIAL_OUTPUTS))
def test_write_output_refuses_every_special_target(kind, tmp_path):
    path = SPECIAL_OUTPUTS[kind](tmp_path / "out")
    with pytest.raises(ConfigError):
        write_output(path, b"data", "the output")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


class _Stop(BaseException):
    """Stands for SIGTERM's `Terminated`, Ctrl-C, or any exception in the middle of a write."""


@pytest.mark.parametrize("failure", [_Stop(), KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")])
def test_a_write_interrupted_half_way_leaves_no_temporary_file(failure, tmp_path):
    target = tmp_path / "out.png"
    target.write_bytes(b"old")

    def half_then_fail(temporary: str) -> None:
        Path(temporary).write_bytes(b"half")
        assert temporary in live_temporaries()
        raise failure

    with pytest.raises(type(failure)):
        write_output(target, half_then_fail, "the output")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"] and target.read_bytes() == b"old"
    assert not live_temporaries()


def test_sigterm_during_plot_removes_the_temporary_file_and_exits_143(tmp_path, capsys, monkeypatch):
    from matplotlib.figure import Figure

    from ascendgraph.cli.streams import Terminated

    def save_then_terminated(self, fname, *args, **kwargs):
        Path(fname).write_bytes(b"\x89PNG half")
        raise Terminated()

    monkeypatch.setattr(Figure, "savefig", save_then_terminated)
    code = main(["plan", "--measure", "off", "--plot", str(tmp_path / "waste.png")])
    err = capsys.readouterr().err
    assert code == 143 and "terminated" in err
    assert list(tmp_path.iterdir()) == []


def test_check_output_path_accepts_a_new_or_regular_file(tmp_path):
    check_output_path(tmp_path / "new.png", "x")
    (tmp_path / "old.png").write_bytes(b"")
    check_output_path(tmp_path / "old.png", "x")
    with pytest.raises(ConfigError, match="does not exist"):
        check_output_path(tmp_path / "missing" / "new.png", "x")


# --------------------------------------------------------------------------- caches


def _deep_pickle(depth: int) -> bytes:
    text = b"(" * depth + b"t" * depth  # nested empty tuples, built by the unpickler's stack
    return pickle.PROTO + b"\x02" + text + b"."


BROKEN_ENTRIES = {
    **{kind: make for kind, make in SPECIAL_INPUTS.items()},
    "deep-100000": lambda path: (path.write_bytes(b"[" * 100_000 + b"]" * 100_000), path)[1],
    "garbage": lambda path: (path.write_bytes(os.urandom(512)), path)[1],
}


@pytest.mark.parametrize("kind", sorted(BROKEN_ENTRIES))
def test_a_broken_json_cache_entry_is_a_miss_with_one_warning(kind, tmp_path, caplog):
    path = BROKEN_ENTRIES[kind](tmp_path / "manifest.json")
    with caplog.at_level(logging.WARNING, logger="ascendgraph"):
        assert load_cache_json(path, "static kernel manifest") is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cache miss" in warnings[0].getMessage(), caplog.text


def test_a_missing_cache_entry_is_a_silent_miss(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="ascendgraph"):
        assert read_cache_entry(tmp_path / "absent.pkl", "compile cache entry") is None
    assert caplog.records == []


@pytest.mark.parametrize("kind", sorted(set(BROKEN_ENTRIES) | {"deep-pickle"}))
def test_a_broken_compile_cache_entry_is_a_miss_with_one_warning(kind, tmp_path, caplog):
    from ascendgraph.compile.cache import CompileCache

    cache = CompileCache(tmp_path)
    cache.directory.mkdir(parents=True)
    path = cache.directory / "k.pkl"
    if kind == "deep-pickle":
        path.write_bytes(_deep_pickle(100_000))
    else:
        BROKEN_ENTRIES[kind](path)
    with caplog.at_level(logging.WARNING, logger="ascendgraph"):
        assert cache.load("k") is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    # A pickle that loads but is no entry of ours (the 100,000-deep tuple) is a plain miss.
    assert len(warnings) == (0 if kind == "deep-pickle" else 1), caplog.text


def test_an_empty_home_never_puts_the_cache_at_the_root():
    root = user_cache_root({"HOME": ""})
    assert not root.startswith("/.cache") and os.path.isabs(root)
    assert user_cache_root({"HOME": "/home/u"}) == "/home/u/.cache/ascendgraph"
    assert user_cache_root({"HOME": "", "ASCENDGRAPH_CACHE_DIR": "/c"}) == "/c"


# --------------------------------------------------------------------------- real-world names
# File names and folders as users have them (tests/realistic_data.py, Faker, seeded): names of
# people and companies in several scripts, with spaces, accents and apostrophes.


@pytest.mark.parametrize("reader", READERS, ids=[r.name for r in READERS])
def test_a_missing_file_with_a_real_world_name_is_refused_naming_it(reader, tmp_path, capsys):
    from tests.realistic_data import file_names, nested_paths

    names = file_names(1, seed=11)
    for name, folder in zip(names, nested_paths(len(names), seed=11)):
        path = tmp_path / folder / (Path(name).stem + reader.suffix)
        err = _one_line_refusal(reader.argv(str(path)), capsys)
        assert path.name in err, err


def test_a_log_in_folders_with_real_world_names_is_read_and_named_in_the_json(tmp_path, capsys):
    from tests.realistic_data import file_names, nested_paths

    names = file_names(1, seed=13)
    for name, folder in zip(names, nested_paths(len(names), seed=13)):
        log = tmp_path / folder / name
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("INFO vllm: serving started\nINFO vllm: 3 requests finished\n", encoding="utf-8")
        assert main(["diagnose", str(log), "--json"]) == 0, capsys.readouterr().err
        out, err = capsys.readouterr()
        document = json.loads(out)
        assert document["source"] == str(log) and document["lines_read"] == 2 and document["failures"] == []
        assert "Traceback" not in err
