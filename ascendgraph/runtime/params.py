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
from ascendgraph.errors import GRAPH_PARAMS_ALREADY_SET, StaleGraphParams
from ascendgraph.forward_context import AttentionMetadata, fia_padded_lengths

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ascendgraph.device import Device, ExternalEvent, Stream, TaskGroupHandle
    from ascendgraph.models.attention import AttentionCall

__all__ = ["GraphParams", "AttentionRecord", "padded_attention_lengths", "GraphParamsNotSet"]

log = logging.getLogger(__name__)


class GraphParamsNotSet(RuntimeError):
    """A FULL capture or update ran before `GraphParams.set_sizes`."""


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
        # the workspace query and the softmax_lse allocation; then the event wait and reset.
        call = call.prepared()
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
        # The workspace and softmax_lse stay strongly referenced: the update re-issues the
        # kernel with these very buffers (vLLM Ascend keeps its workspaces in GraphParams).
        stored = replace(call, query=device.weak_ref(call.query), out=device.weak_ref(call.out))
        self._records.setdefault(descriptor, []).append(AttentionRecord(stored, handle, event))

    def discard(self, descriptor: BatchDescriptor) -> None:
        """Forget what a (failed) capture recorded."""
        self._records.pop(descriptor, None)

    def clear(self) -> None:
        self._records.clear()

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

