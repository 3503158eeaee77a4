"""What each captured graph keeps alive, and why: the simulator's memory ledger per graph.

Why. A captured graph replays into memory handed to its capture by the graph pool (docs/
simulator.md "Pool memory"). vLLM shares one pool across capture sizes and turns what it
keeps of a capture into weak references (graph outputs: vllm/compilation/cuda_graph.py;
vLLM Ascend's attention parameter records and per-size workspaces:
vllm_ascend/attention/attention_v1.py@182b75ea 1030-1059, 1171-1189, 1247-1262 and
compilation/acl_graph.py ``weak_ref_workspaces``, 227-229, 270-276), so the pool costs about
its largest graph. A strong reference kept after capture holds its block, the next capture
into the pool cannot be handed it, and on a card the device memory grows with every
capture size; tensors a parameter record holds strongly outside the pool stay alive as
long as the record (the process), whoever else drops them.

What. `graph_ledgers(device, ...)` lists, per graph, the tensors it keeps alive:

* ``pool block``: the bytes its capture was handed and its replays write (the graph itself
  keeps them: one entry per graph);
* ``captured output``: a block of its capture still held by a live tensor outside the
  graph (the caller kept an output or an intermediate);
* ``parameter record``: a tensor a registered parameter record holds (``records``: per
  graph, any nesting of tuples, lists, dicts, dataclasses and objects), strongly or weakly;
* ``workspace``: a tensor a registered workspace cache holds (``workspaces``).

`check_memory(device, records=..., workspaces=...)` turns the ledgers into findings:

* ``strong_reference``: a tensor a parameter record holds strongly, which a weak reference
  (``torch_npu._C._weak_ref_tensor``) would have served: the record re-issues the kernel into
  the captured addresses, so the memory must be owned elsewhere anyway;
* ``pool_growth``: in a pool shared by several graphs, blocks still held after their
  capture by graphs other than the one that holds the most: a card's pool grows by that
  much with each capture size, beyond the largest graph.

`beyond_pool_bytes(device)` is the pool growth summed over the device's pools: the facade
adds it to ``torch.npu.memory_allocated()`` (the simulator's pool accounting charges each
pool its largest graph, as if every block could be reused).

What the ledger does not see (docs/facade.md "Memory held by graphs"): tensors outside the
graph pools that no registered record holds (a module global, a closure), pinned host
memory, and what the caller's own objects keep unless they are passed as records.

The simulator's state is read through `SimDevice.graph_pools`, `SimPool.arena_if_made`,
`SimDevice.pool_allocation` and the pool arena's public fields: nothing private.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Union

import torch

from sim.graph import SimGraph
from sim.pool_memory import PoolAllocation, PoolWeakTensor

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice

__all__ = [
    "POOL_BLOCK",
    "CAPTURED_OUTPUT",
    "PARAMETER_RECORD",
    "WORKSPACE",
    "HeldTensor",
    "GraphLedger",
    "MemoryFinding",
    "MemoryCheck",
    "graph_ledgers",
    "check_memory",
    "beyond_pool_bytes",
]

POOL_BLOCK = "pool block"
CAPTURED_OUTPUT = "captured output"
PARAMETER_RECORD = "parameter record"
WORKSPACE = "workspace"
_MAX_DEPTH = 8  # how deep a record is walked

GraphKey = Union["SimGraph", str, Any]  # a SimGraph, its name, or an object with ``sim_graph`` (the facade's NPUGraph)


@dataclass(frozen=True)
class HeldTensor:
    """One thing a graph keeps alive: why, where it is held, how many bytes."""

    graph: str
    why: str
    holder: str
    nbytes: int
    shape: tuple[int, ...] = ()
    dtype: str = ""
    strong: bool = True
    in_pool: bool = False  # a block of the graph pool (it keeps the pool from reusing it)

    def describe(self) -> str:
        held = "strongly" if self.strong else "weakly"
        where = "a pool block" if self.in_pool else "memory outside the pool"
        shape = f" {list(self.shape)} {self.dtype}" if self.shape or self.dtype else ""
        return f"{self.why}: {self.holder}{shape}, {self.nbytes} bytes of {where}, held {held}"


@dataclass
class GraphLedger:
    """The tensors one graph keeps alive."""

    graph: str
    pool: Any = None  # its SimPoolHandle (None when not known)
    held: list[HeldTensor] = field(default_factory=list)

    def bytes(self, why: Optional[str] = None, *, strong_only: bool = True) -> int:
        return sum(entry.nbytes for entry in self.held
                   if (why is None or entry.why == why) and (entry.strong or not strong_only))

    @property
    def pool_blocks_held(self) -> int:
        """Bytes of its pool blocks a live tensor outside the graph still holds."""
        return sum(entry.nbytes for entry in self.held if entry.in_pool and entry.strong and entry.why != POOL_BLOCK)


@dataclass(frozen=True)
class MemoryFinding:
    """Memory a graph (or a pool of graphs) holds that it need not."""

    kind: str  # "strong_reference" | "pool_growth"
    graph: str
    nbytes: int
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} ({self.graph}, {self.nbytes} bytes): {self.detail}"


@dataclass
class MemoryCheck:
    """`check_memory`'s answer: the ledgers and the findings."""

    ledgers: list[GraphLedger]
    findings: list[MemoryFinding]

    @property
    def ok(self) -> bool:
        return not self.findings

    def report(self) -> str:
        lines = []
        for ledger in self.ledgers:
            lines.append(f"{ledger.graph}:")
            lines.extend(f"  {entry.describe()}" for entry in ledger.held)
        lines.append("findings:" if self.findings else "findings: none")
        lines.extend(f"  {finding}" for finding in self.findings)
        return "\n".join(lines)


