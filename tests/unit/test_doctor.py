"""`ascendgraph doctor`: versions, device availability, and the graph-mode environment rules."""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import pytest

from ascendgraph.tools import doctor as doctor_module
from ascendgraph.cli.app import main
from ascendgraph.tools.doctor import (
    GRAPH_ENV_NAMES,
    HDK_SUBJECT,
    RULES,
    ReferenceConfig,
    Severity,
    doctor,
    format_report,
    parse_version_numbers,
    report_to_json,
)
from ascendgraph.errors import LAUNCH_BLOCKING_MESSAGE, TASK_QUEUE_2_DURING_CAPTURE

NO_PACKAGES: dict[str, str] = {}


def fake_versions(installed: dict[str, str]):
    return lambda name: installed.get(name)


def run_doctor(env: dict[str, str], *, installed: Optional[dict[str, str]] = None, roots=("/nonexistent-ascend",),
               npu: tuple[bool, str] = (False, "no NPU in this test"), soc: Optional[str] = None,
               reference: ReferenceConfig = ReferenceConfig(), tmp_cache: Optional[str] = None):
    env = dict(env)
    if tmp_cache is not None:
        env.setdefault("ASCENDGRAPH_CACHE_DIR", tmp_cache)
    soc_calls: list[int] = []

    def soc_probe() -> Optional[str]:
        soc_calls.append(1)
        return soc

    report = doctor(
        env,
        reference=reference,
        ascend_roots=roots,
        package_version=fake_versions(installed or NO_PACKAGES),
        availability=lambda name: npu if name == "npu" else (True, "the CPU simulator"),
        soc_probe=soc_probe,
    )
    return report, soc_calls


def rule_names(report) -> list[str]:
    return [f.rule for f in report.findings]


@pytest.fixture
def cache(tmp_path) -> str:
    path = tmp_path / "cache"
    path.mkdir()
    return str(path)


# --------------------------------------------------------------------------- the rule table


def test_every_graph_mode_variable_of_the_issue_is_listed():
    assert set(GRAPH_ENV_NAMES) == {"HCCL_OP_EXPANSION_MODE", "ASCEND_LAUNCH_BLOCKING", "TASK_QUEUE_ENABLE",
                                    "PYTORCH_NPU_ALLOC_CONF", "TORCH_DEVICE_BACKEND_AUTOLOAD", "ASCENDGRAPH_CACHE_DIR",
                                    "TORCH_COMPILE_DISABLE"}  # issue 27: a process without torch.compile


def test_every_rule_is_about_a_listed_variable_or_the_hdk_and_has_a_fix():
    for rule in RULES:
        assert rule.subject in GRAPH_ENV_NAMES or rule.subject in (HDK_SUBJECT, "stream budget"), rule.name
        assert rule.message and rule.fix, rule.name
    assert len({rule.name for rule in RULES}) == len(RULES)


ENV_CASES = [
    # (environment, rule expected, severity)
    ({"ASCEND_LAUNCH_BLOCKING": "1"}, "launch_blocking_on", Severity.BREAKS),
    ({"ASCEND_LAUNCH_BLOCKING": " 1 "}, "launch_blocking_on", Severity.BREAKS),
    ({"ASCEND_LAUNCH_BLOCKING": "yes"}, "launch_blocking_unusual", Severity.NOTE),
    ({"TASK_QUEUE_ENABLE": "2"}, "task_queue_2", Severity.BREAKS),
    ({"TASK_QUEUE_ENABLE": "0"}, "task_queue_off", Severity.WEAKENS),
    ({"TASK_QUEUE_ENABLE": "3"}, "task_queue_invalid", Severity.BREAKS),
    ({"HCCL_OP_EXPANSION_MODE": "FFTS"}, "hccl_unknown_mode", Severity.WEAKENS),
    ({}, "hccl_not_aiv", Severity.WEAKENS),  # unset, reference tp=2: FFTS+ fits fewer sizes than AIV
    ({"HCCL_OP_EXPANSION_MODE": "HOST"}, "hccl_not_aiv", Severity.WEAKENS),
    ({"PYTORCH_NPU_ALLOC_CONF": "expandable_segments"}, "alloc_conf_malformed", Severity.WEAKENS),
]


@pytest.mark.parametrize("env, rule, severity", ENV_CASES, ids=[c[1] + ":" + repr(c[0]) for c in ENV_CASES])
def test_a_value_that_breaks_or_weakens_graph_mode_is_reported_with_its_severity(env, rule, severity, cache):
    report, _ = run_doctor(env, tmp_cache=cache)
    found = {f.rule: f for f in report.findings}
    assert rule in found, f"{rule} not reported for {env}; got {rule_names(report)}"
    assert found[rule].severity is severity
    assert found[rule].fix


