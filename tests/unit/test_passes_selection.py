"""Which passes a resolved configuration runs (docs/semantics.md §3 step 8, §10) and the config chain on that path."""

from __future__ import annotations

import pytest

from ascendgraph.compile import PassManager
from ascendgraph.compile.passes import PASS_RULES, build_passes, select_pass_names
from ascendgraph.compile.static_kernel import StaticKernelStage
from ascendgraph.config import STATIC_NEEDS_NPUGRAPH_EX, SUPER_NEEDS_STATIC, GraphConfig
from ascendgraph.errors import ConfigError
from ascendgraph.resolve import resolve

ALL = [rule.name for rule in PASS_RULES]
BASIC = ["noop_elimination", "add_rms_norm", "add_rms_norm_dynamic_quant", "add_rms_norm_quant"]


def _resolution(mode=None, soc=None, **acc):
    compilation = {"cudagraph_mode": mode} if mode else {}
    additional = {"ascend_compilation_config": acc} if acc else None
    return resolve(
        GraphConfig.from_vllm_args(compilation_config=compilation, additional_config=additional, num_layers=2, soc=soc)
    )


@pytest.mark.parametrize(
    "mode, acc, expected",
    [
        ("NONE", {}, []),
        ("PIECEWISE", {}, BASIC),
        ("FULL_AND_PIECEWISE", {}, BASIC),
        ("FULL", {}, ALL),
        ("FULL_DECODE_ONLY", {}, ALL),
        ("FULL_DECODE_ONLY", {"enable_npugraph_ex": False}, BASIC),
        ("FULL_DECODE_ONLY", {"fuse_norm_quant": False}, [n for n in ALL if "quant" not in n]),
        ("FULL_DECODE_ONLY", {"fuse_qknorm_rope": False}, [n for n in ALL if n != "split_qkv_rmsnorm_rope"]),
        ("FULL_DECODE_ONLY", {"fuse_muls_add": False}, [n for n in ALL if n != "muls_add"]),
        ("PIECEWISE", {"fuse_norm_quant": False}, ["noop_elimination", "add_rms_norm"]),
    ],
)
def test_passes_follow_the_mode_and_the_fuse_flags(mode, acc, expected):
    assert select_pass_names(_resolution(mode, **acc)) == expected


def test_the_static_kernel_stage_runs_last_in_full_modes_only():
    passes = build_passes(_resolution("FULL_DECODE_ONLY", enable_static_kernel=True))
    assert [p.name for p in passes] == ALL + ["static_kernel"]
    assert isinstance(passes[-1], StaticKernelStage) and passes[-1].fuses is False
    piecewise = build_passes(_resolution("FULL_AND_PIECEWISE", enable_static_kernel=True))
    assert "static_kernel" not in [p.name for p in piecewise], "piecewise modes turn static kernels off"


def test_every_pass_manager_builds_its_own_pass_objects():
    resolution = _resolution("FULL_DECODE_ONLY")
    first, second = PassManager.for_resolution(resolution), PassManager.for_resolution(resolution)
    assert first.pass_names == second.pass_names == ALL
    assert all(a is not b for a, b in zip(first.passes, second.passes))


def test_static_kernel_without_npugraph_ex_is_refused_verbatim():
    with pytest.raises(ConfigError) as error:
        _resolution("FULL_DECODE_ONLY", enable_npugraph_ex=False, enable_static_kernel=True)
    assert str(error.value).startswith(STATIC_NEEDS_NPUGRAPH_EX)
    assert STATIC_NEEDS_NPUGRAPH_EX == "Static kernel generation requires npugraph_ex to be enabled."


def test_super_kernel_without_static_kernel_is_refused_verbatim():
    with pytest.raises(ConfigError) as error:
        _resolution("FULL_DECODE_ONLY", enable_super_kernel=True)
    assert str(error.value).startswith(SUPER_NEEDS_STATIC)
    assert SUPER_NEEDS_STATIC == "Super kernel generation requires static kernel to be enabled"


def test_310p_disables_npugraph_ex_static_and_super_kernel_with_warnings_and_gets_basic_passes():
    resolution = _resolution("FULL_DECODE_ONLY", soc="310P", enable_static_kernel=True)
    assert "npugraph_ex is not supported on Ascend 310P. Disabling it." in resolution.warnings
    assert not (resolution.npugraph_ex or resolution.static_kernel or resolution.super_kernel)
    assert [p.name for p in build_passes(resolution)] == BASIC
