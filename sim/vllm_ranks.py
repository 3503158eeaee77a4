"""vLLM's own ``parallel_state`` on fabric ranks: each rank thread gets its own groups.

`VllmRanks.run(body)` runs ``body(rank)`` on a thread per rank (`sim.process_group.FabricWorld`)
after giving that thread its own vLLM ``GroupCoordinator`` objects for the groups of the
``[DP][PP][TP]`` layout (`ascendgraph.parallel.layout`, vLLM's order): ``world``, ``dp``,
``pp``, ``tp`` and ``ep``, each with a *device* group and a *CPU* group that are separate
communicators on the fabric (``dp:device`` and ``dp:cpu`` meet only their own kind, as an HCCL
group and a gloo group do), plus ``dp:engine``, the engine core's own DP group that
``ParallelConfig.sync_dp_state`` all-reduces on (vLLM ``v1/engine/core.py``
``DPEngineCoreProc._has_global_unfinished_reqs``; a stateless group of its own, so a
collective there never meets the workers' DP sync).

vLLM keeps its groups in module globals (``vllm/distributed/parallel_state.py``: ``_WORLD``,
``_DP``, ``_TP``, ``_PP``, ``_EP``). For the run they hold a proxy that forwards every
attribute to the calling thread's own ``GroupCoordinator``, so ``get_dp_group()`` in vLLM's
and vLLM Ascend's unmodified code answers each rank with its own group. The coordinators are
vLLM's class, built without its ``__init__`` (which creates the CPU group with the hard-coded
``gloo`` backend, a real network group) and given the fabric's groups; no device communicator
(the collectives under test call ``torch.distributed`` on the groups directly).

Whole model runners as ranks (tests/vllm_ascend/runner_ranks.py) need more: vLLM and vLLM
Ascend keep other per-process state in module globals (the forward context, the current
config, vLLM Ascend's config, graph parameters, cos/sin caches and streams of the process's
NPU...), which functions read with ``global``, so a proxy cannot stand in. `PerRankGlobals`
gives each rank its own copy of such globals: given to `VllmRanks`, the rank threads run one
at a time (`sim.fabric.RankSwitch`: a thread runs until it waits in a collective), and as a
thread takes over, its copies are put in place and the previous thread's are kept aside. Each
rank starts from the value a fresh process has (``Slot.fresh``).

vLLM is imported lazily: this module is for environments that have it (``make vllm-ascend``,
the bench's vLLM row).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import torch
import torch.distributed as dist

from ascendgraph.parallel.layout import ParallelLayout
from sim.fabric import FabricStats
from sim.process_group import FROM_ENVIRONMENT, FabricWorld, FromEnvironment

__all__ = ["VllmRanks", "GROUP_GLOBALS", "PerRankGlobals", "Slot", "module_slot"]

# vLLM parallel_state global -> our group kind
GROUP_GLOBALS = {"_WORLD": "world", "_DP": "dp", "_PP": "pp", "_TP": "tp", "_EP": "ep"}


class _ThreadGroup:
    """Stands in vLLM's module global: forwards to the calling thread's coordinator."""

    def __init__(self, local: threading.local, kind: str) -> None:
        object.__setattr__(self, "_local", local)
        object.__setattr__(self, "_kind", kind)

    def _mine(self) -> Any:
        groups = getattr(self._local, "groups", None)
        if groups is None:
            raise RuntimeError(f"vLLM's {self._kind} group is read outside a fabric rank thread")
        return groups[self._kind]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mine(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._mine(), name, value)


@dataclass(frozen=True)
class Slot:
    """One piece of per-process state: how to read it, write it, and what a fresh process holds."""

    name: str
    get: Callable[[], Any]
    put: Callable[[Any], None]
    fresh: Callable[[], Any]


def _none() -> None:
    return None


def module_slot(module: str, attribute: str, fresh: Callable[[], Any] = _none) -> Slot:
    """A module global (``module.attribute``) as a `Slot`; ``fresh`` makes a fresh process's value."""
    def get() -> Any:
        return getattr(importlib.import_module(module), attribute)

    def put(value: Any) -> None:
        setattr(importlib.import_module(module), attribute, value)

    return Slot(f"{module}.{attribute}", get, put, fresh)


class PerRankGlobals:
    """Each rank's own copy of ``slots`` (module docstring); a `sim.fabric.RankSwitch`."""

    def __init__(self, slots: Sequence[Slot]) -> None:
        self.slots = tuple(slots)
        self._values: dict[int, dict[str, Any]] = {}
        self._saved: Optional[dict[str, Any]] = None

    def enter(self, rank: int) -> None:
        values = self._values.setdefault(rank, {slot.name: slot.fresh() for slot in self.slots})
        for slot in self.slots:
            slot.put(values[slot.name])

    def leave(self, rank: int) -> None:
        self._values[rank] = {slot.name: slot.get() for slot in self.slots}

    def value(self, rank: int, name: str) -> Any:
        """``rank``'s value of the slot ``name`` as it left it."""
        return self._values[rank][name]

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The process's own values are put back when the run ends."""
        saved = {slot.name: slot.get() for slot in self.slots}
        try:
            yield
        finally:
            for slot in self.slots:
                slot.put(saved[slot.name])


