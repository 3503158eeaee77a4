"""The fabric as a ``torch.distributed`` backend: ranks as threads, every collective a meeting.

Theory of operation. `FabricWorld.run` starts one thread per rank (`sim.fabric.FabricThreads`).
For the duration of the run, torch's process-group bookkeeping (``distributed_c10d._world``)
is made thread-local and ``_set_thread_isolation_mode(True)`` makes the C++ registry of group
names thread-local too (torch's own ``torch/testing/_internal/distributed/multi_threaded_pg.py``
shows the mechanics), so each thread calls ``init_process_group(backend="ascendgraph", ...)``
and ``new_group(...)`` as its own process would. The backend is registered by name with
``torch.distributed.Backend.register_backend`` (`register`); its groups are
`FabricProcessGroup`, a Python ``ProcessGroup`` subclass whose collectives (all_reduce,
all_gather and all_gather_single, all_to_all and all_to_all_single, reduce_scatter and
reduce_scatter_single, broadcast, barrier, send / recv; torch's deprecated spellings
all_gather_into_tensor and reduce_scatter_tensor, which vLLM calls, reach the same methods)
meet in the fabric: fingerprinted
(the group's description, e.g. ``dp:cpu``, its members, op, shape, dtype, how it runs),
checked against the compatibility rules, completed at the latest arrival on the ranks'
virtual clocks, bounded by HCCL_EXEC_TIMEOUT, and written to the flight record. The data
moves when the last member arrives (in rank order, so a run is deterministic whatever the
threads' interleaving).

Captured collectives. A rank thread that captures a graph on its own simulated device
(``device.graph(graph)``, sim.capture) and calls a collective inside the capture does not meet
its peers then: the collective is recorded into the graph (the op
``ascendgraph_fabric::captured``, whose handle names it) and meets at each replay of the graph
(when the device runs it: a replay queues behind the host, docs/simulator.md),
its fingerprint saying ``graph:<the graph's name>``, so the rules ``graph_never_meets_eager``
and ``same_graph_key`` apply; the replay's data moves. The captured collectives are an
all_reduce of one tensor, broadcast, all_gather_single, reduce_scatter_single,
all_to_all_single and `FabricProcessGroup.moe_distribute`; any other inside a capture is
refused by name. `FabricWorld.replaying(key)` marks collectives issued outside a capture as
replays of the graph ``key`` (for a caller that models the replay itself).

Ranks on simulated NPUs. Members whose tensors are npu tensors on different simulated NPUs
(`sim.facade.configure_devices`, one per rank) exchange their bytes through host views of
each member's memory, taken once its NPU has run its work up to the collective. A collective of
host tensors (a CPU group's, as gloo's) first lets the rank's NPU run what its host queued (a
card keeps running while its host blocks; the simulator's NPU otherwise runs queued work only
when the host waits for it).

The wait limit is HCCL's execution timeout as the process environment sets it
(``HCCL_EXEC_TIMEOUT``, the AIV default under ``HCCL_OP_EXPANSION_MODE=AIV``), unless the
world is given one.

A rank's thread that raises never arrives again: its peers end with ``CollectiveTimeout``
naming it (the straggler), never a hang. Only one `FabricWorld` runs at a time in a process.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import threading
import weakref
from datetime import timedelta
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]  # torch's Python-backend helper, not in its stubs
from torch.distributed import distributed_c10d as c10d
from torch.futures import Future
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from ascendgraph.errors import ConfigError
from ascendgraph.parallel.fingerprints import EAGER, default_collective_timeout_s, graph_how
from ascendgraph.parallel.layout import MAX_WORLD_SIZE, ParallelLayout
from sim.fabric import Collective, Decision, Fabric, FabricStats, FabricThreads, RankSwitch
from sim.recorder import CaptureRecorder

__all__ = ["BACKEND_NAME", "FROM_ENVIRONMENT", "FromEnvironment", "FabricProcessGroup", "FabricWorld", "register"]

BACKEND_NAME = "ascendgraph"


class FromEnvironment:
    """The default of ``timeout_s``: HCCL's execution timeout from the process environment."""

    def __repr__(self) -> str:
        return "FROM_ENVIRONMENT"


FROM_ENVIRONMENT = FromEnvironment()
_RUN_LOCK = threading.Lock()  # one FabricWorld at a time: torch's bookkeeping is patched while it runs
_current = threading.local()  # .world, .rank, .replay (per rank thread)


