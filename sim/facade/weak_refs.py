"""``torch_npu._C._weak_ref_tensor`` on the facade: an alias that does not keep its storage alive.

torch_npu's ``_weak_ref_tensor`` (imported as ``TensorWeakRef`` by torch-npu 2.13.0's
``torch_npu/npu/graphs.py:29`` and ``npu/_npugraph_handlers/npugraph_handler.py:29``) makes
a tensor over the same device memory that holds no reference to it: once every owning
tensor is gone the memory goes back to the caching allocator, and a read through the weak
tensor reads whatever is allocated there next. vLLM Ascend and hw/ weak-reference graph
outputs and the query / output of captured attention.

On the CPU a tensor over freed memory would read garbage or crash the test process, so the
facade's `WeakRefTensor` is a tensor subclass with the original's shape, strides, offset
and dtype that holds only a weak reference to the storage (torch keeps one Python storage
object per live storage, so the weak reference dies exactly when the storage is freed).
Every op on it resolves the storage first: alive, the op runs on an alias built on it;
freed, the op raises `DeadWeakReference` (a declared detection: a card reads freed memory
silently). ``data_ptr()`` and ``untyped_storage()`` answer as for the original.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

from sim.pool_memory import DeadWeakReference, PoolWeakTensor

__all__ = ["WeakRefTensor", "DeadWeakReference", "weak_ref_tensor"]




DEAD_WEAK_REFERENCE = (
    "simulator: {op} reads a tensor made by torch_npu._C._weak_ref_tensor ({what}) whose storage was freed "
    "(every owning tensor is gone); a card raises nothing and reads whatever the caching allocator put at that "
    "address since (a use-after-free). Keep a strong reference to the tensor for as long as the weak one is used"
)


class WeakRefTensor(torch.Tensor):
    """A non-owning alias (see the module docstring). Create with `weak_ref_tensor`."""

    _storage_ref: Callable[[], Any]
    _what: str

    @staticmethod
    def __new__(cls, tensor: torch.Tensor) -> "WeakRefTensor":
        return torch.Tensor._make_wrapper_subclass(
            cls, tensor.shape, strides=tensor.stride(), storage_offset=tensor.storage_offset(),
            dtype=tensor.dtype, device=tensor.device, requires_grad=False,
        )

    def __init__(self, tensor: torch.Tensor) -> None:
        self._storage_ref = weakref.ref(tensor.untyped_storage())
        self._what = f"shape {tuple(tensor.shape)}, {str(tensor.dtype).replace('torch.', '')}"

    @property
    def alive(self) -> bool:
        """Whether the storage still exists (a read would succeed)."""
        return self._storage_ref() is not None

    def resolve(self, op: str = "a read") -> torch.Tensor:
        """An owning alias of the same memory, for one op; DeadWeakReference when it is freed."""
        storage = self._storage_ref()
        if storage is None:
            raise DeadWeakReference(DEAD_WEAK_REFERENCE.format(op=op, what=self._what))
        alias = torch.empty(0, dtype=self.dtype, device=self.device)
        return alias.set_(storage, self.storage_offset(), self.shape, self.stride())

    def data_ptr(self) -> int:
        return self.resolve("data_ptr()").data_ptr()

    def untyped_storage(self) -> torch.UntypedStorage:
        return self.resolve("untyped_storage()").untyped_storage()

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]  # torch's Tensor.__repr__ takes tensor_contents keyword-only too, unannotated
        state = "alive" if self.alive else "storage freed"
        return f"WeakRefTensor({self._what}, {state})"

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # torch declares it with a narrower signature than the dispatcher calls
            cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        op = str(func)

        def unwrap(value: Any) -> Any:
            return value.resolve(op) if isinstance(value, WeakRefTensor) else value

        args, kwargs = tree_map(unwrap, (args, kwargs or {}))
        return func(*args, **kwargs)


def weak_ref_tensor(tensor: torch.Tensor, device: Any = None) -> torch.Tensor:
    """torch_npu's ``_weak_ref_tensor``: a non-owning alias of ``tensor``. A tensor on a block of
    ``device``'s graph pools (a capture allocation) gets the pool's weak reference
    (`sim.pool_memory.PoolWeakTensor`: it reads the block while the block holds its graph's data)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"_weak_ref_tensor expects a tensor, got {type(tensor).__name__}")
    if isinstance(tensor, PoolWeakTensor):
        return PoolWeakTensor(tensor, tensor._allocation)
    if isinstance(tensor, WeakRefTensor):
        tensor = tensor.resolve("_weak_ref_tensor")
    allocation = device.pool_allocation(tensor) if device is not None else None
    if allocation is not None:
        return PoolWeakTensor(tensor, allocation)
    return WeakRefTensor(tensor)