@pytest.mark.parametrize("env", [
    {"HCCL_OP_EXPANSION_MODE": "AIV", "ASCEND_LAUNCH_BLOCKING": "0", "TASK_QUEUE_ENABLE": "1",
     "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:256"},
    {"HCCL_OP_EXPANSION_MODE": "aiv"},
])
def test_a_good_environment_has_no_findings_and_exit_0(env, cache):
    report, _ = run_doctor(env, tmp_cache=cache)
    assert report.findings == []
    assert report.exit_code == 0


def test_breaking_value_makes_exit_1(cache):
    report, _ = run_doctor({"HCCL_OP_EXPANSION_MODE": "AIV", "TASK_QUEUE_ENABLE": "2"}, tmp_cache=cache)
    assert report.broken and report.exit_code == 1


def test_weakening_values_alone_keep_exit_0(cache):
    report, _ = run_doctor({"TASK_QUEUE_ENABLE": "0"}, tmp_cache=cache)
    assert report.findings and not report.broken and report.exit_code == 0


def test_launch_blocking_and_task_queue_messages_quote_the_real_refusals(cache):
    report, _ = run_doctor({"ASCEND_LAUNCH_BLOCKING": "1", "TASK_QUEUE_ENABLE": "2"}, tmp_cache=cache)
    messages = {f.rule: f.message for f in report.findings}
    assert LAUNCH_BLOCKING_MESSAGE in messages["launch_blocking_on"]
    assert TASK_QUEUE_2_DURING_CAPTURE in messages["task_queue_2"]


# --------------------------------------------------------------------------- the stream budget check


def test_ffts_warning_says_how_many_sizes_fit_with_and_without_aiv(cache):
    # 28 layers, tp=2, 35 default sizes, FULL_AND_PIECEWISE: FFTS+ 19 fit, AIV 29 (docs/semantics.md §9).
    report, _ = run_doctor({}, tmp_cache=cache)
    finding = next(f for f in report.findings if f.rule == "hccl_not_aiv")
    assert "only 19 of 35 capture sizes fit" in finding.message
    assert "29 with AIV" in finding.message
    assert finding.fix.startswith("export HCCL_OP_EXPANSION_MODE=AIV")
    check = report.facts.stream
    assert (check.num_sizes, check.fit_ffts, check.fit_aiv, check.current_mode) == (35, 19, 29, "FFTS+")


def test_single_card_reference_fits_everything_so_ffts_is_not_a_warning(cache):
    report, _ = run_doctor({}, reference=ReferenceConfig(tensor_parallel_size=1), tmp_cache=cache)
    assert "hccl_not_aiv" not in rule_names(report)


def test_aiv_environment_is_the_current_mode_of_the_stream_check(cache):
    report, _ = run_doctor({"HCCL_OP_EXPANSION_MODE": "AIV"}, tmp_cache=cache)
    assert report.facts.stream.current_mode == "AIV"
    assert report.facts.stream.fit_current == 29


# --------------------------------------------------------------------------- stack facts


def make_cann(root, *, version="8.5.0", driver=None, arch="aarch64-linux"):
    info_dir = root / "ascend-toolkit" / "latest" / arch
    info_dir.mkdir(parents=True)
    (info_dir / "ascend_toolkit_install.info").write_text(
        f"package_name=Ascend-cann-toolkit\nversion={version}\narch=aarch64\n")
    if driver is not None:
        (root / "driver").mkdir()
        (root / "driver" / "version.info").write_text(f"Version={driver}\nascendhal_version=7.35.23\n")
    return root


def test_cann_and_hdk_versions_come_from_their_install_files(tmp_path, cache):
    root = make_cann(tmp_path / "Ascend", version="8.5.0", driver="25.5.1")
    report, _ = run_doctor({"HCCL_OP_EXPANSION_MODE": "AIV"}, roots=(str(root),), tmp_cache=cache)
    assert report.facts.cann.version == "8.5.0"
    assert report.facts.hdk.version == "25.5.1"
    assert report.findings == []


def test_cann_home_from_ascend_home_path_wins(tmp_path, cache):
    home = tmp_path / "custom-cann"
    (home / "x86_64-linux").mkdir(parents=True)
    (home / "x86_64-linux" / "ascend_toolkit_install.info").write_text("version=8.3.RC1\n")
    report, _ = run_doctor({"ASCEND_HOME_PATH": str(home)}, tmp_cache=cache)
    assert report.facts.cann.version == "8.3.RC1"
    assert report.facts.cann_searched[0] == str(home)