def register() -> None:
    """Register the ``ascendgraph`` backend with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create_group, extended_api=True, devices=["cpu"])


def _create_group(options: Any, _backend_options: Any) -> "FabricProcessGroup":
    world: Optional[FabricWorld] = getattr(_current, "world", None)
    if world is None:
        raise RuntimeError("the ascendgraph backend makes groups only inside FabricWorld.run (sim.process_group)")
    members = tuple(options.global_ranks_in_group) or tuple(range(options.group_size))
    return FabricProcessGroup(world, options.group_rank, options.group_size, tuple(sorted(members)))


def _work(result: Any = None) -> Any:
    future: Future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


_REDUCE_NAMES = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max", dist.ReduceOp.MIN: "min",
                 dist.ReduceOp.PRODUCT: "product", dist.ReduceOp.AVG: "avg"}


def _op_name(op: Any) -> str:
    return _REDUCE_NAMES.get(getattr(op, "op", op), "sum")


def _reduce(op: Any, stacked: torch.Tensor) -> torch.Tensor:
    name = _op_name(op)
    if name == "max":
        return stacked.amax(dim=0)
    if name == "min":
        return stacked.amin(dim=0)
    if name == "product":
        return stacked.prod(dim=0)
    if name == "avg":
        return stacked.sum(dim=0) / stacked.shape[0]
    return stacked.sum(dim=0)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


# combine(inputs, outputs): every member's input and output tensor, in rank order; it fills the outputs.
_Combine = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], Any]


def _on_host(source: torch.Tensor, target: torch.Tensor, op: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The (input, output) a meeting combines: for npu tensors, host views of their memory once
    their simulated NPU has run its work up to the collective (`sim.npu_device.settled_host_view`),
    so members on different simulated NPUs (one per rank) exchange data as HCCL does between
    cards; other tensors as they are."""
    if source.device.type != "npu" and target.device.type != "npu":
        return source, target
    from sim import npu_device

    what = f"{op} of the ascendgraph backend"
    host_source = npu_device.settled_host_view(source, what) if source.device.type == "npu" else source
    if target is source:
        return host_source, host_source
    return host_source, npu_device.settled_host_view(target, what) if target.device.type == "npu" else target


def _device_runs_while_host_blocks(what: str) -> None:
    """A collective of host tensors (a CPU group's, as gloo's) blocks the rank's host while its
    NPU keeps running: the rank's simulated NPU (`sim.npu_device`, when one is attached) runs what
    its host queued before (a graph replay whose captured collectives meet the peers'), which the
    simulator otherwise runs only when the host waits for the device. Without it a rank whose
    replay is still queued would sit in the next DP sync while its peer's replay waits for that
    replay's collective: a deadlock no card has. (A program whose ranks order a device
    collective and a host one differently is reported as a deadlock a card could pass:
    docs/ranks.md.)"""
    from sim import npu_device

    npu_device.run_queued_work(f"{what}: the host blocks, the NPU runs its queued work")


def _pairs(combine: _Combine) -> Callable[[Mapping[int, Any]], Mapping[int, None]]:
    """A one-tensor combine as the fabric calls it: payloads (input, output) by rank."""
    def run(payloads: Mapping[int, Any]) -> Mapping[int, None]:
        order = sorted(payloads)
        combine([payloads[r][0] for r in order], [payloads[r][1] for r in order])
        return {r: None for r in payloads}
    return run


def _capturing_graph() -> Optional[str]:
    """The name of the graph this thread's simulated device is capturing, or None (the
    capture's recorder is a dispatch mode on this thread's mode stack: sim.capture)."""
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, CaptureRecorder):
            return str(mode.capture.graph.name)
    return None


class _CapturedCollective:
    """One collective recorded into a graph: the op ``ascendgraph_fabric::captured`` carries its
    handle, and each replay of the graph runs `replay`, a meeting as ``graph:<key>``."""

    def __init__(self, group: "FabricProcessGroup", op: str, out_shape: tuple[int, ...], dtype: torch.dtype,
                 combine: _Combine, how: str, params: tuple[tuple[str, int], ...]) -> None:
        self.group, self.op, self.out_shape, self.dtype = group, op, out_shape, dtype
        self.combine, self.how, self.params = combine, how, params
        self.handle = next(_HANDLES)
        _CAPTURED[self.handle] = self

    def replay(self, x: torch.Tensor) -> torch.Tensor:
        if not self.group._world.running():
            raise RuntimeError(f"simulator: a graph holding {self.op} of the ascendgraph backend is replayed after "
                               "its FabricWorld.run ended; replay it inside the run (docs/ranks.md)")
        out = torch.empty(self.out_shape, dtype=self.dtype, device=x.device)
        self.group._meet(self.op, x, _on_host(x, out, self.op), _pairs(self.combine), how=self.how, params=self.params)
        return out


