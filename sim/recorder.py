"""Recording: what happens to each op issued while a graph captures (or a task update runs).

Theory of operation. Capture pushes two modes. A `TorchDispatchMode` (the *recorder*)
sees every aten and custom op after decomposition; a `TorchFunctionMode` beside it sees
the Python-level host synchronisations that never reach dispatch on a CPU tensor
(``.tolist()``, ``.cpu()``, ``.numpy()``, ``print(t)``). Each op is classified once per
device (`OpInfo`, cached):

=================  ====================================================================
class              what capture does
=================  ====================================================================
wrapper op         (ascendgraph.ops.register_wrapper_op) re-enter its Python
                   implementation under the recorder: the kernels it issues are recorded
host sync          ``_local_scalar_dense`` / ``item`` / ``equal``: CaptureConstraintError
dynamic shape      ``Tag.dynamic_output_shape`` (nonzero, masked_select): rejected
metadata change    ``Tag.inplace_view``, ``set_``, ``resize_``: rejected
RNG                ``Tag.nondeterministic_seeded`` drawing numbers: rejected unless the
                   device allows RNG in capture
alias              view ops (``func.is_view``) and the aliasing ops that are not annotated
                   as views (``_unsafe_view``, ``unsafe_split``...): run now (they only
                   make aliases), never replayed
host work          (`NO_KERNEL_OPS`) host-side checks of symbolic sizes
                   (``_assert_scalar``, ``sym_constrain_range``...): run now, never replayed
allocation         (`NO_KERNEL_OPS`) ``empty`` / ``empty_like`` / ``empty_strided`` /
                   ``new_empty``...: a fresh block of the graph pool (counted in pool
                   bytes, NaN-poisoned), never replayed
op                 everything else: *not run*. Its outputs are computed on the meta device,
                   fresh outputs are allocated from the graph pool (NaN-poisoned, as the
                   device's memory is uninitialised) and the call is appended to the
                   recording with its arguments — the captured tensors and the host values
                   of that moment
=================  ====================================================================

Kernels. Only *op* (and recorded RNG) calls are device kernels: they are what a replay
runs, what the clock prices, what the graph launch cost counts and what the kernel log
(KernelRecord) lists. Aliases, host work and allocations launch nothing on an NPU, so
they are never kernels — eagerly (`EagerTracker`) or in a graph (`launches_kernel`).
``zeros`` / ``full`` / ``ones`` are not pure allocations: the device fills the memory
with a kernel, so they stay ops.

Capture does not execute work, like the device: a capture call's outputs are garbage
until the first replay, and in-place updates issued during capture have not happened
when capture ends. An op without a meta kernel is the exception: it runs for real at
capture and is counted in ``stats().extra["capture_fallback_ops"]``.

The dispatch modes declare ``ignore_compile_internals``: torch.compile keeps compiling
under them and they see the compiled code's ops at run time.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode
from ascendgraph.dynamo_gate import LazyDynamoDispatchMode

from ascendgraph import ops as ag_ops
from sim.mode_stack import reentered, run_functionalized_ops_under
from sim.matmul import WIDENED_MATMULS, widened_matmul, widens
from ascendgraph.errors import (
    CaptureConstraintError,
    DYNAMIC_SHAPE_DURING_CAPTURE,
    HOST_SYNC_DURING_CAPTURE,
    METADATA_CHANGE_DURING_CAPTURE,
    KernelContractError,
    RNG_DURING_CAPTURE,
)

if TYPE_CHECKING:  # pragma: no cover
    from sim.capture import Capture, Update
    from sim.device import SimDevice

__all__ = [
    "OP",
    "ALIAS",
    "HOST_SYNC",
    "DYNAMIC_SHAPE",
    "METADATA_CHANGE",
    "RNG",
    "HOST",
    "ALLOC",
    "NO_KERNEL_OPS",
    "launches_kernel",
    "OpInfo",
    "classify",
    "to_meta",
    "meta_outputs",
    "call_signature",
    "signature_of",
    "NoSignature",
    "NO_META",
    "CaptureRecorder",
    "HostSyncGuard",
    "UpdateCollector",
    "EagerTracker",
]

aten = torch.ops.aten

OP, ALIAS, HOST_SYNC, DYNAMIC_SHAPE, METADATA_CHANGE, RNG, HOST, ALLOC = range(8)

# Ops that launch no kernel on an NPU: schema name -> (class, reason). Their out= overloads
# (mutable) are not in the table: they write into an argument and stay ops.
NO_KERNEL_OPS: dict[str, tuple[int, str]] = {
    "aten::_assert_scalar": (HOST, "a host-side check of a symbolic size (Dynamo's asserts on unbacked sizes)"),
    "aten::_functional_assert_scalar": (HOST, "a host-side check of a symbolic size (functionalised)"),
    "aten::sym_constrain_range": (HOST, "a host-side range constraint on a symbolic size"),
    "aten::sym_constrain_range_for_size": (HOST, "a host-side range constraint on a symbolic size"),
    "aten::_functional_sym_constrain_range": (HOST, "a host-side range constraint (functionalised)"),
    "aten::_functional_sym_constrain_range_for_size": (HOST, "a host-side range constraint (functionalised)"),
    "aten::_assert_tensor_metadata": (HOST, "a host-side check of a tensor's sizes, strides and dtype"),
    "aten::empty": (ALLOC, "an allocation from the caching allocator / graph pool, no kernel"),
    "aten::empty_like": (ALLOC, "an allocation from the caching allocator / graph pool, no kernel"),
    "aten::empty_strided": (ALLOC, "an allocation from the caching allocator / graph pool, no kernel"),
    "aten::empty_permuted": (ALLOC, "an allocation from the caching allocator / graph pool, no kernel"),
    "aten::new_empty": (ALLOC, "an allocation from the caching allocator / graph pool, no kernel"),
    "aten::new_empty_strided": (ALLOC, "an allocation from the caching allocator / graph pool, no kernel"),
    "ascendgraph::attention_workspace": (
        ALLOC, "a workspace query: a host-side size computation and an allocation, no kernel"
    ),
}
# Classes that never launch a kernel (no task, no device time, no launch cost, no record).
_NO_KERNEL_KINDS = frozenset({ALIAS, HOST, ALLOC})

_HOST_SYNC_OPS = frozenset({aten._local_scalar_dense.default, aten.item.default, aten.equal.default})
_METADATA_OPS = frozenset(
    {aten.resize_.default, aten.resize_as_.default, aten.set_.default, aten.set_.source_Tensor,
     aten.set_.source_Storage, aten.set_.source_Storage_storage_offset,
     aten.set_.source_Tensor_storage_offset}
)
# Ops whose output aliases an input although the schema does not say so.
_UNANNOTATED_ALIAS_OPS = frozenset(
    {aten._unsafe_view.default, aten.unsafe_split.Tensor, aten.unsafe_split_with_sizes.default,
     aten.unsafe_chunk.default}
)
_HOST_SYNC_HINTS = {
    aten._local_scalar_dense.default: "Reading a tensor's value on the host (.item(), bool(t), int(t), float(t), `if t:`)",
    aten.item.default: "Tensor.item()",
    aten.equal.default: "torch.equal",
}


class OpInfo:
    """How capture treats one OpOverload (see the module table)."""

    __slots__ = ("func", "kind", "return_alias", "arg_names", "arg_defaults", "mutating", "launches_kernel",
                 "return_count", "written", "collective")

    def __init__(self, func: Any, kind: int) -> None:
        schema = func._schema
        self.func = func
        self.kind = kind
        self.launches_kernel = launches_kernel(kind)
        self.mutating = bool(schema.is_mutable)
        self.arg_names = tuple(a.name for a in schema.arguments)
        self.arg_defaults = tuple(a.default_value if a.has_default_value() else None for a in schema.arguments)
        self.return_count = len(schema.returns)
        # positions of the arguments the schema says the op writes (``Tensor(a!)``)
        self.written = tuple(index for index, a in enumerate(schema.arguments)
                             if a.alias_info is not None and a.alias_info.is_write)
        # whether `ascendgraph.ops.collective_group` may name a group for a call of it (its op names)
        self.collective = (getattr(func, "namespace", None) == ag_ops.NAMESPACE
                           and func.__name__.split(".")[0] in ag_ops.COLLECTIVE_OP_NAMES)
        alias_sets: dict[Any, int] = {}
        for index, argument in enumerate(schema.arguments):
            if argument.alias_info is not None:
                for name in argument.alias_info.before_set:
                    alias_sets.setdefault(name, index)
        aliases: list[Optional[int]] = []
        for ret in schema.returns:
            found = None
            if ret.alias_info is not None:
                for name in ret.alias_info.before_set:
                    if name in alias_sets:
                        found = alias_sets[name]
                        break
            aliases.append(found)
        self.return_alias = tuple(aliases)

    def argument(self, index: int, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        if index < len(args):
            return args[index]
        return kwargs.get(self.arg_names[index], self.arg_defaults[index])

    def flatten_returns(self, out: Any) -> tuple:
        """The op's returned value as one item per schema return."""
        count = self.return_count
        if count == 1:
            return (out,)
        return () if count == 0 else tuple(out)

    def pack_returns(self, values: list) -> Any:
        """One value per schema return, packed as the op returns them."""
        count = self.return_count
        if count == 1:
            return values[0]
        return None if count == 0 else tuple(values)


