"""FULL-graph attention parameter update (docs/semantics.md §7).

Theory of operation. Attention kernels take host-side sequence lengths, which a captured
FULL graph freezes. So during a FULL capture every attention call goes through
`GraphParams.capture_attention`, which, on the capture stream:

    workspace query, softmax_lse allocation   (before the group: torch_npu's prepare_capture)
    ExternalEvent: wait, reset   (the graph will stall here at replay until the event is recorded)
    task_group_begin
    launch the kernel (out=, workspace, softmax_lse: buffers inside the graph)
    task_group_end -> handle     (kept, with the call's arguments and the event)

Only the kernel task sits inside the group (a device refuses allocations, workspace
queries, event nodes and host syncs there); a launch that fails still closes its group.

Workspaces, as vLLM Ascend keeps them (vllm_ascend/attention/attention_v1.py@182b75ea
``full_graph_fia``: ``graph_params.workspaces.get(num_tokens)``, ``cache_graph_workspace``;
vllm_ascend/compilation/acl_graph.py ``weak_ref_workspaces``): ONE workspace per capture
size, queried by the first layer captured at that size and handed to every layer (a layer
whose attention shapes differ queries its own and the larger is kept, vLLM Ascend's
mixed-layer rule). It is allocated inside the capture, so it belongs to the graph's pool;
while the capture runs `GraphParams` holds it strongly, and once the capture ended
(`captured`) only through the device's weak reference: the graph keeps the memory, and
nothing else holds a workspace per layer per size.

After each replay of that graph is *launched*, the engine calls `update(...)`, which on a
separate update stream, layer by layer: ``task_update_begin(handle)``, re-issues the
kernel with the batch's real (padded) lengths, ``task_update_end``, records the event — and
the replay proceeds past its wait with fresh parameters. An update that fails still ends
the update and records every event, then raises the first error. Forgetting the update
leaves the frozen lengths in place: the simulator raises StaleGraphParams (docs/decisions.md "Stale FULL-graph parameters"),
and the engine's check against eager is the second line; never recording the event leaves
the replay waiting (a hang the device reports).

Padding (`padded_attention_lengths`, vLLM Ascend's rule in
`ascendgraph.forward_context.fia_padded_lengths`): the last query end always equals
the graph's N tokens. Uniform decode batches (q = 1 + k tokens per request) keep the
captured request count R: ends [q, 2q, ..., R q], KV lengths padded with zeros. Mixed
batches: the real cumulative ends plus one dummy request ending at N (KV length 0). The
block table handed to the kernel has one row per request of those lists.

Parameters are owned by one engine (vLLM Ascend keeps one per process): `set_sizes` may
be called once per engine; a second call is the documented error.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Optional, Sequence

from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.errors import GRAPH_PARAMS_ALREADY_SET, GraphParamsNotSet, StaleGraphParams
from ascendgraph.forward_context import AttentionMetadata, fia_padded_lengths

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ascendgraph.device import Device, ExternalEvent, Stream, TaskGroupHandle
    from ascendgraph.models.attention import AttentionCall

__all__ = ["GraphParams", "AttentionRecord", "padded_attention_lengths", "GraphParamsNotSet"]

log = logging.getLogger(__name__)


@dataclass
class AttentionRecord:
    """One captured attention launch: its arguments, task-group handle and external event."""

    call: "AttentionCall"
    handle: "TaskGroupHandle"
    event: "ExternalEvent"

    @property
    def captured_num_reqs(self) -> int:
        return len(self.call.seq_lens)


def padded_attention_lengths(
    metadata: AttentionMetadata, descriptor: BatchDescriptor, *, captured_num_reqs: int, query_len: int
) -> tuple[list[int], list[int]]:
    """(actual_seq_lengths, seq_lens) of a batch, padded to the captured graph's request count."""
    real = metadata.num_reqs
    if real > captured_num_reqs:
        raise ValueError(
            f"batch of {real} requests replays a graph captured for {captured_num_reqs} ({descriptor}); "
            "the dispatcher padded to a key that is too small"
        )
    if descriptor.uniform:
        m = query_len
        if descriptor.num_tokens // m != captured_num_reqs:
            raise ValueError(
                f"uniform graph {descriptor} holds {descriptor.num_tokens // m} requests of {m} tokens, "
                f"but it was captured with {captured_num_reqs}"
            )
        if list(metadata.query_start_loc) != [m * (i + 1) for i in range(real)]:
            raise ValueError(
                f"batch dispatched as uniform decode (q={m}) has query ends {metadata.query_start_loc}"
            )
    return fia_padded_lengths(
        list(metadata.query_start_loc),
        list(metadata.seq_lens),
        num_tokens=descriptor.num_tokens,
        uniform=descriptor.uniform,
        num_reqs_padded=captured_num_reqs,
        query_len=query_len,
    )