def test_old_hdk_is_reported_with_the_alloc_sq_cq_consequence(tmp_path, cache):
    root = make_cann(tmp_path / "Ascend", driver="24.1.rc2")
    report, _ = run_doctor({"HCCL_OP_EXPANSION_MODE": "AIV"}, roots=(str(root),), tmp_cache=cache)
    finding = next(f for f in report.findings if f.rule == "hdk_too_old")
    assert "Alloc sq cq fail" in finding.message and "25.5.1" in finding.fix


@pytest.mark.parametrize("text, parsed", [("25.5.1", (25, 5, 1)), ("24.1.rc2", (24, 1)), ("25.5.RC1", (25, 5)),
                                          ("", None), ("unknown", None), ("25.²", (25,)), ("²", None),
                                          ("٢٥.5", None)])
def test_hdk_versions_compare_by_their_leading_numbers(text, parsed):
    assert parse_version_numbers(text) == parsed


def test_torch_npu_without_cann_breaks_import_torch_unless_autoload_is_off(cache):
    installed = {"torch": "2.13.0", "torch-npu": "2.13.0"}
    report, _ = run_doctor({"HCCL_OP_EXPANSION_MODE": "AIV"}, installed=installed, tmp_cache=cache)
    assert rule_names(report) == ["autoload_without_cann"] and report.exit_code == 1
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in report.findings[0].fix

    report, _ = run_doctor({"HCCL_OP_EXPANSION_MODE": "AIV", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
                           installed=installed, tmp_cache=cache)
    assert rule_names(report) == ["autoload_off"] and report.exit_code == 0


def test_torch_npu_with_cann_and_autoload_is_fine(tmp_path, cache):
    root = make_cann(tmp_path / "Ascend", driver="25.5.1")
    report, _ = run_doctor({"HCCL_OP_EXPANSION_MODE": "AIV"}, installed={"torch-npu": "2.13.0"},
                           roots=(str(root),), tmp_cache=cache)
    assert report.findings == []
    assert report.facts.packages["torch_npu"] == "2.13.0"


def test_doctor_never_imports_torch_npu(cache):
    before = "torch_npu" in sys.modules
    run_doctor({}, installed={"torch-npu": "2.13.0"}, tmp_cache=cache)
    assert ("torch_npu" in sys.modules) == before


def test_cache_dir_that_is_a_file_is_reported(tmp_path):
    path = tmp_path / "not-a-dir"
    path.write_text("x")
    report, _ = run_doctor({"HCCL_OP_EXPANSION_MODE": "AIV", "ASCENDGRAPH_CACHE_DIR": str(path)})
    finding = next(f for f in report.findings if f.rule == "cache_dir_unusable")
    assert "not a directory" in finding.message


def test_cache_dir_that_does_not_exist_yet_is_fine_when_creatable(tmp_path):
    report, _ = run_doctor({"HCCL_OP_EXPANSION_MODE": "AIV", "ASCENDGRAPH_CACHE_DIR": str(tmp_path / "a" / "b")})
    assert report.findings == []


# --------------------------------------------------------------------------- devices


def test_soc_is_probed_only_when_an_npu_is_usable(cache):
    report, calls = run_doctor({}, npu=(False, "no NPU"), soc="A3", tmp_cache=cache)
    assert report.facts.soc is None and calls == []
    report, calls = run_doctor({}, npu=(True, "1 device"), soc="A3", tmp_cache=cache)
    assert report.facts.soc == "A3" and calls == [1]


def test_the_reason_npu_is_unusable_is_shown(cache):
    report, _ = run_doctor({}, npu=(False, "ImportError: libhccl.so: cannot open shared object file"), tmp_cache=cache)
    text = format_report(report)
    assert "--device npu" in text and "not usable: ImportError: libhccl.so" in text
    assert "none visible" in text


# --------------------------------------------------------------------------- output


def test_text_report_lists_every_variable_versions_and_findings(cache):
    report, _ = run_doctor({"TASK_QUEUE_ENABLE": "2"}, installed={"torch": "2.13.0"}, tmp_cache=cache)
    text = format_report(report)
    for name in GRAPH_ENV_NAMES:
        assert name in text
    for label in ("Python", "torch", "torch_npu", "CANN toolkit", "HDK driver", "xlite"):
        assert label in text
    assert "BREAKS  TASK_QUEUE_ENABLE ('2')" in text
    assert "fix: export TASK_QUEUE_ENABLE=1" in text
    assert "graph mode cannot work in this environment" in text
    assert len(text.splitlines()) < 60  # one screen


def test_json_document_has_schema_version_and_every_section(cache):
    report, _ = run_doctor({"HCCL_OP_EXPANSION_MODE": "AIV"}, installed={"torch": "2.13.0"}, tmp_cache=cache)
    doc = report_to_json(report)
    assert doc["schema_version"] == 1
    assert {"python", "packages", "cann", "hdk", "devices", "soc", "environment", "stream_budget", "findings",
            "broken"} <= set(doc)
    assert set(doc["environment"]) == set(GRAPH_ENV_NAMES)
    assert doc["packages"]["torch"] == "2.13.0" and doc["packages"]["torch_npu"] is None
    assert doc["stream_budget"]["fit_aiv"] == 29
    json.dumps(doc)  # serialisable


def test_cli_json_goes_to_stdout_alone_and_exit_follows_breaking_findings(monkeypatch, capsys, tmp_path):
    for name in GRAPH_ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    monkeypatch.setenv("ASCEND_LAUNCH_BLOCKING", "1")
    code = main(["doctor", "--json"])
    out, _ = capsys.readouterr()
    doc = json.loads(out)
    assert doc["environment"]["ASCEND_LAUNCH_BLOCKING"] == "1"
    assert any(f["rule"] == "launch_blocking_on" for f in doc["findings"])
    assert code == 1


def test_cli_text_goes_to_stdout_and_reference_flags_change_the_stream_check(monkeypatch, capsys, tmp_path):
    for name in GRAPH_ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    code = main(["doctor", "-tp", "1", "--num-layers", "4"])
    out, err = capsys.readouterr()
    assert "HCCL_OP_EXPANSION_MODE" not in err  # the report is the result: stdout
    assert "stream budget (reference: 4 layers" in out and "tp=1" in out
    assert "HCCL_OP_EXPANSION_MODE" in out
    assert code in (0, 1)  # 1 only if this machine itself breaks graph mode (e.g. torch_npu without CANN)


def test_cli_bad_reference_flag_is_one_line_exit_2(capsys):
    assert main(["doctor", "--num-layers", "0"]) == 2
    _, err = capsys.readouterr()
    assert "expected a positive integer" in err and len(err.strip().splitlines()) == 1


def test_doctor_runs_as_a_real_process_without_a_traceback(tmp_path):
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in GRAPH_ENV_NAMES}
    env["ASCENDGRAPH_CACHE_DIR"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-m", "ascendgraph", "doctor", "--json"], capture_output=True,
                            text=True, env=env, timeout=120)
    assert "Traceback" not in result.stderr
    assert json.loads(result.stdout)["schema_version"] == 1
    assert result.returncode in (0, 1)


