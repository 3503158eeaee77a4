"""The process-wide state a scenario run must leave as it found it."""

from __future__ import annotations

import gc
import os
import random
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ProcessState:
    """A snapshot of the process-wide state a run must leave as it found it."""

    values: Mapping[str, Any]

    @classmethod
    def capture(cls) -> "ProcessState":
        return cls({name: read() for name, read in PROCESS_STATE.items()})

    def differences(self, later: "ProcessState") -> list[str]:
        changed = []
        for name, before in self.values.items():
            after = later.values.get(name)
            if before == after:
                continue
            if name == "os.environ":
                before, after = before or {}, after or {}
                keys = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
                changed.append(f"os.environ changed: {', '.join(f'{k}={before.get(k)!r}->{after.get(k)!r}' for k in keys)}")
            elif name in ("torch global RNG state", "python random state"):
                changed.append(f"{name} changed (something drew from the global generator)")
            else:
                changed.append(f"{name} changed: {before!r} -> {after!r}")
        return changed


def _warm_imports() -> None:
    """Import what a first run would import lazily: some modules set state once on import
    (torch._dynamo sets TORCHINDUCTOR_CACHE_DIR — even a device action can pull it in),
    and that is not a run's doing."""
    import torch._dynamo  # noqa: F401
    import torch._functorch.aot_autograd  # noqa: F401

    import ascendgraph.runtime.engine  # noqa: F401
    from ascendgraph.device import backend_availability

    backend_availability("sim")  # loads the simulator backend through its entry point
