"""ascendgraph.dynamo_gate: Dynamo's "do not trace" wrapper is paid only once Dynamo is imported.

What must hold: a run whose compiled graph comes from the traced-graph cache never imports
``torch._dynamo`` (the point); once Dynamo is imported, a gated function is not traced by it
(the safety). Each process-level claim runs in a fresh interpreter: in this one, Dynamo is
usually imported already by other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ascendgraph.dynamo_gate import LazyDynamoDispatchMode, defer_torch_dynamo_guards, disabled_once_dynamo_loads
from ascendgraph.models.build import ModelOptions, build_model, estimate_build_bytes
from ascendgraph.models.presets import PRESETS


def _python(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON document as its last line."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_RUN = """
    import json, sys
    from ascendgraph.config import GraphConfig
    from ascendgraph.runtime.engine import run
    config = GraphConfig.from_vllm_args(num_layers=1, max_num_seqs=4, max_num_batched_tokens=16,
                                        compilation_config={"cudagraph_capture_sizes": [1, 2, 4]})
    report = run(config, device="sim", requests=2, seed=0, progress=False)
    document = report.to_json()
    for timing in ("capture_seconds", "compile_seconds"):
        document.pop(timing)
    print(json.dumps({"ok": report.ok, "dynamo": "torch._dynamo" in sys.modules, "report": document}))
"""


def test_a_run_from_the_traced_cache_never_imports_dynamo_and_reports_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    namespace: dict = {}
    exec(textwrap.dedent(_RUN).replace("print(json.dumps(", "result = (("), namespace)  # the first run, here
    first = namespace["result"]
    assert first["ok"] and "torch._dynamo" in sys.modules  # it traced: Dynamo ran
    second = _python(_RUN)  # a fresh process with the traced entry the first run stored
    assert second["ok"] and not second["dynamo"]
    assert second["report"] == json.loads(json.dumps(first["report"]))


# Two process-level claims, checked in order in one fresh interpreter (each reads its own part):
# the meta size estimate alone (no simulator imported yet), then the simulator's modes and
# kernels. Dynamo is looked for after each, so the first cannot hide what the second imports.
_PROBES = """
    import json, sys
    from ascendgraph.models.build import ModelOptions, estimate_build_bytes
    from ascendgraph.models.presets import PRESETS
    estimate = estimate_build_bytes(PRESETS["tiny"], ModelOptions())
    found = {"estimate": {"estimate": estimate, "dynamo": "torch._dynamo" in sys.modules}}

    import torch
    import sim
    from ascendgraph import ops
    from sim.recorder import EagerTracker
    device = sim.SimDevice()
    x = torch.ones(2, 8)
    with EagerTracker(device):
        y = ops.rms_norm(x, torch.ones(8), 1e-6)
    meta = torch.arange(0, 8, 2, dtype=torch.float64, device="meta")  # a torch._refs kernel
    found["simulator"] = {"dynamo": "torch._dynamo" in sys.modules, "shape": list(y.shape), "meta": list(meta.shape)}
    print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def probes() -> dict:
    return _python(_PROBES)


def test_the_meta_size_estimate_imports_no_dynamo_and_still_covers_the_build(probes: dict) -> None:
    found = probes["estimate"]
    assert not found["dynamo"]
    spec = PRESETS["tiny"]
    model = build_model(spec)
    tensors = (*model.parameters(), *model.buffers())
    allocated = sum(t.numel() * t.element_size() for t in tensors)
    largest = max(t.numel() * 4 for t in model.parameters())
    assert found["estimate"] == estimate_build_bytes(spec, ModelOptions()) == allocated + 2 * largest


def test_the_simulator_s_modes_kernels_and_torch_meta_kernels_run_without_dynamo(probes: dict) -> None:
    assert probes["simulator"] == {"dynamo": False, "shape": [2, 8], "meta": [4]}


def test_torch_s_wrapper_still_has_the_shape_the_gate_relies_on():
    # torch 2.13's torch._disable_dynamo: a closure over (fn, recursive) reading fn.__dynamo_disable
    wrapped = torch._disable_dynamo(lambda: None)
    assert wrapped.__code__.co_freevars == ("fn", "recursive")
    assert "__dynamo_disable" in wrapped.__code__.co_consts or "__dynamo_disable" in wrapped.__code__.co_names
    assert defer_torch_dynamo_guards() >= 0  # idempotent: functions deferred before are skipped
    assert not LazyDynamoDispatchMode._should_skip_dynamo()


def _traced_op_count(gated) -> int:
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()

    def step(x):
        y = x + 1
        y = gated(y)
        return y * 2

    compiled = torch.compile(step, backend=counter)
    assert torch.equal(compiled(torch.ones(3)), (torch.ones(3) + 1).sin() * 2)
    return counter.op_count


def test_once_dynamo_is_imported_a_gated_function_is_not_traced():
    def body(x):
        return x.sin()

    assert _traced_op_count(body) == 3  # ungated: Dynamo traces add, sin, mul
    assert _traced_op_count(disabled_once_dynamo_loads(body)) == 2  # gated: sin runs outside the graphs


def test_a_lazy_mode_s_dispatch_is_gated_not_torch_wrapped():
    seen: list[str] = []

    class Names(LazyDynamoDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    installed = Names.__dict__["__torch_dispatch__"]
    assert installed.__code__ is disabled_once_dynamo_loads(len).__code__  # the gate, not torch's wrapper
    with Names():
        torch.ones(2) + 1
    assert "aten.add.Tensor" in seen


@pytest.mark.parametrize("recursive", [True, False])
def test_the_gate_calls_the_function_with_its_arguments(recursive):
    gated = disabled_once_dynamo_loads(lambda a, *, b: a + b, recursive)
    assert gated(2, b=3) == 5