_HANDLES = itertools.count()
# handle -> captured collective; a FabricWorld holds its own strongly (`FabricWorld.hold`)
_CAPTURED: "weakref.WeakValueDictionary[int, _CapturedCollective]" = weakref.WeakValueDictionary()


@torch.library.custom_op("ascendgraph_fabric::captured", mutates_args=(), device_types=None,
                         schema="(Tensor x, int handle) -> Tensor")
def _captured_op(x: torch.Tensor, handle: int) -> torch.Tensor:
    """A collective recorded into a graph (`_CapturedCollective`): runs at replay."""
    return _CAPTURED[handle].replay(x)


@_captured_op.register_fake
def _(x: torch.Tensor, handle: int) -> torch.Tensor:
    entry = _CAPTURED[handle]
    return x.new_empty(entry.out_shape, dtype=entry.dtype)


class FabricProcessGroup(dist.ProcessGroup):
    """One rank's handle on a group of the fabric (see the module docstring)."""

    def __init__(self, world: "FabricWorld", rank: int, size: int, members: tuple[int, ...]) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the (rank, size) constructor of a Python backend, absent from torch's stubs
        self._world = world
        self._rank_in_group = rank
        self.members = members
        self.global_rank = members[rank]

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def _get_backend(self, device: torch.device) -> "FabricProcessGroup":  # type: ignore[override]  # c10d's stub returns its C++ Backend; the fabric group is its own backend
        """The group's backend for ``device``: the group itself (it is its own backend, for the
        host and the simulated NPUs). vLLM Ascend's MoE token dispatchers ask the NPU backend
        of their EP / MC2 group for its HCCL communicator name at construction
        (ops/fused_moe/token_dispatcher.py:116-119, 493-495 @182b75ea)."""
        return self

    def get_hccl_comm_name(self, rank: int, init_comm: bool = True) -> str:
        """torch_npu's ``ProcessGroupHCCL.get_hccl_comm_name(rank, init_comm)``: the name of
        the group's communicator (on the fabric: its description and members, one name per
        group), what the MC2 / all-to-all kernels take as ``group_ep``."""
        return f"{self.kind}@{','.join(map(str, self.members))}"

    @property
    def kind(self) -> str:
        """The fingerprint's group name: the group's description (``dp:cpu``, ``tp``, ...)."""
        desc = self.group_desc
        return desc if desc and desc != "undefined" else f"group({','.join(map(str, self.members))})"

    # -- the meeting --------------------------------------------------------------------
    def _meet(self, op: str, tensor: Optional[torch.Tensor], payload: Any,
              combine: Optional[Callable[[Mapping[int, Any]], Mapping[int, Any]]], *,
              members: Optional[tuple[int, ...]] = None, group: Optional[str] = None, how: Optional[str] = None,
              params: tuple[tuple[str, int], ...] = ()) -> Any:
        shape = tuple(tensor.shape) if tensor is not None else ()
        if tensor is None or tensor.device.type == "cpu":
            _device_runs_while_host_blocks(f"{op} on {self.kind}")
        call = Collective(group or self.kind, op, shape, _dtype(tensor) if tensor is not None else "none",
                          how=how or self._world.how(), site=op, params=params,
                          local_us=self._world.elapsed_us(self.global_rank), members=members or self.members,
                          payload=payload, combine=combine)
        return self._world.threads.collective(self.global_rank, call)

    def _one(self, op: str, source: torch.Tensor, target: torch.Tensor, combine: "_Combine", *,
             params: tuple[tuple[str, int], ...] = ()) -> Any:
        """A collective from one tensor into one (``target`` may be ``source``). Eager, it
        meets now; inside a capture on this thread's simulated device it is recorded into the
        graph and meets at each replay, as ``graph:<the graph's name>`` (module docstring)."""
        key = _capturing_graph()
        if key is None:
            self._meet(op, source, _on_host(source, target, op), _pairs(combine), params=params)
            return _work([target])
        captured = _CapturedCollective(self, op, tuple(target.shape), target.dtype, combine, graph_how(key), params)
        self._world.hold(captured)
        target.copy_(torch.ops.ascendgraph_fabric.captured(source, captured.handle))
        return _work([target])

    def _not_captured(self, op: str) -> None:
        if _capturing_graph() is not None:
            raise RuntimeError(f"simulator: {op} inside a graph capture is not simulated by the ascendgraph backend "
                               "(captured collectives: all_reduce of one tensor, broadcast, all_gather_single, "
                               "reduce_scatter_single, all_to_all_single, moe_distribute; docs/ranks.md)")

    def allreduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]  # torch's stubs list the C++ overloads; a Python backend takes the call as c10d makes it
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if len(tensors) == 1:
            def combine(ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
                reduced = _reduce(op, torch.stack(list(ins)))  # once: in place, the outputs are the inputs
                for out in outs:
                    out.copy_(reduced)

            return self._one(f"all_reduce.{_op_name(op)}", tensors[0], tensors[0], combine)
        self._not_captured("a coalesced all_reduce")

        def combine_many(payloads: Mapping[int, Sequence[torch.Tensor]]) -> Mapping[int, None]:
            for i in range(len(tensors)):
                reduced = _reduce(op, torch.stack([p[i] for p in payloads.values()]))
                for p in payloads.values():
                    p[i].copy_(reduced)
            return {r: None for r in payloads}

        self._meet(f"all_reduce.{_op_name(op)}", tensors[0], list(tensors), combine_many)
        return _work(list(tensors))

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def barrier(self, opts: Any = None) -> Any:
        self._not_captured("barrier")
        self._meet("barrier", None, None, lambda payloads: {r: None for r in payloads})
        return _work(None)

    def broadcast(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]  # torch's stubs list the C++ overloads; a Python backend takes the call as c10d makes it
        root = opts.rootRank if opts is not None else 0  # the rank in the group: the index in rank order
        return self._one("broadcast", tensors[0], tensors[0], lambda ins, outs: [out.copy_(ins[root]) for out in outs])

    def allgather(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],  # type: ignore[override]  # torch's stubs list the C++ overloads; a Python backend takes the call as c10d makes it
                  opts: Any = None) -> Any:
        self._not_captured("all_gather into a list")

        def combine(payloads: Mapping[int, Any]) -> Mapping[int, None]:
            for r, (outs, _) in payloads.items():
                for j, (peer, (_, ins)) in enumerate(payloads.items()):
                    outs[0][j].copy_(ins[0])
            return {r: None for r in payloads}

        self._meet("all_gather", inputs[0], (outputs, inputs), combine)
        return _work(outputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        return self._one("all_gather_single", input, output,
                         lambda ins, outs: [out.copy_(torch.cat(list(ins)).reshape(out.shape)) for out in outs])

    def reduce_scatter(self, outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]],  # type: ignore[override]  # torch's stubs list the C++ overloads; a Python backend takes the call as c10d makes it
                       opts: Any = None) -> Any:
        self._not_captured("reduce_scatter from a list")
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def combine(payloads: Mapping[int, Any]) -> Mapping[int, None]:
            for j, (r, (outs, _)) in enumerate(payloads.items()):
                outs[0].copy_(_reduce(op, torch.stack([ins[0][j] for _, ins in payloads.values()])))
            return {r: None for r in payloads}

        self._meet(f"reduce_scatter.{_op_name(op)}", inputs[0][0], (outputs, inputs), combine)
        return _work(outputs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def combine(ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
            for j, out in enumerate(outs):
                out.copy_(_reduce(op, torch.stack([x.chunk(len(ins))[j] for x in ins])).reshape(out.shape))

        return self._one(f"reduce_scatter_single.{_op_name(op)}", input, output, combine)

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None) -> Any:
        self._not_captured("all_to_all of lists")

        def combine(payloads: Mapping[int, Any]) -> Mapping[int, None]:
            order = list(payloads)
            for j, r in enumerate(order):
                outs, _ = payloads[r]
                for i, peer in enumerate(order):
                    outs[i].copy_(payloads[peer][1][j])
            return {r: None for r in payloads}

        self._meet("all_to_all", inputs[0], (outputs, inputs), combine)
        return _work(outputs)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_splits: Sequence[int],
                          input_splits: Sequence[int], opts: Any = None) -> Any:
        splits = list(input_splits)

        def combine(ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
            pieces = [list(x.split(splits) if splits else x.chunk(len(ins))) for x in ins]
            for j, out in enumerate(outs):
                out.copy_(torch.cat([peer[j] for peer in pieces]).reshape(out.shape))

        return self._one("all_to_all_single", input, output, combine)

    def moe_distribute(self, stage: str, x: torch.Tensor, global_bs: int) -> torch.Tensor:
        """MC2's MoE token dispatch or combine on this (EP) group: what torch_npu's
        ``npu_moe_distribute_dispatch`` / ``_combine`` put on the communicator, as a meeting
        with op ``mc2_dispatch`` / ``mc2_combine`` and MC2's ``global_bs``, so the rules
        ``mc2_token_counts`` and ``same_graph_key``'s MC2 exception apply
        (`ascendgraph.parallel.fingerprints`). The routing of tokens to experts is not
        modelled: the result is this rank's tokens."""
        if stage not in ("dispatch", "combine"):
            raise ValueError(f"moe_distribute stage must be 'dispatch' or 'combine', got {stage!r}")
        if global_bs < 0:
            raise ValueError(f"MC2's global_bs must be >= 0 (0: every rank padded to one count), got {global_bs}")
        out = torch.empty_like(x)
        self._one(f"mc2_{stage}", x, out, lambda ins, outs: [o.copy_(i) for i, o in zip(ins, outs)],
                  params=(("global_bs", int(global_bs)),))
        return out

    def _p2p(self, tensor: torch.Tensor, peer_in_group: int, sending: bool) -> Any:
        self._not_captured("send / recv")
        me, peer = self.global_rank, self.members[peer_in_group]
        pair = tuple(sorted((me, peer)))

        def combine(payloads: Mapping[int, Any]) -> Mapping[int, None]:
            (a, (ta, send_a)), (b, (tb, send_b)) = sorted(payloads.items())
            if send_a and not send_b:
                tb.copy_(ta)
            elif send_b and not send_a:
                ta.copy_(tb)
            return {r: None for r in payloads}

        self._meet("send_recv", tensor, (tensor, sending), combine, members=pair, group=f"{self.kind}:p2p")
        return _work([tensor])

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int = 0) -> Any:
        return self._p2p(tensors[0], dst, True)

    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int = 0) -> Any:
        return self._p2p(tensors[0], src, False)

    def __repr__(self) -> str:
        return f"FabricProcessGroup({self.kind}, rank {self.global_rank} of {list(self.members)})"