def launches_kernel(kind: int) -> bool:
    """Whether an op of this class is a device kernel (aliases, host work and allocations are not)."""
    return kind not in _NO_KERNEL_KINDS


def _no_kernel_kind(func: Any) -> Optional[int]:
    schema = func._schema
    if schema.is_mutable:
        return None
    entry = NO_KERNEL_OPS.get(schema.name)
    return entry[0] if entry is not None else None


def classify(func: Any) -> OpInfo:
    """The capture class of an OpOverload (pure; the device caches it)."""
    tags = func.tags
    no_kernel = _no_kernel_kind(func)
    if no_kernel is not None:
        kind = no_kernel
    elif func in _HOST_SYNC_OPS or torch.Tag.data_dependent_output in tags:
        kind = HOST_SYNC
    elif torch.Tag.dynamic_output_shape in tags:
        kind = DYNAMIC_SHAPE
    elif func in _METADATA_OPS or torch.Tag.inplace_view in tags:
        kind = METADATA_CHANGE
    elif func.is_view or func in _UNANNOTATED_ALIAS_OPS:
        kind = ALIAS
    elif torch.Tag.nondeterministic_seeded in tags:
        kind = RNG
    else:
        kind = OP
    return OpInfo(func, kind)


def integer_index_info(info: OpInfo, args: Sequence[Any]) -> OpInfo:
    """``info`` refined for one call: ``aten.index.Tensor`` carries the dynamic-output-shape tag
    because a boolean mask selects a data-dependent count of rows, but with integer index
    tensors its output shape follows from the indices' shapes (a gather), which a graph
    captures; such a call is an ordinary kernel (vLLM Ascend's MoE indexes its expert map
    with the routed expert ids: ops/fused_moe/token_dispatcher.py@182b75ea:416)."""
    if info.kind != DYNAMIC_SHAPE or info.func is not aten.index.Tensor or len(args) < 2:
        return info
    indices = args[1]
    if all(index is None or (isinstance(index, torch.Tensor) and not index.is_floating_point()
                             and index.dtype not in (torch.bool, torch.uint8)) for index in indices):
        return OpInfo(info.func, OP)
    return info


