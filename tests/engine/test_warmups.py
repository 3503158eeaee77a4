"""Warm-ups run before every capture, counted on the device (issue 18).

Why they matter: the first launch of a kernel for a new shape initialises lazily
(workspace allocation, tiling), which an NPU refuses inside a graph capture; vLLM (and
vLLM Ascend) therefore run ``cudagraph_num_of_warmups`` eager forwards of each capture
size first (docs/semantics.md "Capture"). The device's kernel log tells eager launches
(``graph is None``) from replays, so the test counts the eager forwards per size itself
instead of restating the resolved constant.
"""

from __future__ import annotations

from collections import Counter

import sim
from ascendgraph.config import GraphConfig
from ascendgraph.runtime.engine import Engine, EngineOptions

SIZES = (2, 4)


def _eager_norms_per_size(warmups: int) -> Counter:
    config = GraphConfig.from_vllm_args(
        num_layers=1, max_num_seqs=4, max_num_batched_tokens=16,
        compilation_config={"cudagraph_mode": "FULL", "cudagraph_capture_sizes": list(SIZES),
                            "cudagraph_num_of_warmups": warmups})
    device = sim.SimDevice(meta_tensors=True, record_kernels=True)
    engine = Engine(config, EngineOptions(device=device, requests=1, progress=False, check_eager=False))
    try:
        before = len(device.kernel_records)
        with device.track_eager():  # eager kernels enter the device's log; captured ones are recorded
            engine.capture()
        records = device.kernel_records[before:]
    finally:
        engine.close()
    counts: Counter = Counter()
    for record in records:
        if record.graph is None and "rms_norm" in record.name and record.input_shapes:
            counts[record.input_shapes[0][0]] += 1
    return counts


def test_each_size_is_run_eagerly_warmups_times_before_its_capture():
    one, two = _eager_norms_per_size(1), _eager_norms_per_size(2)
    forward = one[min(SIZES)]  # the smallest size runs eagerly only for its warm-ups
    assert forward > 0
    assert two[min(SIZES)] == 2 * forward
    for size in SIZES:  # one more warm-up is one more eager forward of every size
        assert two[size] - one[size] == forward
