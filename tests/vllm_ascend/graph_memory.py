"""What vLLM Ascend's captured graphs keep alive, read with the simulator's memory ledger
(sim/memory_ledger.py): the parameter records and per-size workspaces vLLM Ascend keeps in
its ``GraphParams`` (vllm_ascend/compilation/acl_graph.py@182b75ea:300-325; draft models'
twins beside it), keyed by capture size. Used by ``--check-memory`` (conftest.py) and by
test_graph_memory.py."""

from __future__ import annotations

from typing import Any, Optional


def _params() -> list[tuple[str, Any]]:
    from vllm_ascend.compilation import acl_graph

    found = []
    for label, name in (("", "_graph_params"), ("draft ", "_draft_graph_params"),
                        ("draft prefill ", "_draft_graph_prefill_params")):
        params = getattr(acl_graph, name, None)
        if params is not None:
            found.append((label, params))
    return found


def check(graphs: Optional[dict[int, Any]] = None) -> Any:
    """`sim.facade.check_memory` over vLLM Ascend's graph parameters. ``graphs`` maps a capture
    size to its captured NPUGraph (the ledger then names the graph and its pool blocks);
    otherwise the records are named by size."""
    from sim import facade

    records: dict[Any, Any] = {}
    workspaces: dict[Any, Any] = {}
    for label, params in _params():
        for size, size_records in params.attn_params.items():
            if not size_records and params.workspaces.get(size) is None:
                continue
            key = (graphs or {}).get(size) if not label else None
            key = key if key is not None else f"{label}graph of {size} tokens"
            records[key] = size_records
            if params.workspaces.get(size) is not None:
                workspaces[key] = {size: params.workspaces[size]}
    return facade.check_memory(records=records, workspaces=workspaces)