class VllmRanks:
    """A ``layout`` of ranks as threads, each with vLLM's groups on the fabric; with
    ``per_rank_globals``, one rank thread runs at a time, each with its own copy of those
    globals (module docstring)."""

    def __init__(self, layout: ParallelLayout, *, seed: int = 0,
                 timeout_s: Union[float, None, FromEnvironment] = FROM_ENVIRONMENT,
                 clock: Optional[Callable[[int], float]] = None,
                 per_rank_globals: Optional[PerRankGlobals] = None) -> None:
        self.layout = layout
        self.per_rank_globals = per_rank_globals
        self.world = FabricWorld(layout.world_size, seed=seed, timeout_s=timeout_s, clock=clock,
                                 switch=per_rank_globals)
        self._local = threading.local()

    # -- per rank thread ----------------------------------------------------------------
    def group(self, kind: str) -> Any:
        """The calling thread's vLLM GroupCoordinator of ``kind`` (world, dp, pp, tp, ep)."""
        return self._local.groups[kind]

    def engine_dp_group(self) -> Any:
        """The calling thread's engine-core DP group (``ParallelConfig.sync_dp_state``'s)."""
        return self._local.engine_dp

    def _coordinator(self, kind: str, rank: int, device: torch.device) -> Any:
        return self.coordinator(kind, [list(g) for g in self.layout.groups(kind)], rank, device)

    def coordinator(self, kind: str, all_groups: Sequence[Sequence[int]], rank: int, device: torch.device) -> Any:
        """A vLLM ``GroupCoordinator`` for ``rank`` of the groups ``all_groups`` (every rank makes
        every group, in the same order, as vLLM does), fingerprinted as ``kind:device`` /
        ``kind:cpu``; built without its ``__init__`` (module docstring), no device communicator."""
        from vllm.distributed.parallel_state import GroupCoordinator

        all_groups = [list(g) for g in all_groups]
        mine = next(g for g in all_groups if rank in g)
        device_group = cpu_group = None
        for ranks in all_groups:  # every rank creates every group, in the same order, as vLLM does
            d = dist.new_group(ranks, group_desc=f"{kind}:device")
            c = dist.new_group(ranks, group_desc=f"{kind}:cpu")
            if ranks == mine:
                device_group, cpu_group = d, c
        coordinator = object.__new__(GroupCoordinator)
        fields = dict(unique_name=f"{kind}:{all_groups.index(mine)}", rank=rank, ranks=mine, world_size=len(mine),
                      rank_in_group=mine.index(rank), local_rank=rank, device_index=rank, group_ranks=all_groups,
                      cpu_group=cpu_group, device_group=device_group, device=device,
                      torch_distributed_backend=dist.get_backend(), use_device_communicator=False,
                      device_communicator=None, mq_broadcaster=None, use_custom_op_call=False)
        coordinator.__dict__.update(fields)
        return coordinator

    def _set_up(self, rank: int, device: torch.device) -> None:
        groups = {kind: self._coordinator(kind, rank, device) for kind in ("world", "dp", "pp", "tp", "ep")}
        engine = None
        for ranks in self.layout.groups("dp"):
            group = dist.new_group(list(ranks), group_desc="dp:engine")
            if rank in ranks:
                engine = group
        self._local.groups = groups
        self._local.engine_dp = engine

    @contextlib.contextmanager
    def _globals(self) -> Iterator[None]:
        from vllm.distributed import parallel_state

        saved = {name: getattr(parallel_state, name, None) for name in GROUP_GLOBALS}
        for name, kind in GROUP_GLOBALS.items():
            setattr(parallel_state, name, _ThreadGroup(self._local, kind))
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(parallel_state, name, value)

    def run(self, body: Callable[[int], Any], *, device: Optional[torch.device] = None) -> FabricStats:
        """``body(rank)`` on a thread per rank with its own vLLM groups; raise the run's error."""
        where = device or torch.device("cpu")

        def with_groups(rank: int) -> Any:
            self._set_up(rank, where)
            try:
                return body(rank)
            finally:
                self._local.groups = None

        installed = self.per_rank_globals.installed() if self.per_rank_globals is not None else contextlib.nullcontext()
        with self._globals(), installed:
            return self.world.run(with_groups)
