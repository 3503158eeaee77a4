"""Every op on npu tensors that the C++ does not implement: the CPU kernel, on the same memory.

Why. An npu tensor's bytes are host memory the simulator owns, so a CPU alias of it (same
address, offset, sizes, strides and dtype; ``cpu_aliases`` in the C++) lets torch's CPU kernel
compute on device memory directly: nothing is copied in. PyTorch's out-of-tree device example
(``test/cpp_extensions/open_registration_extension``, pytorch_openreg's ``_aten_impl.py``)
routes its ops the same way: output metadata from the meta device, outputs allocated on the
device, the kernel run on the device's memory.

What happens to one op (`run`), at the moment the host issues it:

* tensors of another device are refused in torch's words (a CPU tensor where an npu one is
  needed, an ``npu:1`` tensor beside ``npu:0`` ones: "Expected all tensors to be on the same
  device, ..."); 0-dim CPU tensors are scalars and pass, as TensorIterator lets them; index
  tensors of indexing ops, and the host arguments a kernel declares (`allow_host_tensors`:
  the ATB paged attention's ``context_lens``), may live on the host;
* the op runs on the simulated NPU that serves its tensors' device index now; a tensor made on
  a simulated NPU the facade has since replaced (a fresh one per test) stays usable: its memory
  lives as long as the tensor;
* a weak alias (``torch_npu._C._weak_ref_tensor``) whose block was freed or handed out again
  is refused (`sim.npu_device.simulator.check_weak_reference`);
* views get their metadata from the meta device and alias the input's storage;
* in-place and ``out=`` ops: an ``out=`` tensor of the wrong size is resized on the device,
  then the kernel runs on the aliases;
* other ops: outputs are allocated on the device (the caching allocator, at issue time, as on
  a card) with the meta device's sizes and strides; the kernel runs on the aliases and its
  result is written into the outputs' memory;
* random ops draw a seed from the npu generator (torch_npu's default one unless the call
  passes one) at issue time and run with a CPU generator seeded with it: reproducible under
  ``torch.npu.manual_seed`` and independent of when the device gets to the work;
* ops whose result the host needs now (a Python number, a data-dependent shape: ``equal``,
  ``nonzero``, ``unique``) and ops without a meta kernel synchronise: the host reads device
  memory (`simulator.host_read`), refused inside a capture.

The kernel itself is *submitted* to the current stream's queue (`simulator.submit`): the device
runs it when the host waits for the stream, behind the host. The queued work holds aliases that
own nothing, plus the segments their bytes lie in: a tensor the host drops gives its block back
to the caching allocator at once, as on a card, and the work still finds its bytes mapped.
Copies between host and device follow torch's rules: a ``non_blocking`` copy from or into
pinned host memory is queued (`simulator.copy`, whose host side `sim.npu_device.host_guard`
guards until the host waited for it); any
other copy involving host memory is synchronous (the host waits for the stream; from the
device this is a host read).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from sim.npu_device import host_guard, simulator
from sim.npu_device.driver import Driver
from sim.pool_memory import READ, argument_roles
from sim.recorder import NO_META, meta_outputs

__all__ = ["Fallback", "DEVICE_MISMATCH", "running_on_device", "on_device"]

_ON_DEVICE: contextvars.ContextVar[bool] = contextvars.ContextVar("sim_npu_device_on_device", default=False)


def running_on_device() -> bool:
    """Whether the code running is an npu op's CPU kernel on the device's memory (the
    fallback's work), as opposed to a call the host made with CPU tensors."""
    return _ON_DEVICE.get()


@contextlib.contextmanager
def on_device() -> Iterator[None]:
    token = _ON_DEVICE.set(True)
    try:
        yield
    finally:
        _ON_DEVICE.reset(token)


aten = torch.ops.aten
NPU = "npu"

# c10's common-device check (aten/src/ATen/core/adaption.cpp, "Expected all tensors to be on the
# same device, but got ... is on ..., different from other tensors on ... (when checking argument
# in method ...)"), which torch_npu's generated wrappers (wrapper_NPU_<overload>_<name>) call.
DEVICE_MISMATCH = (
    "Expected all tensors to be on the same device, but got {argument} is on {device}, different from other "
    "tensors on {common} (when checking argument in method {method})"
)
NO_FACTORY = (
    "sim.npu_device: {op} creates a tensor on the npu device without a tensor argument, which the simulated NPU does "
    "not implement; create it on the CPU and move it with .to('npu')"
)
# Ops that may take their index tensors from the host (torch's indexing kernels move them).
HOST_INDEX_OPS = frozenset({"aten::index", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_",
                            "aten::_unsafe_index", "aten::_unsafe_index_put"})
# Ops that only bookkeep for the caching allocator (no kernel on the simulated NPU).
NO_OP = frozenset({aten.record_stream.default})


def _method_name(op: Any) -> str:
    name = op._schema.name.split("::")[-1]
    overload = op._overloadname if op._overloadname != "default" else ""
    return f"wrapper_NPU_{overload}_{name}"


def _argument_names(op: Any, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """(argument name, value) for every argument of the call, tensors inside lists included."""
    names = [a.name for a in op._schema.arguments]
    pairs: list[tuple[str, Any]] = []
    for index, value in enumerate(args):
        pairs.append((names[index] if index < len(names) else f"argument {index}", value))
    pairs.extend(kwargs.items())
    return pairs


def _scalar_tensor(value: Any) -> torch.Tensor:
    """A Python number as the 0-dim CPU tensor torch would have wrapped it in (the dtype a wrapped
    number promotes like: the default float / complex dtype, int64, bool)."""
    if isinstance(value, bool):
        return torch.tensor(value, dtype=torch.bool)
    if isinstance(value, int):
        return torch.tensor(value, dtype=torch.int64)
    if isinstance(value, complex):
        return torch.tensor(value, dtype=torch.complex64 if torch.get_default_dtype() == torch.float32
                            else torch.complex128)
    return torch.tensor(value, dtype=torch.get_default_dtype())


def _numbers_as_tensors(op: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Tensor arguments that reached the fallback as Python numbers (torch hands a wrapped number,
    ``t % 8``'s ``8``, to a Python kernel as the number) become tensors again."""
    arguments = op._schema.arguments
    fixed = list(args)
    for index, value in enumerate(args):
        if index < len(arguments) and isinstance(value, (int, float, complex)) and \
                str(arguments[index].type) in ("Tensor", "Optional[Tensor]"):
            fixed[index] = _scalar_tensor(value)
    if kwargs:
        types = {a.name: str(a.type) for a in arguments}
        kwargs = {name: _scalar_tensor(value) if isinstance(value, (int, float, complex))
                  and types.get(name) in ("Tensor", "Optional[Tensor]") else value for name, value in kwargs.items()}
    return tuple(fixed), kwargs


class Fallback:
    """The PrivateUse1 fallback (see the module docstring); one per process, like the driver."""

    def __init__(self, driver: Driver, extension: Any, generator: Callable[[int], Any]) -> None:
        self.driver = driver
        self.ext = extension
        self._generator = generator  # index -> the npu device's default generator
        # Qualified op name -> arguments that may be host (CPU) tensors (`allow_host_tensors`).
        self.host_arguments: dict[str, frozenset[str]] = {name: frozenset({"indices"}) for name in HOST_INDEX_OPS}
        self._special: dict[Any, Callable[..., Any]] = {
            aten._copy_from.default: self._copy_from,
            aten._copy_from_and_resize.default: self._copy_from_and_resize,
            aten._local_scalar_dense.default: self._local_scalar_dense,
        }

    # ------------------------------------------------------------------ entry point
    def __call__(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        special = self._special.get(op)
        if special is not None:
            return special(*args, **kwargs)
        if op in NO_OP:
            return None
        return self.run(op, args, kwargs)

    # ------------------------------------------------------------------ checks
    def allow_host_tensors(self, op_name: str, arguments: frozenset[str]) -> None:
        """Let ``op_name``'s ``arguments`` be host tensors (a kernel that reads them on the host)."""
        self.host_arguments[op_name] = self.host_arguments.get(op_name, frozenset()) | arguments

    def _check_devices(self, op: Any, args: tuple, kwargs: dict) -> None:
        common: Optional[torch.device] = next(self._npu_devices(args, kwargs), None)
        host = self.host_arguments.get(op._schema.name, frozenset())
        for name, value in _argument_names(op, args, kwargs):
            values = value if isinstance(value, (list, tuple)) else (value,)
            for item in values:
                if not isinstance(item, torch.Tensor):
                    continue
                if item.device == common:
                    continue
                if item.device.type == "cpu" and (item.dim() == 0 or name in host):
                    continue
                raise RuntimeError(DEVICE_MISMATCH.format(argument=name, device=item.device, common=common,
                                                          method=_method_name(op)))

    @staticmethod
    def _npu_devices(args: tuple, kwargs: dict) -> Any:
        leaves, _ = tree_flatten((args, kwargs))
        return (leaf.device for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.device.type == NPU)

    def _device_of(self, index: Optional[int], bases: list[int]) -> Any:
        """The simulated NPU the op runs on: the one serving ``npu:<index>`` now (without one
        attached, the one that made its tensors). A tensor of a simulated NPU replaced since
        gets the work its own device still has queued done first."""
        owners = [owner for owner in (self.driver.owner(base) for base in bases if base) if owner is not None]
        if self.driver.attached or not owners:
            device = self.driver.device(index or 0)
        else:
            device = owners[0]
        for owner in dict.fromkeys(owners):
            if owner is not device and owner.queues.pending():
                simulator.flush(owner, None, reason=f"a tensor of {owner!r} used on {device!r}")
        return device

    def _check_weak(self, op: Any, tokens: list[int], names: list[str]) -> None:
        _, roles = argument_roles(op)
        for token, name in zip(tokens, names):
            if token >= 0:
                self.driver.check_weak(token, op, role=roles.get(name, READ))

    # ------------------------------------------------------------------ aliases
    def _aliases(self, op: Any, args: tuple, kwargs: dict) -> tuple[Any, Any, Any, list[Any]]:
        """(CPU-alias args, kwargs, the simulated NPU, keepers): npu tensors replaced by CPU
        aliases that own nothing, and what keeps their memory mapped (the blocks' segments) for
        work that runs later: a tensor the host frees meanwhile gives its block back at once, as
        the caching allocator does, while the queued work still reads or writes the bytes."""
        leaves, spec = tree_flatten((args, kwargs))
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) and leaf.device.type == NPU]
        tensors = [leaves[i] for i in positions]
        aliases, bases, weak = self.ext.cpu_aliases(tensors, False) if tensors else ([], [], [])
        if any(token >= 0 for token in weak):
            self._check_weak(op, weak, self._leaf_names(op, args, kwargs, positions))
        device = self._device_of(tensors[0].device.index if tensors else None, bases)
        for position, alias in zip(positions, aliases):
            leaves[position] = alias
        cpu_args, cpu_kwargs = tree_unflatten(leaves, spec)
        return cpu_args, cpu_kwargs, device, self.driver.keepers(bases)

    @staticmethod
    def _leaf_names(op: Any, args: tuple, kwargs: dict, positions: list[int]) -> list[str]:
        """The argument name of each flattened leaf at ``positions``."""
        names = [a.name for a in op._schema.arguments]
        leaf_names: list[str] = []
        for index, value in enumerate(args):
            leaf_names.extend([names[index] if index < len(names) else ""] * len(tree_flatten(value)[0]))
        for name, value in kwargs.items():
            leaf_names.extend([name] * len(tree_flatten(value)[0]))
        return [leaf_names[i] if i < len(leaf_names) else "" for i in positions]

    # ------------------------------------------------------------------ random numbers
    def _seeded(self, op: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Random ops draw from the npu generator now and run with a CPU generator."""
        if torch.Tag.nondeterministic_seeded not in op.tags:
            return args, kwargs
        names = [a.name for a in op._schema.arguments]
        if "generator" not in names:
            return args, kwargs
        position = names.index("generator")
        generator = args[position] if position < len(args) else kwargs.get("generator")
        if generator is None:
            generator = self._generator(next(self._npu_devices(args, kwargs)).index or 0)
        state = generator.get_state()
        draw = torch.Generator()
        draw.set_state(state)
        seed = int(torch.randint(0, 2**62, (), generator=draw))
        generator.set_state(draw.get_state())
        proxy = torch.Generator().manual_seed(seed)
        if position < len(args):
            args = args[:position] + (proxy,) + args[position + 1:]
        else:
            kwargs = {**kwargs, "generator": proxy}
        return args, kwargs

    # ------------------------------------------------------------------ ops
    def run(self, op: Any, args: tuple, kwargs: dict) -> Any:
        args, kwargs = _numbers_as_tensors(op, args, kwargs)
        self._check_devices(op, args, kwargs)
        if not any(True for _ in self._npu_devices(args, kwargs)):
            raise NotImplementedError(NO_FACTORY.format(op=op))
        schema = op._schema
        returns = schema.returns
        if any(str(r.type) not in ("Tensor", "List[Tensor]", "Optional[Tensor]") for r in returns) or (
            torch.Tag.dynamic_output_shape in op.tags or torch.Tag.data_dependent_output in op.tags
        ):
            return self._synchronous(op, args, kwargs, reason="its result is read on the host")
        if op.is_view:
            return self._view(op, args, kwargs)
        if schema.is_mutable:
            return self._in_place(op, args, kwargs)
        return self._functional(op, args, kwargs)

    def _synchronous(self, op: Any, args: tuple, kwargs: dict, *, reason: str) -> Any:
        args, kwargs = self._seeded(op, args, kwargs)
        cpu_args, cpu_kwargs, device, _ = self._aliases(op, args, kwargs)
        simulator.host_read(device, f"{op} ({reason})")
        with on_device():
            result = op(*cpu_args, **cpu_kwargs)
        return tree_map(lambda value: self._to_device(value) if isinstance(value, torch.Tensor) else value, result)

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type == NPU:
            return tensor
        out = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=NPU)
        (alias,), _, _ = self.ext.cpu_aliases([out], True)
        alias.copy_(tensor)
        return out

    def _view(self, op: Any, args: tuple, kwargs: dict) -> Any:
        with torch._C.DisableTorchFunction():
            meta = meta_outputs(op, args, kwargs)
        if meta is NO_META:
            raise NotImplementedError(f"sim.npu_device: the view op {op} has no meta kernel")
        source = args[0]
        if not isinstance(source, torch.Tensor):
            raise NotImplementedError(f"sim.npu_device: the view op {op} does not view its first argument")
        self._aliases(op, (source,), {})  # the weak-reference and ownership checks

        def view_of(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            if value.dtype != source.dtype:
                raise NotImplementedError(f"sim.npu_device: the view op {op} changes the dtype")
            return torch.as_strided(source, value.size(), value.stride(), source.storage_offset() + value.storage_offset())

        return tree_map(view_of, meta)

    def _in_place(self, op: Any, args: tuple, kwargs: dict) -> Any:
        schema = op._schema
        with torch._C.DisableTorchFunction():
            meta = meta_outputs(op, args, kwargs)
        if meta is NO_META:
            return self._synchronous(op, args, kwargs, reason="it has no meta kernel")
        written = self._written_arguments(op, args, kwargs)
        metas = (meta,) if len(schema.returns) == 1 else tuple(meta or ())
        for target, result in zip(written, metas):
            if isinstance(target, torch.Tensor) and isinstance(result, torch.Tensor) and target.shape != result.shape:
                target.resize_(result.shape)  # an out= tensor of the wrong size, as torch's resize_output
        args, kwargs = self._seeded(op, args, kwargs)
        cpu_args, cpu_kwargs, device, keep = self._aliases(op, args, kwargs)

        def work(keep: list[Any] = keep) -> None:
            with on_device():
                op(*cpu_args, **cpu_kwargs)

        simulator.submit(device, simulator.current_stream(device), work, label=str(op))
        if not schema.returns:
            return None
        values = [self._returned_argument(op, index, args, kwargs) for index in range(len(schema.returns))]
        return values[0] if len(values) == 1 else tuple(values)

    @staticmethod
    def _written_arguments(op: Any, args: tuple, kwargs: dict) -> list[Any]:
        """Per return, the argument it aliases (None when it aliases none)."""
        return [Fallback._returned_argument(op, index, args, kwargs) for index in range(len(op._schema.returns))]

    @staticmethod
    def _returned_argument(op: Any, index: int, args: tuple, kwargs: dict) -> Any:
        ret = op._schema.returns[index]
        if ret.alias_info is None:
            return None
        sets = ret.alias_info.before_set
        for position, argument in enumerate(op._schema.arguments):
            if argument.alias_info is not None and argument.alias_info.before_set & sets:
                if position < len(args) and not argument.kwarg_only:
                    return args[position]
                return kwargs.get(argument.name)
        return None

    def _functional(self, op: Any, args: tuple, kwargs: dict) -> Any:
        with torch._C.DisableTorchFunction():
            meta = meta_outputs(op, args, kwargs)
        if meta is NO_META:
            return self._synchronous(op, args, kwargs, reason="it has no meta kernel")
        outputs = tree_map(
            lambda m: torch.empty_strided(m.size(), m.stride(), dtype=m.dtype, device=NPU)
            if isinstance(m, torch.Tensor) else m,
            meta,
        )
        out_leaves = [leaf for leaf in tree_flatten(outputs)[0] if isinstance(leaf, torch.Tensor)]
        args, kwargs = self._seeded(op, args, kwargs)
        cpu_args, cpu_kwargs, device, keep = self._aliases(op, args, kwargs)
        out_aliases, out_bases, _ = self.ext.cpu_aliases(out_leaves, False) if out_leaves else ([], [], [])
        keep = keep + self.driver.keepers(out_bases)

        def work(keep: list[Any] = keep) -> None:
            with on_device():
                result = op(*cpu_args, **cpu_kwargs)
            results = [leaf for leaf in tree_flatten(result)[0] if isinstance(leaf, torch.Tensor)]
            for target, value in zip(out_aliases, results):
                target.copy_(value)

        simulator.submit(device, simulator.current_stream(device), work, label=str(op))
        return outputs

    # ------------------------------------------------------------------ copies, host reads
    def _copy_from(self, source: torch.Tensor, destination: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        """``destination.copy_(source)`` when either is an npu tensor."""
        source_npu, destination_npu = source.device.type == NPU, destination.device.type == NPU
        if source_npu and destination_npu and source.device != destination.device:
            return self._copy_between_devices(source, destination)
        npu_side = [t for t in (source, destination) if t.device.type == NPU]
        cpu_args, _, device, keep = self._aliases(aten._copy_from.default, tuple(npu_side), {})
        aliases = iter(cpu_args)
        source_view = next(aliases) if source_npu else source
        destination_view = next(aliases) if destination_npu else destination
        stream = simulator.current_stream(device)

        def work(keep: list[Any] = keep) -> None:
            destination_view.copy_(source_view)

        if source_npu and destination_npu:
            simulator.submit(device, stream, work, label="copy (device to device)")
        elif destination_npu:  # host to device
            if non_blocking and source.is_pinned():
                (destination_view,), _, _ = self.ext.cpu_aliases([destination], True)  # the queue holds it
                simulator.copy(device, stream, destination_view, source_view, destination_is_host=False,
                               source_is_host=True, label="copy (host to device, non_blocking from pinned memory)")
                host_guard.guard_copy(device)  # the host must not write the source until it waited
            else:  # synchronous, as torch's: from pageable memory the host waits for the stream
                simulator.flush(device, stream, reason="a synchronous copy from host memory to the device")
                work()
        else:  # device to host
            if non_blocking and destination.is_pinned():
                (source_view,), _, _ = self.ext.cpu_aliases([source], True)  # the queue holds it
                simulator.copy(device, stream, destination_view, source_view, destination_is_host=True,
                               source_is_host=False, label="copy (device to host, non_blocking into pinned memory)")
                host_guard.guard_copy(device)  # the host must not read the destination until it waited
            else:
                simulator.host_read(device, "a copy from the device to host memory (Tensor.cpu(), .to('cpu'), "
                                            ".tolist(), print)")
                work()
        return destination

    def _copy_between_devices(self, source: torch.Tensor, destination: torch.Tensor) -> torch.Tensor:
        """A copy from ``npu:i`` to ``npu:j``: two simulated NPUs (torch_npu copies between cards
        too). Synchronous here: the host waits for the source's stream, then for the
        destination's, and copies."""
        (source_view,), _, source_device, _ = self._aliases(aten._copy_from.default, (source,), {})
        (destination_view,), _, destination_device, _ = self._aliases(aten._copy_from.default, (destination,), {})
        simulator.host_read(source_device, f"a copy from {source.device} to {destination.device}")
        simulator.flush(destination_device, simulator.current_stream(destination_device),
                        reason=f"a copy from {source.device} to {destination.device}")
        destination_view.copy_(source_view)
        return destination

    def _copy_from_and_resize(self, source: torch.Tensor, destination: torch.Tensor) -> torch.Tensor:
        if destination.shape != source.shape:
            destination.resize_(source.shape)
        return self._copy_from(source, destination)

    def _local_scalar_dense(self, tensor: torch.Tensor) -> Any:
        (alias,), _, device, _ = self._aliases(aten._local_scalar_dense.default, (tensor,), {})
        simulator.host_read(device, "Reading a tensor's value on the host (.item(), bool(t), int(t), float(t), `if t:`)")
        return alias.item()
