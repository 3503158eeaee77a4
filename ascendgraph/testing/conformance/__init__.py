"""The device conformance suite: behaviours every ascendgraph device must show.

Each case is a test function taking a ``device`` fixture and tagged ``ALL`` (run on every
backend) or ``sim_only(reason)`` (the simulator only; the reason says why hardware
cannot run it — docs/decisions.md "Conformance cases: all or sim_only"). `case` parametrises the
``device`` fixture over ``sim`` and ``npu`` (the npu parameter carries the ``npu`` marker,
so the default run keeps sim and ``-m npu`` keeps npu). Collect the suite by importing
its cases into a test module::

    from ascendgraph.testing.conformance import CASES
    globals().update(CASES)

One module per section: capture_replay, constraints, failed_captures, stream_budget,
task_groups, wrapper_ops, faults, accounting, kernel_contracts, capabilities; `registry` holds the
tags and `case`, `helpers` what the sections share.

Cases use only the `ascendgraph.device.Device` protocol and its optional capabilities
(``set_fault_plan``, ...) and, in sim-only cases, the simulator's options (``env``...). Texts are
asserted where the device owns them (torch_npu's §12 texts) and, for conditions the
ACL runtime reports in CANN-dependent words, only on the simulator.
"""

from __future__ import annotations

from ascendgraph.testing.conformance import (  # noqa: F401  (importing a section registers its cases)
    accounting,
    capabilities,
    capture_replay,
    constraints,
    failed_captures,
    faults,
    kernel_contracts,
    stream_budget,
    task_groups,
    wrapper_ops,
)
from ascendgraph.testing.conformance.registry import ALL, BACKEND_NAMES, CASES, SimOnly, case, sim_only

__all__ = ["ALL", "SimOnly", "sim_only", "case", "CASES", "BACKEND_NAMES"]