def draws_random(info: OpInfo, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """False for seeded ops that will not draw: dropout with p == 0 or outside training."""
    names = info.arg_names
    for key in ("dropout_p", "p"):
        if key in names:
            value = info.argument(names.index(key), args, kwargs)
            if isinstance(value, (int, float)) and value == 0:
                return False
    if "train" in names:
        value = info.argument(names.index("train"), args, kwargs)
        if value is False:
            return False
    return True


_META = torch.device("meta")


def to_meta(value: Any) -> Any:
    """A meta twin of a (nested) argument: same sizes, strides and dtype, no data."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=_META)
    if isinstance(value, torch.device):
        return _META
    if isinstance(value, (list, tuple)):
        if all(type(v) in _PLAIN_SCALARS for v in value):  # host sizes and lengths: nothing to convert
            return type(value)(value)
        return type(value)(to_meta(v) for v in value)
    return value


_PLAIN_SCALARS = frozenset({int, float, bool, type(None)})


# --------------------------------------------------------------------------- meta outputs, memoised
#
# Capture computes every recorded op's outputs on the meta device. The same op with the same
# argument shapes comes back again and again (each layer's piece, each size's FULL graph
# re-issuing its pieces' ops), so the meta outputs are memoised on (op, argument signature):
# a tensor's signature is its sizes, strides, storage offset and dtype — all a meta kernel can
# see — and a host value's is its type and value. Arguments without a signature (symbolic
# sizes, opaque objects) are never memoised. Meta kernels are pure functions of that
# signature, so a hit hands back what a fresh call would compute; the returned meta tensors
# are only read (sizes, strides, dtype, byte counts), never written.

NO_META = object()  # the op has no meta kernel (the caller runs it for real)
_MISS = object()
META_CACHE_LIMIT = 20_000
_meta_cache: dict[tuple, Any] = {}
_HOST_TYPES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class NoSignature(Exception):
    """An argument whose signature a memo cannot take (an opaque object)."""


_TENSOR = torch.Tensor
_TENSOR_TYPES: dict[type, bool] = {}  # type -> is a torch.Tensor (subclass): one isinstance per type
# Host values whose equality does not tell their types apart (1 == 1.0 == True, yet an int, a
# float and a bool scalar promote differently): their signature carries the type.
_NUMBERS = frozenset({int, float, bool})
_PLAIN_HOST = frozenset(_HOST_TYPES) - _NUMBERS


def _is_tensor_type(cls: type) -> bool:
    known = _TENSOR_TYPES.get(cls)
    if known is None:
        known = _TENSOR_TYPES[cls] = issubclass(cls, torch.Tensor)
    return known


def _signature(value: Any) -> Any:
    """What a meta kernel (or the cost model) can see of one argument, hashable: a tensor's
    sizes, strides, storage offset and dtype; a host value itself (numbers with their type);
    lists and tuples item by item. Anything else raises NoSignature."""
    cls = type(value)
    if cls is _TENSOR:  # the most common argument
        return (value.shape, value.stride(), value.storage_offset(), value.dtype)
    if cls in _PLAIN_HOST:
        return value
    if cls in _NUMBERS:
        return (cls, value)
    if cls is list or cls is tuple:
        if all(type(v) is int for v in value):  # sizes, attention's host lists: one pass, no recursion
            return (cls, int, tuple(value))
        return (cls, signature_of(value))
    if _is_tensor_type(cls):
        return (value.shape, value.stride(), value.storage_offset(), value.dtype)
    if isinstance(value, (list, tuple)):
        return (cls, signature_of(value))
    if isinstance(value, _HOST_TYPES):
        return (cls, value)
    raise NoSignature


def signature_of(values: Sequence[Any]) -> tuple:
    """The signatures of a sequence of arguments (see `_signature`); raises NoSignature."""
    return tuple([_signature(v) for v in values])


def call_signature(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Optional[tuple]:
    """A hashable key of one call: the op and its arguments' signatures, or None when an
    argument has none (opaque objects). Memoised per-op decisions key on it; a key holding a
    symbolic size is unhashable (TypeError on lookup: treat it as no key)."""
    try:
        return (func, signature_of(args), signature_of(sorted(kwargs.items())) if kwargs else ())
    except (NoSignature, TypeError):
        return None


def meta_outputs(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``func``'s outputs on the meta device for these arguments (NO_META without a meta
    kernel); memoised on the arguments' signature. Call with torch-function handling and
    the simulator's modes off."""
    key = call_signature(func, args, kwargs)
    if key is not None:
        try:
            cached = _meta_cache.get(key, _MISS)
        except TypeError:  # a symbolic size
            key, cached = None, _MISS
        if cached is not _MISS:
            return cached
    try:
        result = func(*to_meta(args), **{k: to_meta(v) for k, v in kwargs.items()})
    except KernelContractError:
        raise  # the kernel refuses these arguments (its fake implementation checked the contract): say so
    except (NotImplementedError, RuntimeError, TypeError):
        result = NO_META
    if key is not None:
        if len(_meta_cache) >= META_CACHE_LIMIT:
            _meta_cache.clear()
        _meta_cache[key] = result
    return result


def constraint_message(kind: int, func: Any, graph: str) -> str:
    name = str(func)
    if kind == HOST_SYNC:
        return HOST_SYNC_DURING_CAPTURE.format(what=_HOST_SYNC_HINTS.get(func, name) + f" ({name})", graph=graph)
    if kind == DYNAMIC_SHAPE:
        return DYNAMIC_SHAPE_DURING_CAPTURE.format(what=name, graph=graph)
    if kind == METADATA_CHANGE:
        return METADATA_CHANGE_DURING_CAPTURE.format(what=name, graph=graph)
    return RNG_DURING_CAPTURE.format(what=name, graph=graph)


@contextlib.contextmanager
def wrapper_reentry() -> Iterator[None]:
    """Run a wrapper op's Python implementation as if called from Python.

    A custom op reaches a dispatch mode *below* autograd (its autograd kernel redispatches
    with the autograd keys excluded). Left so, the CompositeImplicitAutograd ops its
    implementation issues (``Tensor.to(dtype)``, ``reshape`` of a non-contiguous tensor,
    ``contiguous()``...) decompose without ever reaching the mode: they would run at capture
    and their results be frozen into the graph instead of being recorded.
    """
    key = torch._C.DispatchKey.AutogradFunctionality
    excluded = torch._C._dispatch_tls_is_dispatch_key_excluded(key)
    if excluded:
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
    try:
        yield
    finally:
        if excluded:
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, True)


