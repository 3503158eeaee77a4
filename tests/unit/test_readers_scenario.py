"""Scenario files are read like the CLI reads its flags: a non-text file, a JSON flag that does
not parse, or a model that does not resolve is a bad file (ScenarioError, exit 2, one line),
found by `scenario list`, by `scenario run` before anything runs, and by pytest collection."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import ascendgraph.testing.scenarios  # noqa: F401  (imported before any in-process inner session)
from ascendgraph.cli.app import main
from ascendgraph.tools.scenario import ScenarioError, load_scenario
from tests.inner_pytest import UNUSED_PLUGINS_OFF

pytest_plugins = ["pytester"]


def write(tmp_path: Path, text: str, name: str = "case.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def engine_file(tmp_path: Path, config_line: str) -> Path:
    return write(tmp_path, f"description = 'x'\n[config]\n{config_line}\n[expect]\noutcome = 'ok'\n")


BAD_CONFIGS = [
    ("compilation json", 'compilation_config = "{bad json"', "[config] compilation_config", "invalid JSON at line 1"),
    ("additional json list", "additional_config = '[1]'", "[config] additional_config", "must be a JSON object"),
    ("speculative json", "speculative_config = '{\"k\": }'", "[config] speculative_config", "invalid JSON"),
    ("missing model file", 'model = "/nonexistent/config.json"', "[config] model", "unknown model '/nonexistent/config.json'"),
    ("unknown preset", 'model = "tiny-typo"', "[config] model", "give a preset"),
    ("model table without architectures", "model = { hidden_size = 64 }", "[config] model", "missing 'architectures'"),
]


@pytest.mark.parametrize("line, key, expected", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_config_values_the_cli_would_refuse_make_a_bad_file(tmp_path, line, key, expected):
    path = engine_file(tmp_path, line)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {key}: "), message
    assert expected in message and "\n" not in message, message


def test_a_model_file_that_is_not_text_makes_a_bad_file(tmp_path):
    (tmp_path / "model.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01" * 64)
    with pytest.raises(ScenarioError, match=r"\[config\] model: model config .*model\.json: not a text file"):
        load_scenario(engine_file(tmp_path, 'model = "model.json"'))


def test_good_json_flags_and_a_preset_model_still_load(tmp_path):
    scenario = load_scenario(engine_file(tmp_path, 'compilation_config = \'{"cudagraph_mode": "FULL"}\'\nmodel = "tiny-mla"'))
    assert scenario.config == {"compilation_config": '{"cudagraph_mode": "FULL"}', "model": "tiny-mla"}


def test_a_binary_scenario_file_is_not_a_text_file(tmp_path):
    path = tmp_path / "bin.toml"
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(ScenarioError, match=r"bin\.toml: \(file\): not a text file"):
        load_scenario(path)


@pytest.mark.parametrize("action", ["list", "run"])
@pytest.mark.parametrize("kind", ["binary", "bad json", "missing model"])
def test_the_cli_exits_2_with_one_line_for_list_and_run(tmp_path, capsys, action, kind):
    if kind == "binary":
        path = tmp_path / "bin.toml"
        path.write_bytes(bytes(range(256)) * 8)
    else:
        path = engine_file(tmp_path, 'compilation_config = "{bad json"' if kind == "bad json" else 'model = "/nonexistent/config.json"')
    assert main(["scenario", action, str(path)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "Traceback" not in err, err
    assert captured.out == ""


def test_pytest_collection_reports_the_bad_file_in_one_line(pytester):
    folder = pytester.path / "scenarios"
    folder.mkdir()
    pytester.makeini("[pytest]\nascendgraph_scenarios = scenarios\n")
    (folder / "bad_json.toml").write_text(
        "description = 'x'\n[config]\ncompilation_config = \"{bad json\"\n[expect]\noutcome = 'ok'\n"
    )
    result = pytester.runpytest_inprocess(*_plugin_args(), *UNUSED_PLUGINS_OFF, "-p", "no:cacheprovider", "scenarios")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*bad_json.toml: [[]config[]] compilation_config: --compilation-config: invalid JSON*"])
    assert "Traceback" not in result.stdout.str()


def test_a_config_value_the_cli_refuses_is_a_bad_file_in_one_line_without_a_traceback(tmp_path, capsys):
    # Validated when loaded, as the CLI validates the same flag (exit 2), not a "run failure".
    path = engine_file(tmp_path, "max_num_seqs = 99999999999999\nnum_layers = 2")
    assert main(["scenario", "run", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: [config] max_num_seqs: max_num_seqs=99999999999999 is larger than ascendgraph supports" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def _plugin_args() -> list[str]:
    """`-p ascendgraph.testing.plugin` unless it is already a pytest11 entry point (never twice)."""
    from importlib.metadata import entry_points

    if "ascendgraph.testing.plugin" in {ep.value for ep in entry_points(group="pytest11")}:
        return []
    return ["-p", "ascendgraph.testing.plugin"]