def test_the_cli_lists_the_doctor_command():
    from ascendgraph.cli.app import commands

    assert doctor_module is not None
    assert any(c.name == "doctor" for c in commands())


def test_a_stream_budget_that_fits_no_size_breaks_graph_mode(monkeypatch, capsys, tmp_path):
    for name in GRAPH_ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "AIV")
    code = main(["doctor", "--json", "--stream-limit", "1"])
    doc = json.loads(capsys.readouterr().out)
    found = [f for f in doc["findings"] if f["rule"] == "no_size_fits"]
    assert code == 1 and len(found) == 1 and "not even one" in found[0]["message"]
    assert main(["doctor", "--json"]) in (0, 1)
    assert not any(f["rule"] == "no_size_fits" for f in json.loads(capsys.readouterr().out)["findings"])


def test_an_unknown_expansion_mode_is_one_finding_not_two(monkeypatch, capsys, tmp_path):
    for name in GRAPH_ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HCCL_OP_EXPANSION_MODE", "bogus")
    main(["doctor", "--json"])
    doc = json.loads(capsys.readouterr().out)
    about = [f["rule"] for f in doc["findings"] if f["subject"] == "HCCL_OP_EXPANSION_MODE"]
    assert about == ["hccl_unknown_mode"]


def test_the_cache_checked_is_the_one_ascendgraph_uses_with_xdg_cache_home(tmp_path):
    # No ASCENDGRAPH_CACHE_DIR: ascendgraph caches under $XDG_CACHE_HOME/ascendgraph
    # (ascendgraph.readers.user_cache_root), so that is the folder doctor must check.
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    (xdg / "ascendgraph").write_text("a file where the cache folder should be")
    report, _ = run_doctor({"HCCL_OP_EXPANSION_MODE": "AIV", "XDG_CACHE_HOME": str(xdg), "HOME": str(tmp_path)})
    assert report.facts.cache_dir == str(xdg / "ascendgraph")
    finding = next(f for f in report.findings if f.rule == "cache_dir_unusable")
    assert "not a directory" in finding.message