# --------------------------------------------------------------------------- reading the simulator


def _graph_name(key: GraphKey) -> str:
    if isinstance(key, str):
        return key
    graph = getattr(key, "sim_graph", key)
    return str(getattr(graph, "name", key))


def _graph_of(key: GraphKey) -> Optional[SimGraph]:
    graph = getattr(key, "sim_graph", key)
    return graph if isinstance(graph, SimGraph) else None


def _live_blocks(device: "SimDevice") -> list[tuple[Any, PoolAllocation]]:
    """(pool handle, block) of every pool block a live tensor still holds."""
    blocks = []
    for pool in device.graph_pools():
        arena = pool.arena_if_made
        if arena is None:
            continue
        for allocation in list(arena.live.values()):
            # a raw block (an npu tensor's, sim.npu_device) is live until its tensor frees it
            if allocation.user_storage is None or allocation.user_storage() is not None:
                blocks.append((pool.handle, allocation))
    return blocks


def _is_weak(value: torch.Tensor) -> bool:
    if isinstance(value, PoolWeakTensor):
        return True
    if value.device.type == "npu":  # torch_npu._C._weak_ref_tensor on the npu device: a plain tensor
        from sim.npu_device import is_weak_alias

        return is_weak_alias(value)
    try:
        from sim.facade.weak_refs import WeakRefTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(value, WeakRefTensor)


