"""tests/data/logs: every log says what it is, and the synthetic ones agree with the planner (issue 18).

The logs were written for the diagnose tests, not captured on a device: each carries a
``# synthetic log`` label line (a real log would instead cite its source in a ``# source:``
line). stream_exhaustion_tp4.log used to show 16 of 67 sizes captured before the failure
while the planner says 15 fit (tp=4 under FFTS+, 36 layers: floor((1800 - 40) / (37 * 3)) =
15): a hand-written progress bar off by one, not a real stack disagreeing with the planner.
"""

from __future__ import annotations

import re
from pathlib import Path

from ascendgraph.modes import GraphMode
from ascendgraph.sizes import plan_stream_budget

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def test_every_log_is_labelled_synthetic_or_cites_its_source():
    for path in sorted(LOGS.glob("*.log")):
        text = path.read_text(encoding="utf-8", errors="replace")
        assert "# synthetic log" in text or "# source:" in text, path.name


def test_the_tp4_stream_exhaustion_log_fails_where_the_planner_says():
    text = (LOGS / "stream_exhaustion_tp4.log").read_text(encoding="utf-8")
    captured, total = map(int, re.search(r"\| (\d+)/(\d+) \[", text).groups())
    sizes = [int(s) for s in re.search(r"'cudagraph_capture_sizes': \[([0-9, ]+)\]", text).group(1).split(",")]
    layers = int(re.search(r'"num_hidden_layers": (\d+)', text).group(1))
    assert (total, layers, len(sizes)) == (67, 36, 67)
    plan = plan_stream_budget(num_hidden_layers=layers, capture_sizes=sizes, mode=GraphMode.PIECEWISE,
                              tensor_parallel_size=4, hccl_op_expansion_mode=None)
    assert plan.max_num_sizes == 15 == captured  # the 16th size is the one that fails
