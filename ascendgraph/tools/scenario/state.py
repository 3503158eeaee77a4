"""The process-wide state a scenario run must leave as it found it."""

from __future__ import annotations

import gc
import os
import random
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


# --------------------------------------------------------------------------- process state


def _torch_rng_bytes() -> bytes:
    import torch

    return bytes(torch.get_rng_state().numpy().tobytes())


def _mode_stack_depths() -> tuple[int, int]:
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return len(_get_current_dispatch_mode_stack()), len(_get_current_function_mode_stack())


def _wrapper_ops() -> frozenset[str]:
    from ascendgraph import ops

    # The registry is module-level by design (one per process); a run must not change it.
    return frozenset(str(op) for op in getattr(ops, "_WRAPPER_OPS", {}))


def _forward_context_set() -> bool:
    from ascendgraph.forward_context import current_forward_context

    return current_forward_context() is not None


def _torch_value(getter: str) -> Callable[[], Any]:
    def read() -> Any:
        import torch

        return getattr(torch, getter)()

    return read


# name -> reader; compared with == (gc.collect by identity).
PROCESS_STATE: Mapping[str, Callable[[], Any]] = {
    "os.environ": lambda: dict(os.environ),
    "torch default dtype": _torch_value("get_default_dtype"),
    "torch intra-op threads": _torch_value("get_num_threads"),
    "torch grad mode": _torch_value("is_grad_enabled"),
    "torch inference mode": _torch_value("is_inference_mode_enabled"),
    "torch deterministic algorithms": _torch_value("are_deterministic_algorithms_enabled"),
    "torch global RNG state": _torch_rng_bytes,
    "python random state": random.getstate,
    "gc.collect": lambda: id(gc.collect),
    "gc enabled": gc.isenabled,
    "forward context set": _forward_context_set,
    "dispatch / function mode stacks": _mode_stack_depths,
    "wrapper-op registry": _wrapper_ops,
}


# Environment variables torch writes itself, once per process, when one of its modules is
# first imported: not a run's doing when that import happened during the run (a run whose
# traced graph is not cached imports Dynamo). name -> (the module, where torch sets it).
SET_BY_TORCH_ON_IMPORT: Mapping[str, tuple[str, str]] = {
    "TORCHINDUCTOR_CACHE_DIR": (
        "torch._dynamo",
        "torch/_inductor/runtime/cache_dir_utils.py cache_dir() stores its default in os.environ",
    ),
}


def _first_imported_during(before: "ProcessState", after: "ProcessState", variable: str) -> bool:
    """Whether ``variable`` appeared because its torch module was first imported in between."""
    entry = SET_BY_TORCH_ON_IMPORT.get(variable)
    if entry is None:
        return False
    module = entry[0]
    return module not in before.imported and module in after.imported and variable not in before.values["os.environ"]


@dataclass(frozen=True)
class ProcessState:
    """A snapshot of the process-wide state a run must leave as it found it."""

    values: Mapping[str, Any]
    # which of the SET_BY_TORCH_ON_IMPORT modules were imported (not state a run must restore)
    imported: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def capture(cls) -> "ProcessState":
        modules = frozenset(module for module, _ in SET_BY_TORCH_ON_IMPORT.values() if module in sys.modules)
        return cls({name: read() for name, read in PROCESS_STATE.items()}, modules)

    def differences(self, later: "ProcessState") -> list[str]:
        changed = []
        for name, before in self.values.items():
            after = later.values.get(name)
            if before == after:
                continue
            if name == "os.environ":
                before, after = before or {}, after or {}
                keys = sorted(k for k in set(before) | set(after)
                              if before.get(k) != after.get(k) and not _first_imported_during(self, later, k))
                if not keys:
                    continue
                changed.append(f"os.environ changed: {', '.join(f'{k}={before.get(k)!r}->{after.get(k)!r}' for k in keys)}")
            elif name in ("torch global RNG state", "python random state"):
                changed.append(f"{name} changed (something drew from the global generator)")
            else:
                changed.append(f"{name} changed: {before!r} -> {after!r}")
        return changed


def _warm_imports() -> None:
    """Import the engine and the simulator backend before the run. Dynamo is not imported here
    (1.3 s, which a run from the traced-graph cache never pays): what its first import writes
    into the environment is told apart by `SET_BY_TORCH_ON_IMPORT`."""
    import ascendgraph.runtime.engine  # noqa: F401
    from ascendgraph.device import backend_availability

    backend_availability("sim")  # loads the simulator backend through its entry point