def _walk(value: Any, path: str, seen: set[int], depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a record, with where it sits."""
    if isinstance(value, torch.Tensor):
        yield path, value
        return
    if depth >= _MAX_DEPTH or id(value) in seen or value is None or isinstance(value, (str, bytes, int, float, bool)):
        return
    seen.add(id(value))
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, f"{path}[{key!r}]", seen, depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]", seen, depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            yield from _walk(getattr(value, item.name), f"{path}.{item.name}", seen, depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module)) and not callable(value):
        for key, item in vars(value).items():
            yield from _walk(item, f"{path}.{key}", seen, depth + 1)


def _nbytes(tensor: torch.Tensor) -> int:
    return int(tensor.untyped_storage().nbytes())


def _entry(graph: str, why: str, holder: str, tensor: torch.Tensor, device: "SimDevice") -> HeldTensor:
    strong = not _is_weak(tensor)
    block = device.pool_allocation(tensor) if strong else None
    nbytes = (block.size if block is not None else _nbytes(tensor)) if strong else 0
    return HeldTensor(graph, why, holder, nbytes, tuple(int(s) for s in tensor.shape),
                      str(tensor.dtype).replace("torch.", ""), strong, block is not None)


# --------------------------------------------------------------------------- the ledger


def graph_ledgers(device: "SimDevice", *, graphs: tuple[GraphKey, ...] = (),
                  records: Optional[Mapping[GraphKey, Any]] = None,
                  workspaces: Optional[Mapping[GraphKey, Any]] = None) -> list[GraphLedger]:
    """Per graph, the tensors it keeps alive and why (module docstring). ``graphs`` adds
    graphs holding nothing outside themselves; ``records`` / ``workspaces`` are the caller's
    parameter records and workspace caches, per graph."""
    records, workspaces = dict(records or {}), dict(workspaces or {})
    ledgers: dict[str, GraphLedger] = {}

    def ledger(name: str) -> GraphLedger:
        return ledgers.setdefault(name, GraphLedger(name))

    for key in (*graphs, *records, *workspaces):
        graph = _graph_of(key)
        book = ledger(_graph_name(key))
        if graph is not None and graph.is_captured and not any(e.why == POOL_BLOCK for e in book.held):
            book.pool = graph.pool()
            book.held.append(HeldTensor(book.graph, POOL_BLOCK, "the graph's replays", int(graph.pool_bytes),
                                        in_pool=True))
    claimed: set[int] = set()  # blocks a registered record or cache accounts for
    for why, registry in ((PARAMETER_RECORD, records), (WORKSPACE, workspaces)):
        for key, value in registry.items():
            name = _graph_name(key)
            label = "records" if why == PARAMETER_RECORD else "workspaces"
            for path, tensor in _walk(value, f"{label}[{name}]", set()):
                entry = _entry(name, why, path, tensor, device)
                ledger(name).held.append(entry)
                block = device.pool_allocation(tensor) if entry.strong else None
                if block is not None:
                    claimed.add(id(block))
    for pool, block in _live_blocks(device):
        if id(block) in claimed or not block.owner.alive:
            continue
        book = ledger(block.owner.name)
        book.pool = book.pool or pool
        book.held.append(HeldTensor(book.graph, CAPTURED_OUTPUT, "a live tensor outside the graph", block.size,
                                    strong=True, in_pool=True))
    return list(ledgers.values())


def _pool_growth(device: "SimDevice", ledgers: list[GraphLedger]) -> list[MemoryFinding]:
    """Blocks held after capture in pools that several graphs share."""
    held: dict[Any, dict[str, int]] = {}
    for pool, block in _live_blocks(device):
        if block.owner.alive:
            per_graph = held.setdefault(pool, {})
            per_graph[block.owner.name] = per_graph.get(block.owner.name, 0) + block.size
    findings = []
    for pool, per_graph in held.items():
        if len(per_graph) < 2:
            continue
        largest = max(per_graph, key=per_graph.__getitem__)
        growth = sum(per_graph.values()) - per_graph[largest]
        names = ", ".join(f"{name} {nbytes} bytes" for name, nbytes in sorted(per_graph.items()))
        findings.append(MemoryFinding(
            "pool_growth", ", ".join(sorted(per_graph)), growth,
            f"graphs sharing pool {pool.pool_id} still hold blocks of their captures ({names}): no later capture "
            f"can be handed them, so the pool grows by {growth} bytes beyond {largest}'s with each capture size "
            "(hold them through weak references, torch_npu._C._weak_ref_tensor, once the capture ended)"))
    return findings


def check_memory(device: "SimDevice", *, records: Optional[Mapping[GraphKey, Any]] = None,
                 workspaces: Optional[Mapping[GraphKey, Any]] = None, graphs: tuple[GraphKey, ...] = ()) -> MemoryCheck:
    """The ledgers of the device's graphs and what they hold that they need not (module docstring)."""
    ledgers = graph_ledgers(device, graphs=graphs, records=records, workspaces=workspaces)
    findings = []
    for book in ledgers:
        for entry in book.held:
            if entry.why == PARAMETER_RECORD and entry.strong:
                where = "a block of the graph pool" if entry.in_pool else "memory outside the graph pool"
                findings.append(MemoryFinding(
                    "strong_reference", book.graph, entry.nbytes,
                    f"{entry.holder} ({list(entry.shape)} {entry.dtype}) holds {where} strongly; the record re-issues "
                    "the kernel into the captured address, so a weak reference (torch_npu._C._weak_ref_tensor) "
                    "serves it and leaves the memory to its owner"))
    findings.extend(_pool_growth(device, ledgers))
    return MemoryCheck(ledgers, findings)


def beyond_pool_bytes(device: "SimDevice") -> int:
    """Bytes the device's shared pools hold beyond their largest graph (the pool growth)."""
    return sum(finding.nbytes for finding in _pool_growth(device, []))
