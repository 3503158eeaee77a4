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

A collective issued while `FabricWorld.replaying(key)` is active on its thread is a captured
collective replayed from the graph of ``key``: its fingerprint says ``graph:<key>``, so the
rules ``graph_never_meets_eager`` and ``same_graph_key`` apply (the simulated device's replay
enters it; docs/ranks.md).

A rank's thread that raises never arrives again: its peers end with ``CollectiveTimeout``
naming it (the straggler), never a hang. Only one `FabricWorld` runs at a time in a process.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from datetime import timedelta
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]  # torch's Python-backend helper, not in its stubs
from torch.distributed import distributed_c10d as c10d
from torch.futures import Future

from ascendgraph.parallel.fingerprints import EAGER, graph_how
from ascendgraph.parallel.layout import ParallelLayout
from sim.fabric import Collective, Decision, Fabric, FabricStats, FabricThreads

__all__ = ["BACKEND_NAME", "FabricProcessGroup", "FabricWorld", "register"]

BACKEND_NAME = "ascendgraph"
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

    @property
    def kind(self) -> str:
        """The fingerprint's group name: the group's description (``dp:cpu``, ``tp``, ...)."""
        desc = self.group_desc
        return desc if desc and desc != "undefined" else f"group({','.join(map(str, self.members))})"

    # -- the meeting --------------------------------------------------------------------
    def _meet(self, op: str, tensor: Optional[torch.Tensor], payload: Any,
              combine: Optional[Callable[[Mapping[int, Any]], Mapping[int, Any]]], *,
              members: Optional[tuple[int, ...]] = None, group: Optional[str] = None) -> Any:
        shape = tuple(tensor.shape) if tensor is not None else ()
        call = Collective(group or self.kind, op, shape, _dtype(tensor) if tensor is not None else "none",
                          how=self._world.how(), site=op, local_us=self._world.elapsed_us(self.global_rank),
                          members=members or self.members, payload=payload, combine=combine)
        return self._world.threads.collective(self.global_rank, call)

    def _index(self, rank: int) -> int:
        return self.members.index(rank)

    def allreduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]  # torch's stubs list the C++ overloads; a Python backend takes the call as c10d makes it
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def combine(payloads: Mapping[int, Sequence[torch.Tensor]]) -> Mapping[int, None]:
            for i in range(len(tensors)):
                reduced = _reduce(op, torch.stack([p[i] for p in payloads.values()]))
                for p in payloads.values():
                    p[i].copy_(reduced)
            return {r: None for r in payloads}

        self._meet(f"all_reduce.{_op_name(op)}", tensors[0], list(tensors), combine)
        return _work(list(tensors))

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def barrier(self, opts: Any = None) -> Any:
        self._meet("barrier", None, None, lambda payloads: {r: None for r in payloads})
        return _work(None)

    def broadcast(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]  # torch's stubs list the C++ overloads; a Python backend takes the call as c10d makes it
        root = self.members[opts.rootRank if opts is not None else 0]

        def combine(payloads: Mapping[int, Sequence[torch.Tensor]]) -> Mapping[int, None]:
            for r, p in payloads.items():
                if r != root:
                    for i, t in enumerate(p):
                        t.copy_(payloads[root][i])
            return {r: None for r in payloads}

        self._meet("broadcast", tensors[0], list(tensors), combine)
        return _work(list(tensors))

    def allgather(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],  # type: ignore[override]  # torch's stubs list the C++ overloads; a Python backend takes the call as c10d makes it
                  opts: Any = None) -> Any:
        def combine(payloads: Mapping[int, Any]) -> Mapping[int, None]:
            for r, (outs, _) in payloads.items():
                for j, (peer, (_, ins)) in enumerate(payloads.items()):
                    outs[0][j].copy_(ins[0])
            return {r: None for r in payloads}

        self._meet("all_gather", inputs[0], (outputs, inputs), combine)
        return _work(outputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        def combine(payloads: Mapping[int, Any]) -> Mapping[int, None]:
            gathered = torch.cat([ins for _, ins in payloads.values()])
            for out, _ in payloads.values():
                out.copy_(gathered.reshape(out.shape))
            return {r: None for r in payloads}

        self._meet("all_gather_single", input, (output, input), combine)
        return _work(output)

    def reduce_scatter(self, outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]],  # type: ignore[override]  # torch's stubs list the C++ overloads; a Python backend takes the call as c10d makes it
                       opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def combine(payloads: Mapping[int, Any]) -> Mapping[int, None]:
            for j, (r, (outs, _)) in enumerate(payloads.items()):
                outs[0].copy_(_reduce(op, torch.stack([ins[0][j] for _, ins in payloads.values()])))
            return {r: None for r in payloads}

        self._meet(f"reduce_scatter.{_op_name(op)}", inputs[0][0], (outputs, inputs), combine)
        return _work(outputs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def combine(payloads: Mapping[int, Any]) -> Mapping[int, None]:
            size = len(payloads)
            for j, (r, (out, _)) in enumerate(payloads.items()):
                chunks = [ins.chunk(size)[j] for _, ins in payloads.values()]
                out.copy_(_reduce(op, torch.stack(chunks)).reshape(out.shape))
            return {r: None for r in payloads}

        self._meet(f"reduce_scatter_single.{_op_name(op)}", input, (output, input), combine)
        return _work(output)

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], opts: Any = None) -> Any:
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
        def combine(payloads: Mapping[int, Any]) -> Mapping[int, None]:
            order = list(payloads)
            size = len(order)
            pieces = {}
            for r in order:
                _, ins, _, in_splits = payloads[r]
                pieces[r] = list(ins.split(list(in_splits)) if in_splits else ins.chunk(size))
            for j, r in enumerate(order):
                out, _, out_splits, _ = payloads[r]
                out.copy_(torch.cat([pieces[peer][j] for peer in order]).reshape(out.shape))
            return {r: None for r in payloads}

        self._meet("all_to_all_single", input, (output, input, list(output_splits), list(input_splits)), combine)
        return _work(output)

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
        shape = tuple(x.shape)
        call = Collective(self.kind, f"mc2_{stage}", shape, _dtype(x), how=self._world.how(), site=f"moe_{stage}",
                          params=(("global_bs", int(global_bs)),), local_us=self._world.elapsed_us(self.global_rank),
                          members=self.members, payload=None, combine=lambda payloads: {r: None for r in payloads})
        self._world.threads.collective(self.global_rank, call)
        return x.clone()

    def _p2p(self, tensor: torch.Tensor, peer_in_group: int, sending: bool) -> Any:
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
    one, so a slow rank is the straggler on the virtual clocks."""

    def __init__(self, world_size: int, *, seed: int = 0, timeout_s: Optional[float] = 1836.0,
                 clock: Optional[Callable[[int], float]] = None) -> None:
        self.world_size = world_size
        self.fabric = Fabric(ParallelLayout(dp=world_size), seed=seed, timeout_s=timeout_s)
        self.threads = FabricThreads(self.fabric)
        self._clock = clock
        self._last_us: dict[int, float] = {}

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
