"""`diagnose` on input that is not a log: binary data is refused (exit 2, one line), an empty
log says plainly that it is empty (exit 0); logs with junk lines are still read."""

from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path

import pytest

from ascendgraph.cli.app import main
from ascendgraph.tools.diagnose import EMPTY_LOG_NOTE, UnreadableLog, binary_share, diagnose_file, format_diagnosis
from ascendgraph.errors import TEXT_EL0009

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def random_bytes(count: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(count)


@pytest.mark.parametrize(
    "name, data",
    [
        ("random", random_bytes(100_000)),
        ("small random", random_bytes(2_000)),
        ("utf16", ("INFO starting vLLM\n" * 200).encode("utf-16")),
        ("all 0xff", b"\xff" * 5_000),
        ("elf-like", b"\x7fELF\x02\x01\x01" + b"\x00" * 300 + random_bytes(3_000)),
    ],
)
def test_binary_input_is_not_a_text_log(tmp_path, capsys, name, data):
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    with pytest.raises(UnreadableLog, match="does not look like a text log"):
        diagnose_file(str(path))
    assert main(["diagnose", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"ascendgraph diagnose: error: {path} does not look like a text log")


def test_binary_data_inside_gzip_is_refused_after_gunzip(tmp_path):
    path = tmp_path / "data.log.gz"
    path.write_bytes(gzip.compress(random_bytes(50_000)))
    with pytest.raises(UnreadableLog, match=r"data\.log\.gz does not look like a text log"):
        diagnose_file(str(path))


def test_binary_on_stdin_is_refused():
    with pytest.raises(UnreadableLog, match=r"<stdin> does not look like a text log"):
        diagnose_file("-", stdin=io.BytesIO(random_bytes(10_000)))


def test_a_log_with_binary_junk_lines_and_other_encodings_is_still_read(tmp_path):
    text = (LOGS / "stream_exhaustion_tp4.log").read_bytes()
    junk = random_bytes(600).replace(b"\n", b" ") + b"\n"
    gbk = ("错误：流资源不足\n" * 50).encode("gbk")
    path = tmp_path / "mixed.log"
    path.write_bytes(junk + gbk + text)
    diagnosis = diagnose_file(str(path))
    assert [f.classification for f in diagnosis.failures] == ["stream_exhaustion"]


def test_leading_nuls_of_an_in_place_truncated_log_are_not_binary(tmp_path):
    path = tmp_path / "rotated.log"
    path.write_bytes(b"\x00" * 200_000 + b"RuntimeError: " + TEXT_EL0009.encode() + b"\n")
    assert [f.classification for f in diagnose_file(str(path)).failures] == ["stream_exhaustion"]
    assert binary_share(b"\x00" * 100 + b"plain text\n") == (0.0, 0.0)


def test_the_rest_of_the_stream_is_read_after_the_text_check(tmp_path):
    line = "INFO 01-01 00:00:00 [core.py:1] step\n"
    path = tmp_path / "long.log"
    path.write_text(line * 5_000 + "RuntimeError: " + TEXT_EL0009 + "\n", encoding="utf-8")  # > 64 KiB
    diagnosis = diagnose_file(str(path))
    assert diagnosis.lines_read == 5_001 and [f.line for f in diagnosis.failures] == [5_001]


@pytest.mark.parametrize("compressed", [False, True])
def test_an_empty_log_says_so_and_exits_0(tmp_path, capsys, compressed):
    path = tmp_path / ("empty.log.gz" if compressed else "empty.log")
    path.write_bytes(gzip.compress(b"") if compressed else b"")
    diagnosis = diagnose_file(str(path))
    assert diagnosis.lines_read == 0 and diagnosis.notes == [EMPTY_LOG_NOTE]
    assert format_diagnosis(diagnosis) == f"{path}: the log is empty (0 lines): nothing to diagnose"
    assert main(["diagnose", str(path)]) == 0
    assert "the log is empty" in capsys.readouterr().out
    assert main(["diagnose", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == [EMPTY_LOG_NOTE]