class GraphParams:
    """Per-engine FULL-graph parameters: per captured key, one record per attention call."""

    def __init__(self, device: "Device") -> None:
        self.device = device
        self._sizes: Optional[tuple[int, ...]] = None
        self._records: dict[BatchDescriptor, list[AttentionRecord]] = {}
        self._update_stream: Optional["Stream"] = None
        # capture size -> (the attention shapes it was queried for, the workspace): strong
        # while its capture runs, the device's weak reference once the capture ended.
        self._workspaces: dict[int, tuple[tuple[object, ...], "torch.Tensor"]] = {}
        self._made_in_capture: dict[int, "torch.Tensor"] = {}  # workspaces the running capture made
        self.updates = 0

    # -- sizes ---------------------------------------------------------------------
    def set_sizes(self, capture_sizes: Sequence[int]) -> None:
        """Declare the capture sizes parameters are kept for (once per engine)."""
        if self._sizes is not None:
            raise ValueError(GRAPH_PARAMS_ALREADY_SET)
        self._sizes = tuple(sorted(set(capture_sizes)))

    @property
    def is_set(self) -> bool:
        return self._sizes is not None

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._sizes or ()

    @property
    def update_stream(self) -> "Stream":
        """The side stream updates run on (created on first use)."""
        if self._update_stream is None:
            self._update_stream = self.device.new_stream()
        return self._update_stream

    def records(self, descriptor: BatchDescriptor) -> list[AttentionRecord]:
        return list(self._records.get(descriptor, ()))

    @property
    def descriptors(self) -> list[BatchDescriptor]:
        return list(self._records)

    def workspace(self, num_tokens: int) -> Optional["torch.Tensor"]:
        """The one attention workspace of the FULL graphs of ``num_tokens`` (None: none captured)."""
        entry = self._workspaces.get(num_tokens)
        return None if entry is None else entry[1]

    def _shared_workspace(self, num_tokens: int, call: "AttentionCall") -> "AttentionCall":
        """``call`` prepared with the capture size's one workspace (queried on first use; a
        layer of other attention shapes queries its own, and the larger one is kept and used)."""
        shapes = (tuple(call.query.shape), tuple(call.key_cache.shape), call.query.dtype)
        entry = self._workspaces.get(num_tokens)
        if entry is not None and entry[0] == shapes:
            return call.prepared(workspace=entry[1])
        call = call.prepared()  # queries a workspace for this call's shapes
        assert call.workspace is not None
        if entry is not None and _nbytes(entry[1]) >= _nbytes(call.workspace):
            return replace(call, workspace=entry[1])
        self._workspaces[num_tokens] = (shapes, call.workspace)
        self._made_in_capture[id(call.workspace)] = call.workspace
        return call

    # -- capture side --------------------------------------------------------------
    def capture_attention(self, descriptor: BatchDescriptor, call: "AttentionCall") -> None:
        """Launch ``call`` inside a task group behind an external-event wait, and remember it."""
        if self._sizes is None:
            raise GraphParamsNotSet(
                "FULL-graph capture needs GraphParams.set_sizes(capture_sizes) first (the engine does it before capturing)"
            )
        if descriptor.num_tokens not in self._sizes:
            raise ValueError(
                f"FULL graph for {descriptor} captured, but {descriptor.num_tokens} is not one of the capture sizes "
                f"{list(self._sizes)} its parameters were set for"
            )
        device = self.device
        stream = device.current_stream()
        # Before the group, as torch_npu's handler contract (prepare_capture) and vLLM Ascend:
        # the size's workspace (queried once) and the softmax_lse allocation; then the event
        # wait and reset.
        call = self._shared_workspace(descriptor.num_tokens, call)
        event = device.new_external_event()
        event.wait(stream)
        event.reset(stream)
        device.task_group_begin(stream)
        try:
            call.launch()
        except BaseException:
            # Close the group so the capture ends (and is discarded) cleanly; the launch's
            # error is the one to report.
            with contextlib.suppress(Exception):
                device.task_group_end(stream)
            raise
        handle = device.task_group_end(stream)
        # The update re-issues the kernel with these very buffers. softmax_lse stays strongly
        # referenced; the workspace is held by `_workspaces` until the capture ends (`captured`).
        stored = replace(call, query=device.weak_ref(call.query), out=device.weak_ref(call.out))
        self._records.setdefault(descriptor, []).append(AttentionRecord(stored, handle, event))

    def captured(self, descriptor: BatchDescriptor) -> None:
        """The capture of ``descriptor`` ended: the workspaces it made belong to the graph's
        pool now, so from here on they are held through the device's weak reference only
        (vLLM Ascend's ``weak_ref_workspaces`` after every capture)."""
        made, self._made_in_capture = self._made_in_capture, {}
        weak = {key: self.device.weak_ref(tensor) for key, tensor in made.items()}
        for size, (shapes, workspace) in list(self._workspaces.items()):
            if id(workspace) in weak:
                self._workspaces[size] = (shapes, weak[id(workspace)])
        for record in self._records.get(descriptor, ()):
            used = record.call.workspace
            if used is not None and id(used) in weak:
                record.call = replace(record.call, workspace=weak[id(used)])

    def discard(self, descriptor: BatchDescriptor) -> None:
        """Forget what a (failed) capture recorded, and the workspaces it made."""
        self._records.pop(descriptor, None)
        made, self._made_in_capture = self._made_in_capture, {}
        for size, (_, workspace) in list(self._workspaces.items()):
            if id(workspace) in made:
                del self._workspaces[size]

    def clear(self) -> None:
        self._records.clear()
        self._workspaces.clear()
        self._made_in_capture.clear()

    # -- update side ---------------------------------------------------------------
    def update(
        self,
        descriptor: BatchDescriptor,
        metadata: AttentionMetadata,
        *,
        query_len: int = 1,
        skip_kernel: bool = False,
        record_events: bool = True,
    ) -> int:
        """Refresh the frozen attention parameters of the graph just replayed for ``descriptor``.

        Runs on the update stream after the replay was launched. ``skip_kernel`` and
        ``record_events`` exist for tests of the failure modes (stale results, hang).
        Returns the number of attention calls updated.
        """
        if self._sizes is None:
            raise GraphParamsNotSet("GraphParams.update before set_sizes: nothing was captured")
        records = self._records.get(descriptor)
        if not records:
            raise KeyError(
                f"no FULL-graph attention parameters were captured for {descriptor}; "
                f"captured keys: {[str(d) for d in self._records]}"
            )
        device = self.device
        stream = self.update_stream
        errors: list[tuple[AttentionRecord, Exception]] = []
        # Exception safety: whatever fails (the padding of this batch, a task update, an
        # event record), every open update is ended and every event recorded (the replay
        # already launched waits on them: an unrecorded event would hang the next
        # synchronize), then the first error is raised.
        try:
            actual, seq_lens = padded_attention_lengths(
                metadata, descriptor, captured_num_reqs=records[0].captured_num_reqs, query_len=query_len
            )
            block_table = metadata.block_table_for(len(actual))
        except Exception as exc:
            errors.append((records[0], exc))
            skip_kernel = True
        with device.stream(stream):
            for record in records:
                try:
                    if not skip_kernel:
                        self._update_one(record, actual, seq_lens, block_table)
                except Exception as exc:
                    errors.append((record, exc))
                finally:
                    if record_events:
                        try:
                            record.event.record(stream)
                        except Exception as exc:
                            errors.append((record, exc))
        self.updates += 1
        if errors:
            record, first = errors[0]
            if isinstance(first, StaleGraphParams):
                raise StaleGraphParams(f"{first} (layer {record.call.layer_name}, batch {descriptor})") from first
            raise first
        return len(records)

    def _update_one(
        self, record: AttentionRecord, actual: list[int], seq_lens: list[int], block_table: "torch.Tensor"
    ) -> None:
        """One task update: begin, re-issue the kernel, end (also when the re-issue fails)."""
        device = self.device
        stream = self.update_stream
        device.task_update_begin(stream, record.handle)
        try:
            record.call.launch(actual, seq_lens, block_table)
        except BaseException:
            with contextlib.suppress(Exception):
                device.task_update_end(stream)
            raise
        device.task_update_end(stream)

    def __repr__(self) -> str:
        calls = sum(len(r) for r in self._records.values())
        return f"GraphParams(sizes={list(self.sizes)}, graphs={len(self._records)}, attention_calls={calls})"


def _nbytes(tensor: "torch.Tensor") -> int:
    return int(tensor.numel()) * int(tensor.element_size())
