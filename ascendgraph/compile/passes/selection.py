"""Which passes run for a resolved configuration (docs/semantics.md §3 step 8 and §10), as a table.

=============================  =====  ==================  =======================================
pass                           basic  flag                why
=============================  =====  ==================  =======================================
noop_elimination               yes    -                   clears no-op views out of patterns
rms_norm                       no     -                   npugraph_ex's joint-graph rms_norm pass
add_rms_norm                   yes    -                   the fusion the seed's guide names
add_rms_norm_dynamic_quant     yes    fuse_norm_quant     vLLM Ascend's piecewise passes carry
add_rms_norm_quant             yes    fuse_norm_quant       the norm+quant fusion too
split_qkv_rmsnorm_rope         no     fuse_qknorm_rope    npugraph_ex pass; head_dim 128, bf16
muls_add                       no     fuse_muls_add       npugraph_ex pass
=============================  =====  ==================  =======================================

By mode: NONE compiles nothing (no passes). FULL / FULL_DECODE_ONLY with npugraph_ex on
run every pass whose flag is on, in table order (no-op views first, so they never sit
inside a pattern; decomposed norms become ``rms_norm`` before ``add + rms_norm`` is looked
for; the quant fusions match the ``add_rms_norm`` nodes that pass made), then the static
kernel stage when ``enable_static_kernel`` resolved on. PIECEWISE / FULL_AND_PIECEWISE —
and a FULL mode with npugraph_ex off, which vLLM Ascend compiles with its plain fusion
pass manager — run the *basic* passes only.

Flags are the resolved ones (`Resolution.npugraph_ex`, `.static_kernel`) and the fuse
switches of ``ascend_compilation_config``. Pass objects are built fresh for every call,
so each pass manager owns its pattern registrations.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from ascendgraph.modes import GraphMode

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.compile.pass_manager import GraphPass, PassManager
    from ascendgraph.models.presets import ModelSpec
    from ascendgraph.resolve import Resolution

__all__ = ["PassRule", "PASS_RULES", "build_passes", "select_pass_names", "fused_ops"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassRule:
    name: str
    basic: bool  # also runs in piecewise modes (and in FULL modes with npugraph_ex off)
    flag: Optional[str]  # ascend_compilation_config switch, None: always on
    reason: str


PASS_RULES: tuple[PassRule, ...] = (
    PassRule("noop_elimination", True, None, "no-op views/reshapes would sit inside fusion patterns"),
    PassRule("rms_norm", False, None, "npugraph_ex turns a decomposed RMSNorm into the rms_norm kernel"),
    PassRule("add_rms_norm", True, None, "residual add + rms_norm -> one kernel (the seed's example fusion)"),
    PassRule("add_rms_norm_dynamic_quant", True, "fuse_norm_quant",
             "W8A8 dynamic quant right after the norm fuses into it (vLLM Ascend runs it in piecewise modes too)"),
    PassRule("add_rms_norm_quant", True, "fuse_norm_quant",
             "W8A8 static quant right after the norm fuses into it (vLLM Ascend runs it in piecewise modes too)"),
    PassRule("split_qkv_rmsnorm_rope", False, "fuse_qknorm_rope",
             "npugraph_ex: qkv split + q/k norm + rope -> one kernel (head_dim 128, bfloat16)"),
    PassRule("muls_add", False, "fuse_muls_add", "npugraph_ex: x * scale + y -> one kernel"),
)


def _flag_on(resolution: "Resolution", flag: Optional[str]) -> bool:
    if flag is None:
        return True
    return bool(getattr(resolution.config.ascend_compilation_config, flag))


def select_pass_names(resolution: "Resolution") -> list[str]:
    """Names of the passes a resolution runs, in order (the table above)."""
    mode = resolution.mode
    if mode is GraphMode.NONE:
        return []
    npugraph_ex = resolution.npugraph_ex and mode.has_full_graphs() and not mode.requires_piecewise_compilation()
    return [rule.name for rule in PASS_RULES if (npugraph_ex or rule.basic) and _flag_on(resolution, rule.flag)]


def _factories(spec: "ModelSpec") -> dict[str, Callable[[], Any]]:
    from ascendgraph.compile.passes import patterns
    from ascendgraph.compile.passes.fusion import FusionPass
    from ascendgraph.compile.passes.noop import NoopEliminationPass

    eps = patterns.registered_eps(spec.rms_norm_eps)

    def qknorm_rope() -> Any:
        families = []
        if spec.qk_norm and spec.attention == "mha":
            if spec.head_dim == patterns.QKNORM_ROPE_HEAD_DIM:
                families.append(
                    patterns.split_qkv_rmsnorm_rope_family(
                        eps,
                        num_heads=spec.num_attention_heads,
                        num_kv_heads=spec.num_key_value_heads,
                        head_dim=spec.head_dim,
                    )
                )
            else:
                log.debug(
                    "split_qkv_rmsnorm_rope not registered: the kernel takes head_dim %d, model %s has %d",
                    patterns.QKNORM_ROPE_HEAD_DIM, spec.name, spec.head_dim,
                )
        return FusionPass("split_qkv_rmsnorm_rope", families)

    return {
        "noop_elimination": NoopEliminationPass,
        "rms_norm": lambda: FusionPass("rms_norm", [patterns.rms_norm_family(eps)]),
        "add_rms_norm": lambda: FusionPass("add_rms_norm", [patterns.add_rms_norm_family(eps)]),
        "add_rms_norm_dynamic_quant": lambda: FusionPass(
            "add_rms_norm_dynamic_quant", [patterns.add_rms_norm_dynamic_quant_family(eps)]
        ),
        "add_rms_norm_quant": lambda: FusionPass("add_rms_norm_quant", [patterns.add_rms_norm_quant_family(eps)]),
        "split_qkv_rmsnorm_rope": qknorm_rope,
        "muls_add": lambda: FusionPass("muls_add", [patterns.muls_add_family()]),
    }


def build_passes(resolution: "Resolution") -> list["GraphPass"]:
    """Fresh pass objects for a resolved configuration (`PassManager.for_resolution` calls this)."""
    names = select_pass_names(resolution)
    if not names:
        return []
    factories = _factories(resolution.config.model)
    passes: list[Any] = [factories[name]() for name in names]
    if resolution.static_kernel and resolution.mode.has_full_graphs() and not resolution.mode.requires_piecewise_compilation():
        from ascendgraph.compile.static_kernel import StaticKernelStage

        passes.append(StaticKernelStage.for_resolution(resolution))
    log.debug("passes for %s: %s", resolution.mode.name, ", ".join(p.name for p in passes))
    return passes


def fused_ops(pass_manager: "PassManager") -> dict[str, int]:
    """{fusion pass name: matches replaced} of a pass manager's first compiled graph (stages that
    fuse nothing, such as the static kernel build, are left out)."""
    fusion_names = [p.name for p in pass_manager.passes if getattr(p, "fuses", True)]
    matches = pass_manager.matches
    return {name: int(matches.get(name, 0)) for name in fusion_names}