# Namespaces of Python custom ops registered for the accelerator's dispatch key: vLLM's
# (vllm/utils/torch_utils.py direct_register_custom_op with current_platform.dispatch_key, which
# is "PrivateUse1" on NPUPlatform).
PYTHON_DEVICE_OP_NAMESPACES = frozenset({"vllm"})
_PRIVATEUSE1 = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


def _is_python_device_op(func: Any, args: Any, kwargs: dict) -> bool:
    if getattr(func, "namespace", None) not in PYTHON_DEVICE_OP_NAMESPACES:
        return False
    if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "PrivateUse1"):
        return False
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    return any(isinstance(leaf, torch.Tensor) and leaf.device.type == "npu" for leaf in leaves)


_COMPOSITE_IMPLICIT: dict[Any, bool] = {}  # OpOverload -> has a CompositeImplicitAutograd kernel (pure)
# OpOverloads a mode hands to `handle` as they come: no CompositeImplicitAutograd kernel and not in
# a Python device-op namespace (both fixed per op; a wrapper op is still looked up first, per call).
_PLAIN_OPS: set[Any] = set()


def _decomposes(func: Any) -> bool:
    known = _COMPOSITE_IMPLICIT.get(func)
    if known is None:
        known = _COMPOSITE_IMPLICIT[func] = bool(
            torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"))
    return known


class _Mode(LazyDynamoDispatchMode):
    """Base of the simulator's dispatch modes.

    A wrapper op (docs/decisions.md "Attention under capture is a wrapper op") is never handled as one op: the mode
    re-enters itself and runs the wrapper's Python implementation, so the kernel ops it
    issues are what the subclass sees in `handle`.
    """

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Let torch.compile compile under the mode; its compiled ops still reach us.
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        impl = ag_ops._WRAPPER_OPS.get(func)
        if impl is not None:
            with reentered(self), wrapper_reentry():
                return impl(*args, **kwargs)
        if func in _PLAIN_OPS:  # most ops: neither a Python device op nor a decomposing one
            return self.handle(func, args, kwargs)
        if _is_python_device_op(func, args, kwargs):
            # A Python custom op on npu tensors (vLLM's attention, GEMM and rotary ops, registered
            # for the accelerator's key by vllm.utils.torch_utils.direct_register_custom_op) is no
            # kernel: on a card its Python code runs and launches the kernels. Run it with the
            # mode re-entered, so what it issues (kernels, events, task groups) is what we see.
            with reentered(self), wrapper_reentry():
                return func.redispatch(_PRIVATEUSE1, *args, **kwargs)
        if _decomposes(func):
            # A CompositeImplicitAutograd op reaches a mode only below autograd (inference mode, a
            # compiled graph): ``contiguous``, ``reshape``, ``Tensor.to``... Its schema calls the
            # result an alias, yet it copies when it must; run its decomposition with the mode
            # re-entered, so the copy is recorded as the kernel it is instead of running once now.
            with reentered(self):
                result = func.decompose(*args, **kwargs)
            if result is not NotImplemented:
                return result
        elif getattr(func, "namespace", None) not in PYTHON_DEVICE_OP_NAMESPACES:
            _PLAIN_OPS.add(func)  # both answers depend on the op alone from now on
        return self.handle(func, args, kwargs)

    def handle(self, func: Any, args: Any, kwargs: dict) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


class CaptureRecorder(_Mode):
    """The dispatch mode of one capture; `sim.capture.Capture` decides what each op becomes."""

    def __init__(self, capture: "Capture") -> None:
        super().__init__()
        self.capture = capture

    def handle(self, func: Any, args: Any, kwargs: dict) -> Any:
        return self.capture.dispatch(func, args, kwargs)


class UpdateCollector(_Mode):
    """The dispatch mode of a task update: ops are collected, not run."""

    def __init__(self, update: "Update") -> None:
        super().__init__()
        self.update = update

    def handle(self, func: Any, args: Any, kwargs: dict) -> Any:
        return self.update.dispatch(func, args, kwargs)


class EagerTracker(_Mode):
    """Charges eager kernels to the virtual clock (and the kernel log when profiling);
    aliases, host work and allocations run free (they launch no kernel)."""

    def __init__(self, device: "SimDevice") -> None:
        super().__init__()
        self.device = device

    def handle(self, func: Any, args: Any, kwargs: dict) -> Any:
        stream = self.device.current_stream()
        if stream.pending:  # an eager kernel must not overtake the work queued on its stream (sim.queues)
            self.device.queues.run(stream)
        if func in WIDENED_MATMULS and widens(func, args, kwargs):
            out = widened_matmul(func, args, kwargs)  # half precision: float32 accumulation (sim.matmul)
        else:
            out = func(*args, **kwargs)
        if self.device.op_info(func).launches_kernel:
            self.device.charge_eager(func, args, kwargs, out)
        return out


for _mode_type in (CaptureRecorder, UpdateCollector, EagerTracker):
    # a compiled graph's mutating ops: what their dense implementation issues is what each mode sees
    run_functionalized_ops_under(_mode_type)


_SYNC_METHODS = frozenset(
    f
    for f in (
        torch.Tensor.tolist,
        torch.Tensor.cpu,
        torch.Tensor.numpy,
        torch.Tensor.__array__,
        torch.Tensor.__repr__,
        torch.Tensor.__format__,
        getattr(torch.Tensor, "__str__", None),
    )
    if f is not None
)
_SYNC_NAMES = {
    torch.Tensor.tolist: "Tensor.tolist()",
    torch.Tensor.cpu: "Tensor.cpu()",
    torch.Tensor.numpy: "Tensor.numpy()",
    torch.Tensor.__array__: "numpy.asarray(tensor)",
    torch.Tensor.__repr__: "printing a tensor (repr)",
    torch.Tensor.__format__: "formatting a tensor (f-string)",
}


_TENSOR_TO = torch.Tensor.to


def _moves_to_host(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    candidates = list(args[1:]) + [kwargs.get("device")]
    for value in candidates:
        if isinstance(value, str) and value.split(":")[0] == "cpu":
            return True
        if isinstance(value, torch.device) and value.type == "cpu":
            return True
    return False


class HostSyncGuard(TorchFunctionMode):
    """Rejects Python-level host synchronisation while a capture is under way."""

    def __init__(self, on_sync: Callable[[str], BaseException],
                 host_memory: Optional[Callable[[torch.Tensor], bool]] = None) -> None:
        super().__init__()
        self.on_sync = on_sync
        self.host_memory = host_memory  # tensors in host memory (SimDevice.host_memory): reading them waits for nothing

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.host_memory is not None and args and isinstance(args[0], torch.Tensor) and self.host_memory(args[0]):
            return func(*args, **kwargs)
        if func in _SYNC_METHODS:
            raise self.on_sync(_SYNC_NAMES.get(func, getattr(func, "__name__", str(func))))
        if func is _TENSOR_TO and _moves_to_host(args, kwargs):
            raise self.on_sync("Tensor.to('cpu')")
        return func(*args, **kwargs)


def reject(kind: int, func: Any, graph: str) -> CaptureConstraintError:
    return CaptureConstraintError(constraint_message(kind, func, graph))
