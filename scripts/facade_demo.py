"""A FULL-graph attention round trip written only against torch_npu's public API.

    python -m sim.facade -- python scripts/facade_demo.py            # on a laptop
    python scripts/facade_demo.py                                    # on an Ascend node

The call sequence is vLLM Ascend's (ACLGraphWrapper + full_graph_attention +
update_graph_params, vllm_ascend/compilation/acl_graph.py @ f575cbb3): workspace and
softmax_lse allocated before the task group, an ExternalEvent wait/reset before it, the
fused attention (.out) inside it; replay; the update on a second stream with the new host
sequence lengths; record; synchronize. The replayed result must equal an eager call.

``--violate`` makes the script break one rule a card enforces, and it must fail there:
``padded-query`` (TND: query.shape[0] != actual_seq_lengths[-1]), ``open-group`` (the
capture ends with the task group still open), ``alloc-in-group`` (an allocation between
graph_task_group_begin and _end). Exit status 0 when the round trip matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
import torch_npu

DEVICE = "npu"  # torch_npu's device (on the facade: its simulated NPU)
HEADS, KV_HEADS, HEAD_DIM, BLOCKS, BLOCK_SIZE = 8, 2, 128, 8, 128
VIOLATIONS = ("padded-query", "open-group", "alloc-in-group")


def make_inputs(tokens: int) -> dict:
    generator = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(torch.bfloat16).to(DEVICE)

    return dict(
        query=randn(tokens, HEADS, HEAD_DIM),
        key=randn(BLOCKS, BLOCK_SIZE, KV_HEADS * HEAD_DIM),
        value=randn(BLOCKS, BLOCK_SIZE, KV_HEADS * HEAD_DIM),
        block_table=torch.arange(tokens * 2, dtype=torch.int32).view(tokens, 2).remainder(BLOCKS).to(DEVICE),
        mask=torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1).to(DEVICE),
    )


def fia_kwargs(inputs: dict, ends: list[int], lens: list[int]) -> dict:
    return dict(atten_mask=inputs["mask"], actual_seq_lengths=ends, actual_seq_lengths_kv=lens,
                block_table=inputs["block_table"], num_heads=HEADS, scale=1 / math.sqrt(HEAD_DIM), input_layout="TND",
                num_key_value_heads=KV_HEADS, sparse_mode=3, block_size=BLOCK_SIZE)


def eager(inputs: dict, ends: list[int], lens: list[int]) -> torch.Tensor:
    out, _ = torch_npu.npu_fused_infer_attention_score(inputs["query"], inputs["key"], inputs["value"],
                                                       **fia_kwargs(inputs, ends, lens))
    return out


def round_trip(violate: str = "") -> float:
    """Capture, replay, update, synchronize; max |graph - eager| (raises on a violation)."""
    tokens = 4
    ends, capture_lens, lens = [1, 2, 3, 4], [1, 1, 1, 1], [130, 5, 200, 17]
    inputs = make_inputs(tokens)
    query = inputs["query"]
    if violate == "padded-query":  # the query padded past the last end, as FULL graphs did
        ends = [1, 2, 3, 3]
    kwargs = fia_kwargs(inputs, ends, capture_lens)
    output = torch.empty_like(query)
    softmax_lse = torch.empty(1, dtype=query.dtype, device=query.device)
    workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(
        query, inputs["key"], inputs["value"], **kwargs)
    pool = torch.npu.graph_pool_handle()
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph, pool=pool):
        stream = torch_npu.npu.current_stream()
        event = torch.npu.ExternalEvent()
        event.wait(stream)
        event.reset(stream)
        torch.npu.graph_task_group_begin(stream)
        if violate == "alloc-in-group":
            torch.empty(16, device=query.device)
        torch_npu.npu_fused_infer_attention_score.out(query, inputs["key"], inputs["value"], **kwargs,
                                                       workspace=workspace, out=[output, softmax_lse])
        if violate != "open-group":
            handle = torch.npu.graph_task_group_end(stream)
    graph.replay()
    update_stream = torch_npu.npu.Stream()
    with torch.npu.stream(update_stream):
        torch.npu.graph_task_update_begin(update_stream, handle)
        torch_npu.npu_fused_infer_attention_score.out(query, inputs["key"], inputs["value"],
                                                       **fia_kwargs(inputs, ends, lens), workspace=workspace,
                                                       out=[output, softmax_lse])
        torch.npu.graph_task_update_end(update_stream)
        event.record(update_stream)
    torch.npu.synchronize()
    expected = eager(inputs, ends, lens)
    return float((output.float() - expected.float()).abs().max())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--violate", choices=VIOLATIONS, default="")
    args = parser.parse_args(argv)
    try:
        diff = round_trip(args.violate)
    except Exception as exc:  # what a card (or the facade) refuses
        # torch.npu.graph's exit always calls capture_end: its error may replace the body's.
        for error in (exc.__context__, exc) if exc.__context__ is not None else (exc,):
            print(f"refused: {type(error).__name__}: {' '.join(str(error).split())[:400]}", file=sys.stderr)
        return 1
    print(f"graph vs eager: max |diff| = {diff}")
    return 0 if diff == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
