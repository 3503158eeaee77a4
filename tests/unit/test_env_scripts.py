"""The environment scripts read their inputs safely (scripts/env-inputs.sh): a control character
in a path is refused in one line naming the variable (the source folder becomes a line of a
.pth file, where a second line starting with `import` would run at every start of that
Python); paths are resolved as named, never with `cd` semantics (`-`, `-P`, an exported
CDPATH); a snapshot tarball that does not unpack leaves no folder behind.

Each case runs the script in a subprocess with ``--inputs-only`` (it stops before anything is
installed) and a throwaway cache folder.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_ASCEND_ENV = ROOT / "scripts" / "vllm-ascend-env.sh"
PARITY_ENV = ROOT / "scripts" / "parity-env.sh"
CONTROL_CHARACTERS = {"newline": "\n", "escape": "\x1b"}


def _run(script: Path, cache: Path, *, cwd: Optional[Path] = None, argv0: Optional[str] = None,
         **variables: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_ASCEND_SRC", "VLLM_ASCEND_TARBALL", "CDPATH", "ASCENDGRAPH_CACHE_DIR")}
    env.update(PYTHON=sys.executable, ASCENDGRAPH_CACHE_DIR=str(cache), **variables)
    return subprocess.run(["bash", argv0 or str(script), "--inputs-only"], cwd=cwd or ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _checkout(folder: Path) -> Path:
    (folder / "vllm_ascend").mkdir(parents=True)
    (folder / "vllm_ascend" / "__init__.py").write_text("")
    return folder


def _tarball(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def _error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if "error:" in line]


@pytest.mark.parametrize("variable", ["VLLM_ASCEND_SRC", "VLLM_ASCEND_TARBALL", "ASCENDGRAPH_CACHE_DIR"])
@pytest.mark.parametrize("character", sorted(CONTROL_CHARACTERS))
def test_a_control_character_in_a_path_is_refused_naming_the_variable(tmp_path: Path, variable: str,
                                                                      character: str) -> None:
    # The folder exists, so only the character itself can be the reason.
    bad = _checkout(tmp_path / f"src{CONTROL_CHARACTERS[character]}import os; os.system('touch pwned')")
    cache = tmp_path / "cache"
    values = {variable: str(bad)}
    if variable == "ASCENDGRAPH_CACHE_DIR":
        values = {"VLLM_ASCEND_SRC": str(_checkout(tmp_path / "plain"))}
        cache = bad / "cache"
    result = _run(VLLM_ASCEND_ENV, cache, **values)
    assert result.returncode == 2, result.stderr
    errors = _error_lines(result)
    assert len(errors) == 1 and f"{variable} contains a control character" in errors[0], result.stderr
    assert result.stdout == ""
    assert not cache.exists()


def test_a_link_to_a_folder_whose_name_has_a_newline_is_refused(tmp_path: Path) -> None:
    target = _checkout(tmp_path / "src\nimport os")
    (tmp_path / "link").symlink_to(target)
    result = _run(VLLM_ASCEND_ENV, tmp_path / "cache", VLLM_ASCEND_SRC=str(tmp_path / "link"))
    assert result.returncode == 2
    assert "VLLM_ASCEND_SRC (resolved to" in result.stderr and "contains a control character" in result.stderr


@pytest.mark.parametrize("name", ["-", "-P", "-L", "--"])
def test_a_source_folder_named_like_a_cd_option_is_that_folder(tmp_path: Path, name: str) -> None:
    work = tmp_path / "work"
    _checkout(work / name)
    (work / "elsewhere").mkdir()
    result = _run(VLLM_ASCEND_ENV, tmp_path / "cache", cwd=work, VLLM_ASCEND_SRC=name,
                  OLDPWD=str(work / "elsewhere"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == str(work / name)


def test_an_exported_cdpath_does_not_redirect_the_source_or_the_script_folder(tmp_path: Path) -> None:
    work, decoy = tmp_path / "work", tmp_path / "decoy"
    _checkout(work / "checkout")
    _checkout(decoy / "checkout")
    (decoy / "scripts").mkdir()  # `cd scripts/..` would land in the decoy
    result = _run(VLLM_ASCEND_ENV, tmp_path / "cache", cwd=work, VLLM_ASCEND_SRC="checkout", CDPATH=str(decoy))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == str(work / "checkout")
    # The script named by a relative path from the checkout (what the Makefile does).
    relative = _run(PARITY_ENV, tmp_path / "cache", argv0="scripts/parity-env.sh", CDPATH=str(decoy))
    assert relative.returncode == 0, relative.stderr
    assert relative.stdout.splitlines() == [next(iter(relative.stdout.splitlines()))]
    assert relative.stdout.startswith(str(tmp_path / "cache" / "parity-env-"))


def test_a_relative_cache_folder_is_made_absolute(tmp_path: Path) -> None:
    _checkout(tmp_path / "src")
    result = _run(VLLM_ASCEND_ENV, Path("-P"), cwd=tmp_path, VLLM_ASCEND_SRC=str(tmp_path / "src"),
                  CDPATH=str(tmp_path / "src"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].startswith(str(tmp_path / "-P" / "vllm-ascend-env-"))


def test_without_a_cache_variable_the_folder_is_the_one_the_python_code_uses(tmp_path: Path) -> None:
    # No ASCENDGRAPH_CACHE_DIR: $XDG_CACHE_HOME/ascendgraph when XDG_CACHE_HOME is absolute, as
    # ascendgraph.readers.user_cache_root says; a relative one is ignored there and here.
    from ascendgraph.readers import user_cache_root

    _checkout(tmp_path / "src")
    for xdg in (str(tmp_path / "xdg"), "relative-xdg"):
        env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ASCEND_TARBALL", "CDPATH", "ASCENDGRAPH_CACHE_DIR")}
        env.update(PYTHON=sys.executable, VLLM_ASCEND_SRC=str(tmp_path / "src"), XDG_CACHE_HOME=xdg,
                   HOME=str(tmp_path / "home"))
        result = subprocess.run(["bash", str(VLLM_ASCEND_ENV), "--inputs-only"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        expected = user_cache_root({"XDG_CACHE_HOME": xdg, "HOME": str(tmp_path / "home")})
        assert expected == (str(tmp_path / "xdg" / "ascendgraph") if xdg.startswith("/")
                            else str(tmp_path / "home" / ".cache" / "ascendgraph"))
        assert result.stdout.splitlines()[1].startswith(os.path.join(expected, "vllm-ascend-env-"))


@pytest.mark.parametrize("content", ["garbage", "no package"])
def test_a_tarball_that_is_not_a_snapshot_leaves_no_unpack_folder(tmp_path: Path, content: str) -> None:
    tarball = tmp_path / "snapshot.tar.gz"
    if content == "garbage":
        tarball.write_bytes(b"not a tar archive\n")
    else:
        _tarball(tarball, {"README.md": b"hello\n"})
    cache = tmp_path / "cache"
    result = _run(VLLM_ASCEND_ENV, cache, VLLM_ASCEND_TARBALL=str(tarball))
    assert result.returncode == 2
    errors = _error_lines(result)
    assert len(errors) == 1 and f"VLLM_ASCEND_TARBALL={tarball}" in errors[0], result.stderr
    assert sorted(p.name for p in cache.iterdir()) == []


def test_a_snapshot_tarball_is_unpacked_once(tmp_path: Path) -> None:
    tarball = _tarball(tmp_path / "vllm-ascend-test.tar.gz", {"vllm_ascend/__init__.py": b""})
    cache = tmp_path / "cache"
    first = _run(VLLM_ASCEND_ENV, cache, VLLM_ASCEND_TARBALL=str(tarball))
    assert first.returncode == 0, first.stderr
    source = Path(first.stdout.splitlines()[0])
    assert source.parent == cache and (source / "vllm_ascend" / "__init__.py").is_file()
    assert [p.name for p in cache.iterdir()] == [source.name]
    again = _run(VLLM_ASCEND_ENV, cache, VLLM_ASCEND_TARBALL=str(tarball))
    assert again.stdout == first.stdout and "unpacked" not in again.stderr


@pytest.mark.parametrize("value", ["", "-P"])
def test_a_tarball_that_is_not_there_is_one_line(tmp_path: Path, value: str) -> None:
    result = _run(VLLM_ASCEND_ENV, tmp_path / "cache", cwd=tmp_path, VLLM_ASCEND_TARBALL=value or str(tmp_path / "no"))
    assert result.returncode == 2
    assert len(_error_lines(result)) == 1 and "VLLM_ASCEND_TARBALL=" in result.stderr


def test_parity_env_refuses_a_control_character_in_the_cache_folder(tmp_path: Path) -> None:
    result = _run(PARITY_ENV, tmp_path / "cache\nimport os")
    assert result.returncode == 2
    assert _error_lines(result) == [
        "[parity-env] error: ASCENDGRAPH_CACHE_DIR contains a control character (a newline, tab or escape); "
        "set it to a plain path"]
    assert not (tmp_path / "cache\nimport os").exists()


@pytest.mark.parametrize("script", [VLLM_ASCEND_ENV, PARITY_ENV], ids=lambda p: p.name)
def test_an_unknown_argument_is_one_line(tmp_path: Path, script: Path) -> None:
    result = subprocess.run(["bash", str(script), "--dry"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "ASCENDGRAPH_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "unknown argument '--dry'" in result.stderr


def test_ray_env_refuses_a_control_character_in_the_cache_folder(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "ASCENDGRAPH_CACHE_DIR": str(tmp_path / "cache\nimport os")}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "ray-env.sh")], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert _error_lines(result) == [
        "[ray-env] error: ASCENDGRAPH_CACHE_DIR contains a control character (a newline, tab or escape); "
        "set it to a plain path"]
    assert not (tmp_path / "cache\nimport os").exists()
