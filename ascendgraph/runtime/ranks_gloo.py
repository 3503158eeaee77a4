"""The real-process tier: the same rank programs, one process per rank, on gloo.

`run_ranks_gloo` spawns one process per rank of a small layout (2 to 4 ranks), joins them in
a gloo process group with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (torch then checks, before each
collective, that every rank calls the same op with the same shapes, and reports a mismatch
instead of hanging), builds the groups in vLLM's layout and runs each rank's program from
`ascendgraph.runtime.ranks` with every collective executed by ``torch.distributed``:

* all-reduces of rows: an int32 tensor of those rows, summed (or the maximum) over the group;
* every other call (the TP all-reduce, MoE dispatch / combine): an all-reduce of a float32
  tensor of the call's shape (gloo has no MC2 and no bfloat16 all-reduce; the op name of a
  fingerprint is therefore not visible to gloo, only its shape and element count).

Its purpose is agreement: on what both can express (shapes, counts, sequence drift) gloo and
the in-process fabric must fail or pass together; what gloo cannot see (a replayed collective
meeting an eager one, graph keys, MC2 token rules, dtypes of equal size) it passes, and only
the fabric catches. Each rank reports ``ok`` or its exception's type and first line. A wait is
bounded by ``timeout_s`` (gloo's own timeout).
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from typing import Any, Mapping, Optional

from ascendgraph.config import GraphConfig
from ascendgraph.errors import ConfigError

__all__ = ["MAX_GLOO_RANKS", "GlooCall", "GlooDecision", "run_ranks_gloo"]

MAX_GLOO_RANKS = 4


class GlooCall:
    """What a rank program yields for a collective (the fields the fabric's Collective has)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class GlooDecision:
    """A post-sync decision: the real tier does not check it (the fabric does)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def _worker(rank: int, world: int, init_file: str, config_args: Mapping[str, Any], options: Any,
            timeout_s: float, results: Any) -> None:
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    import torch
    import torch.distributed as dist

    from ascendgraph.parallel.layout import GROUP_NAMES
    from ascendgraph.runtime.ranks import build_rank, layout_of, rank_program

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        config = GraphConfig.from_vllm_args(**config_args)
        layout = layout_of(config)
        groups: dict[tuple[str, tuple[int, ...]], Any] = {}
        for kind in GROUP_NAMES:  # every process creates every group, in the same order
            for members in layout.groups(kind):
                groups[(kind, members)] = dist.new_group(list(members), backend="gloo") if len(members) < world \
                    else dist.group.WORLD
        program = rank_program(build_rank(config, options, layout, rank), (GlooCall, GlooDecision))
        value: Any = None
        while True:
            try:
                item = program.send(value)
            except StopIteration:
                break
            value = None
            if isinstance(item, GlooDecision):
                continue
            group = groups[(item.group, layout.group(item.group, rank))]
            op = dist.ReduceOp.MAX if item.reduce == "max" else dist.ReduceOp.SUM
            if item.rows is not None:
                tensor = torch.tensor(item.rows, dtype=torch.int32)
                dist.all_reduce(tensor, op=op, group=group)
                value = tensor.tolist()
            else:
                tensor = torch.zeros(tuple(item.shape), dtype=torch.float32)
                dist.all_reduce(tensor, op=op, group=group)
        results.put((rank, "ok", ""))
    except BaseException as exc:  # reported, never raised out of the process
        results.put((rank, type(exc).__name__, (str(exc).splitlines() or [""])[0][:300]))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def run_ranks_gloo(config_args: Mapping[str, Any], options: Any, *, timeout_s: float = 30.0,
                   join_s: Optional[float] = None) -> dict[int, tuple[str, str]]:
    """Run every rank in its own process on gloo; {rank: ("ok" | exception type, first line)}.
    A rank that neither finished nor failed within ``join_s`` is ("Timeout", "")."""
    import multiprocessing

    config = GraphConfig.from_vllm_args(**config_args)
    world = config.data_parallel_size * config.tensor_parallel_size * config.pipeline_parallel_size
    if not 2 <= world <= MAX_GLOO_RANKS:
        raise ConfigError(f"the gloo tier runs 2 to {MAX_GLOO_RANKS} ranks, got {world}", key="world_size")
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        init_file = os.path.join(folder, "init")
        processes = [context.Process(target=_worker, args=(r, world, init_file, dict(config_args), options, timeout_s,
                                                             results)) for r in range(world)]
        for process in processes:
            process.start()
        outcome: dict[int, tuple[str, str]] = {}
        deadline = join_s if join_s is not None else timeout_s * 4 + 120
        try:
            while len(outcome) < world:
                rank, kind, message = results.get(timeout=deadline)
                outcome[rank] = (kind, message)
        except Exception:
            pass
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join()
        for rank in range(world):
            outcome.setdefault(rank, ("Timeout", ""))
    return outcome