class _ThreadWorld(c10d._World):
    """torch's process-group bookkeeping, one copy per thread (see the module docstring)."""

    _local = threading.local()

    def _mine(self) -> dict[str, Any]:
        state = getattr(self._local, "state", None)
        if state is None:
            state = {"default_pg": None, "pg_map": {}, "pg_names": {}, "pg_group_ranks": {}, "pg_backend_config": {},
                     "group_count": 0, "tags_to_pg": {}, "pg_to_tag": {}, "pg_coalesce_state": {}, "comms": []}
            self._local.state = state
        return state

    default_pg = property(lambda self: self._mine()["default_pg"],
                          lambda self, value: self._mine().__setitem__("default_pg", value))
    pg_map = property(lambda self: self._mine()["pg_map"])
    pg_names = property(lambda self: self._mine()["pg_names"])
    pg_group_ranks = property(lambda self: self._mine()["pg_group_ranks"])
    pg_backend_config = property(lambda self: self._mine()["pg_backend_config"])
    group_count = property(lambda self: self._mine()["group_count"],
                           lambda self, value: self._mine().__setitem__("group_count", value))
    tags_to_pg = property(lambda self: self._mine()["tags_to_pg"])
    pg_to_tag = property(lambda self: self._mine()["pg_to_tag"])
    pg_coalesce_state = property(lambda self: self._mine()["pg_coalesce_state"])
    comms = property(lambda self: self._mine()["comms"])


