"""What vLLM Ascend's FULL graphs keep alive after capture, from the simulator's memory ledger
(sim/memory_ledger.py, tests/vllm_ascend/graph_memory.py).

vLLM Ascend keeps per capture size one parameter record per attention layer and one
workspace (vllm_ascend/compilation/acl_graph.py@182b75ea ``GraphParams``, 300-325). At
182b75ea the FIA records hold every tensor through ``weak_ref_tensors``
(attention/attention_v1.py 1030-1059) and the workspaces are weak-referenced once the
capture ended (acl_graph.py 227-229, 270-276); the sinks records hold the capture batch's
``attn_metadata.seq_lens`` (index 6: full_graph_fia_v2 passes that tensor as
``actual_seq_kvlen``, 1098) and the layer's ``sinks`` parameter (index 11) strongly (1171-1189),
the paged-attention records the capture batch's ``attn_metadata.block_tables`` and
``attn_metadata.seq_lens`` (1247-1262, PagedAttentionGraphParam params 6 and 7). These tests pin exactly that: a strong reference planted into a
record is reported, and one removed shows up as a change too."""

from __future__ import annotations

import harness

harness.require()

import pytest  # noqa: E402
from vllm.compilation.monitor import set_cudagraph_capturing_enabled  # noqa: E402

import graph_memory  # noqa: E402
from sim import facade  # noqa: E402
from test_full_graph_attention import DECODE_STEPS, SINKS_STEPS, SIZE, STEPS, FullGraphRun  # noqa: E402


@pytest.fixture(autouse=True)
def fresh() -> None:
    facade.configure()
    harness.reset_vllm_ascend_state()
    set_cudagraph_capturing_enabled(True)


def _graphs(run: FullGraphRun) -> dict[int, object]:
    return {SIZE: entry.aclgraph for entry in run.wrapper.concrete_aclgraph_entries.values()}


def _strong_holders(run: FullGraphRun) -> list[str]:
    check = graph_memory.check(_graphs(run))
    return sorted(finding.detail.split(" (")[0] for finding in check.findings if finding.kind == "strong_reference")


def test_full_graph_fia_records_and_workspaces_hold_every_tensor_weakly() -> None:
    run = FullGraphRun()
    run.capture()
    run.step(harness.Step(*STEPS[0], padded_to=SIZE), seed=0)
    check = graph_memory.check(_graphs(run))
    assert check.ok, check.report()
    held = [entry for ledger in check.ledgers for entry in ledger.held if entry.why in ("parameter record", "workspace")]
    assert len(held) >= 2 * 6 and not any(entry.strong for entry in held)  # two layers' query, caches, table, out...


def test_the_paged_attention_records_hold_the_step_metadata_strongly() -> None:
    run = FullGraphRun("FULL_DECODE_ONLY", pa_shape_list=[SIZE])
    run.capture()
    run.step(harness.Step(*DECODE_STEPS[0], padded_to=SIZE, state="DecodeOnly", uniform=True), seed=0)
    holders = _strong_holders(run)
    # per layer: attn_metadata.block_tables and attn_metadata.seq_lens (PagedAttentionGraphParam.params[6], [7])
    assert len(holders) == 4, holders
    assert sorted(h[-10:] for h in holders) == [".params[6]", ".params[6]", ".params[7]", ".params[7]"], holders


def test_the_sinks_records_hold_the_capture_seq_lens_and_the_layers_sinks_strongly() -> None:
    run = FullGraphRun(sinks=True)
    run.capture()
    run.step(harness.Step(*SINKS_STEPS[0], padded_to=SIZE), seed=0)
    holders = _strong_holders(run)
    # per layer: actual_seq_lengths_kv, which full_graph_fia_v2 takes as attn_metadata.seq_lens (a
    # tensor, attention_v1.py:1098), and self.sinks (the layer's parameter)
    assert sorted(h[-4:] for h in holders) == ["[11]", "[11]", "][6]", "][6]"], holders
