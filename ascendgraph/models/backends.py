"""Attention backends and the graph support each one declares (docs/semantics.md §4, Ascend).

This table is data for resolution and the CLI; the engine binds each name to a kernel
implementation in `ascendgraph.models.attention`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ascendgraph.errors import ConfigError
from ascendgraph.modes import AttentionGraphSupport

__all__ = ["AttentionBackendInfo", "ATTENTION_BACKENDS", "attention_backend_info"]


@dataclass(frozen=True)
class AttentionBackendInfo:
    name: str
    display_name: str  # how vLLM Ascend's messages name the backend
    support: AttentionGraphSupport
    description: str


ATTENTION_BACKENDS: dict[str, AttentionBackendInfo] = {
    info.name: info
    for info in (
        AttentionBackendInfo("ascend", "AscendAttentionBackend", AttentionGraphSupport.ALWAYS,
                             "Ascend FIA attention with host sequence lengths; any batch can be graphed"),
        AttentionBackendInfo("mla", "AscendMLABackend", AttentionGraphSupport.UNIFORM_BATCH,
                             "multi-head latent attention (DeepSeek); only uniform batches in full graphs"),
        AttentionBackendInfo("sfa", "AscendSFABackend", AttentionGraphSupport.UNIFORM_BATCH,
                             "sparse flash attention; only uniform batches in full graphs"),
        AttentionBackendInfo("dsa", "AscendDSABackend", AttentionGraphSupport.UNIFORM_BATCH,
                             "DeepSeek sparse attention; only uniform batches in full graphs"),
        AttentionBackendInfo("gdn", "AscendGDNBackend", AttentionGraphSupport.UNIFORM_BATCH,
                             "gated delta net (linear attention); only uniform batches in full graphs"),
        AttentionBackendInfo("never", "NeverGraphBackend", AttentionGraphSupport.NEVER,
                             "test-only backend that supports no full graphs"),
    )
}


def attention_backend_info(name: str) -> AttentionBackendInfo:
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in ATTENTION_BACKENDS:
        raise ConfigError(
            f"unknown attention backend {name!r}: expected one of {', '.join(ATTENTION_BACKENDS)}",
            key="attention_backend",
        )
    return ATTENTION_BACKENDS[key]