@contextlib.contextmanager
def _threaded_torch_distributed() -> Iterator[None]:
    previous = c10d._world
    c10d._world = _ThreadWorld()
    torch._C._distributed_c10d._set_thread_isolation_mode(True)  # type: ignore[attr-defined]  # torch private, not in its stubs
    try:
        yield
    finally:
        torch._C._distributed_c10d._set_thread_isolation_mode(False)  # type: ignore[attr-defined]  # torch private, not in its stubs
        c10d._world = previous


class FabricWorld:
    """``world_size`` ranks as threads on one fabric, each with ``torch.distributed`` initialised
    on the ``ascendgraph`` backend (see the module docstring).

    ``clock`` (optional): ``clock(rank)`` -> the rank's virtual time in microseconds (its
    simulated device's host clock); a collective carries the time spent since the rank's last
    one, so a slow rank is the straggler on the virtual clocks. ``timeout_s``: how long a member
    may wait (None: for ever); by default HCCL's execution timeout as the process environment
    sets it (``HCCL_EXEC_TIMEOUT``, ``HCCL_OP_EXPANSION_MODE``:
    `ascendgraph.parallel.fingerprints.default_collective_timeout_s`). ``switch``: run one rank
    thread at a time, calling it as the baton changes hands (`sim.fabric.RankSwitch`)."""

    def __init__(self, world_size: int, *, seed: int = 0,
                 timeout_s: Union[float, None, FromEnvironment] = FROM_ENVIRONMENT,
                 clock: Optional[Callable[[int], float]] = None, switch: Optional[RankSwitch] = None) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= MAX_WORLD_SIZE:
            raise ConfigError(f"FabricWorld world_size must be an integer from 1 to {MAX_WORLD_SIZE} (the ranks the "
                              f"simulator steps), got {world_size!r}", key="world_size")
        self.world_size = world_size
        if isinstance(timeout_s, FromEnvironment):
            timeout_s = default_collective_timeout_s(os.environ,
                                                     expansion_mode=os.environ.get("HCCL_OP_EXPANSION_MODE", ""))
        self.timeout_s = timeout_s
        self.fabric = Fabric(ParallelLayout(dp=world_size), seed=seed, timeout_s=timeout_s)
        self.threads = FabricThreads(self.fabric, switch=switch)
        self._clock = clock
        self._last_us: dict[int, float] = {}
        self._held: list[_CapturedCollective] = []

    def hold(self, captured: _CapturedCollective) -> None:
        """Keep a collective recorded into a graph for the world's life (its handle's entry)."""
        self._held.append(captured)

    def running(self) -> bool:
        """Whether the calling thread is a rank thread of this world's run."""
        return getattr(_current, "world", None) is self

    # -- per rank thread ------------------------------------------------------------------
    def how(self) -> str:
        key = getattr(_current, "replay", None)
        return EAGER if key is None else graph_how(key)

    @contextlib.contextmanager
    def replaying(self, key: str) -> Iterator[None]:
        """Collectives of this thread inside the block are replays of the graph of ``key``."""
        previous = getattr(_current, "replay", None)
        _current.replay = key
        try:
            yield
        finally:
            _current.replay = previous

    def elapsed_us(self, rank: int) -> float:
        if self._clock is None:
            return 0.0
        now = self._clock(rank)
        spent = now - self._last_us.get(rank, 0.0)
        self._last_us[rank] = now
        return max(0.0, spent)

    def decide(self, group: str, members: tuple[int, ...], value: tuple[Any, ...], *, sp_tp: int = 1,
               padded: int = 0) -> None:
        """A post-sync decision of this thread's rank (checked against its peers, never waited on)."""
        rank = _current.rank
        self.threads.decide(rank, Decision(group, value, sp_tp=sp_tp, padded=padded, members=members))

    @staticmethod
    def rank() -> int:
        """The global rank of the calling thread."""
        return int(_current.rank)

    # -- the run ----------------------------------------------------------------------------
    def run(self, body: Callable[[int], Any], *, ranks: Optional[Sequence[int]] = None) -> FabricStats:
        """Run ``body(rank)`` on a thread per rank, each with the default process group of the
        ``ascendgraph`` backend initialised; raise the run's error (`sim.fabric.FabricThreads`)."""
        register()

        def thread_body(rank: int) -> Any:
            _current.world, _current.rank, _current.replay = self, rank, None
            dist.init_process_group(BACKEND_NAME, store=dist.HashStore(), rank=rank, world_size=self.world_size,
                                    timeout=timedelta(days=1))
            try:
                return body(rank)
            finally:
                dist.destroy_process_group()
                _current.world = None

        with _RUN_LOCK, _threaded_torch_distributed():
            return self.threads.run({r: functools.partial(thread_body, r) for r in (ranks or range(self.world_size))})
