"""CPU reference kernels for the ``ascendgraph`` custom ops (registered for the CPU key).

Numerics: norms, rope and attention compute in float32 and cast the result back to the
input dtype; a fused kernel is written as the composition of the unfused ones, so a
fusion pass that replaces ``add`` + ``rms_norm`` by ``add_rms_norm`` (and so on) changes
no bit of the result. Attention is the fused attention's computation (sim/attention.py,
shared with the facade's torch_npu kernels) in its sparse_mode 3, vectorised over the
requests that share a query length.

Kernel contracts. Each registered kernel first checks its call against
`ascendgraph.kernel_contracts` through hw's mapping (`ascendgraph.kernel_calls`), as an
NPU would refuse it: when issued eagerly (here, in the kernel), when recorded by a capture
and when re-issued by a task update (`on_capture` / `on_update`, called by ``sim.capture``),
never per replay (a replay runs under `replaying()`). A violation raises
KernelContractError. The rules a device relaxes (``allow_float32_attention``: the
half-precision dtype rules, docs/decisions.md "float32 on the simulator") come from the device's
`ContractPolicy`. The kernels are process-wide (torch.library is), so an eager kernel takes the
policy of the device whose scope it runs in — ``device.track_eager()``, ``device.warmup_scope()``,
``device.kernel_policy()``, all setting the `contract_policy` ContextVar: inside them two devices
never see each other's policy. Outside every scope (the engine's eager attention between the
piecewise graphs of a capture, a test calling an op directly) nothing says which device a CPU
tensor's kernel belongs to, and the newest device's policy applies: the one process-wide
fallback, set when a device is created.

Lazy initialisation (docs/decisions.md "Warm-ups and lazy initialisation"). The first launch of a kernel for a new shape allocates its
workspace (aclnn tiling and workspace). Eager launches mark (kernel, shape, dtype) as
initialised on the device's policy; a capture that records a kernel for a signature never
launched before refuses it with CaptureConstraintError: a capture without warm-up fails.

`register_cpu_kernels()` is idempotent; importing the ``sim`` package calls it.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor

from ascendgraph import ops
from ascendgraph.dynamo_gate import defer_kernel_dynamo_guard
from ascendgraph import reference as _reference
from ascendgraph.errors import CaptureConstraintError, KernelContractError
from ascendgraph.kernel_calls import CHECKED_OPS, check_op
from ascendgraph.kernel_contracts import FLOAT32_LENIENT_RULES, RULES, message, violations
from ascendgraph.workspace_sizes import paged_attention_op_workspace_bytes
from sim.attention import KVSource, Masking, attend

__all__ = [
    "register_cpu_kernels",
    "ContractPolicy",
    "LAZY_INIT_DURING_CAPTURE",
    "FLOAT32_LENIENT_RULES",
    "register",
    "current_policy",
    "contract_policy",
    "unchecked",
    "replaying",
    "replaying_now",
    "on_capture",
    "on_update",
    "check_kernel_call",
    "rms_norm_ref",
    "add_rms_norm_ref",
    "dynamic_quant_ref",
    "quantize_ref",
    "rotary_embedding_ref",
    "split_qkv_rmsnorm_rope_ref",
    "muls_add_ref",
    "reshape_and_cache_ref",
    "paged_attention_ref",
    "attention_workspace_ref",
]

# The formulas live in ascendgraph.reference (shared with hw/'s fallbacks); the simulator's
# CPU kernels are exactly these.
rms_norm_ref = _reference.rms_norm
add_rms_norm_ref = _reference.add_rms_norm
dynamic_quant_ref = _reference.dynamic_quant
quantize_ref = _reference.quantize
add_rms_norm_dynamic_quant_ref = _reference.add_rms_norm_dynamic_quant
add_rms_norm_quant_ref = _reference.add_rms_norm_quant
rotary_embedding_ref = _reference.rotary_embedding
split_qkv_rmsnorm_rope_ref = _reference.split_qkv_rmsnorm_rope
muls_add_ref = _reference.muls_add


# --------------------------------------------------------------------------- KV cache


def reshape_and_cache_ref(
    key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor
) -> None:
    slots = slot_mapping.reshape(-1).long()
    tokens = slots.shape[0]
    keep = slots >= 0
    flat_k = key_cache.view(-1, *key_cache.shape[2:])
    flat_v = value_cache.view(-1, *value_cache.shape[2:])
    k = key.reshape(tokens, *key_cache.shape[2:])
    v = value.reshape(tokens, *value_cache.shape[2:])
    if bool(keep.all()):
        flat_k.index_copy_(0, slots, k)
        flat_v.index_copy_(0, slots, v)
    else:
        index = keep.nonzero().squeeze(1)
        flat_k.index_copy_(0, slots[index], k[index])
        flat_v.index_copy_(0, slots[index], v[index])


# --------------------------------------------------------------------------- attention


def _check_attention_args(
    query: Tensor, key_cache: Tensor, block_table: Tensor, ends: list[int], seq_lens: list[int]
) -> None:
    if len(ends) != len(seq_lens):
        raise ValueError(
            f"paged_attention: actual_seq_lengths has {len(ends)} entries but seq_lens has "
            f"{len(seq_lens)}; both need one entry per request"
        )
    previous = 0
    for end in ends:
        if end < previous:
            raise ValueError(
                f"paged_attention: actual_seq_lengths must be cumulative (non-decreasing) end "
                f"offsets, got {list(ends)}"
            )
        previous = end
    if previous > query.shape[0]:
        raise ValueError(
            f"paged_attention: actual_seq_lengths ends at {previous} but query has "
            f"{query.shape[0]} tokens"
        )
    if query.shape[1] % key_cache.shape[2]:
        raise ValueError(
            f"paged_attention: {query.shape[1]} query heads are not a multiple of "
            f"{key_cache.shape[2]} kv heads"
        )
    if len(seq_lens) > block_table.shape[0]:
        raise ValueError(
            f"paged_attention: {len(seq_lens)} requests but block_table has "
            f"{block_table.shape[0]} rows"
        )
    if seq_lens:
        capacity = block_table.shape[1] * key_cache.shape[1]
        longest = max(seq_lens)
        if longest > capacity:
            raise ValueError(
                f"paged_attention: a seq_len of {longest} needs more than the {block_table.shape[1]} "
                f"blocks of {key_cache.shape[1]} slots the block table holds"
            )


def paged_attention_ref(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    actual_seq_lengths: list[int],
    seq_lens: list[int],
    scale: float,
    out: Tensor,
    workspace: Optional[Tensor] = None,
    softmax_lse: Optional[Tensor] = None,
) -> None:
    # workspace / softmax_lse: the caller's buffers (see ops.paged_attention); the CPU
    # reference needs no scratch and does not produce the log-sum-exp.
    ends = list(actual_seq_lengths)
    lens = list(seq_lens)
    _check_attention_args(query, key_cache, block_table, ends, lens)
    end = ends[-1] if ends else 0
    if end < out.shape[0]:
        out[end:].zero_()
    starts = [0, *ends[:-1]]
    q_lens = [stop - start for start, stop in zip(starts, ends)]
    kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    kv = KVSource(key_cache.reshape(-1, kv_heads, head_dim), value_cache.reshape(-1, kv_heads, value_cache.shape[-1]),
                  block_table, int(key_cache.shape[1]))
    # The op's contract is FIA's sparse_mode 3 (rightDownCausal): query token i of a request
    # sees kv positions 0 .. seq_len - q_len + i (sim/attention.py).
    attend(query, starts, q_lens, lens, kv, CAUSAL, scale, out)


CAUSAL = Masking(sparse_mode=3)


# --------------------------------------------------------------------------- contracts and lazy init

LAZY_INIT_DURING_CAPTURE = (
    "lazy initialisation during capture of {graph}: the first launch of ascendgraph::{op} for {signature} "
    "allocates its workspace (an Ascend kernel sets up its tiling and workspace on the first call of a "
    "shape), which is refused inside a graph capture. Run the model eagerly at this size before capturing "
    "(a warm-up; the engine runs cudagraph_num_of_warmups of them per size, at least 1)"
)


@dataclass
class ContractPolicy:
    """What one device enforces: the rules it relaxes and the kernel shapes it has initialised."""

    lenient: frozenset[str] = frozenset()
    lazy_init: bool = True
    initialised: set[tuple[Any, ...]] = field(default_factory=set)

    @classmethod
    def from_options(cls, *, allow_float32_attention: bool = False, lazy_kernel_init: bool = True) -> "ContractPolicy":
        return cls(FLOAT32_LENIENT_RULES if allow_float32_attention else frozenset(), bool(lazy_kernel_init))


_STRICT = ContractPolicy(lazy_init=False)
_NEWEST: list[ContractPolicy] = [_STRICT]  # eager kernels outside every device's scope: the newest device's policy
_OVERRIDE: contextvars.ContextVar[Optional[ContractPolicy]] = contextvars.ContextVar("sim_contract_policy", default=None)
_REPLAYING: contextvars.ContextVar[bool] = contextvars.ContextVar("sim_replaying", default=False)


# Every live device's policy, so that an eager launch (a warm-up) initialises the kernel on
# each device alive in the process, not only on the newest one: two devices in one process
# (a plan measurement beside a run, tests) must not refuse each other's warmed-up captures.
_LIVE: "weakref.WeakValueDictionary[int, ContractPolicy]" = weakref.WeakValueDictionary()


def register(policy: ContractPolicy) -> None:
    """A new device's policy (SimDevice does it when created): eager launches mark it initialised
    on every live device, and it is the fallback outside every device's scope."""
    _LIVE[id(policy)] = policy
    _NEWEST[0] = policy


def current_policy() -> ContractPolicy:
    """The policy of the device whose scope the caller is in (`contract_policy`); outside every
    device's scope, the newest device's (module docstring)."""
    override = _OVERRIDE.get()
    return override if override is not None else _NEWEST[0]


@contextlib.contextmanager
def contract_policy(policy: ContractPolicy) -> Iterator[ContractPolicy]:
    """Use ``policy`` for the eager kernels of the block (tests of float32 kernel numerics)."""
    token = _OVERRIDE.set(policy)
    try:
        yield policy
    finally:
        _OVERRIDE.reset(token)


@contextlib.contextmanager
def unchecked() -> Iterator[ContractPolicy]:
    """No contract for the eager kernels of the block: tests of the reference formulas on
    shapes and dtypes no NPU kernel takes."""
    with contract_policy(ContractPolicy(frozenset(rule.name for rule in RULES), lazy_init=False)) as policy:
        yield policy


def replaying_now() -> bool:
    """Whether a graph replay is running (its kernels are the device's work under way)."""
    return _REPLAYING.get()


@contextlib.contextmanager
def replaying() -> Iterator[None]:
    """Kernels run by a graph replay: the contracts were checked at capture / update."""
    token = _REPLAYING.set(True)
    try:
        yield
    finally:
        _REPLAYING.reset(token)


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    first = next((a for a in args if isinstance(a, Tensor)), None)
    return () if first is None else (tuple(first.shape), first.dtype)


def _describe(signature: tuple[Any, ...]) -> str:
    if not signature:
        return "its arguments"
    shape, dtype = signature
    return f"shape {tuple(shape)} {str(dtype).replace('torch.', '')}"


_OP_NAMES: dict[Any, Optional[str]] = {}  # func -> its checked kernel's name (a pure function of the op)


def _op_name(func: Any) -> Optional[str]:
    try:
        return _OP_NAMES[func]
    except KeyError:
        pass
    except TypeError:  # unhashable
        return _checked_name(func)
    name = _OP_NAMES[func] = _checked_name(func)
    return name


def _checked_name(func: Any) -> Optional[str]:
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.name.startswith(f"{ops.NAMESPACE}::"):
        return None
    name = schema.name.split("::", 1)[1]
    return name if name in CHECKED_OPS else None


def _arguments(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    if not kwargs:
        return tuple(args)
    names = [a.name for a in func._schema.arguments]
    values = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
    return tuple(values)


def on_capture(policy: ContractPolicy, graph: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A capture records ``func``: check its contract and refuse a lazy initialisation."""
    name = _op_name(func)
    if name is None:
        return
    values = _arguments(func, args, kwargs)
    check_op(name, values, in_graph=True, lenient=policy.lenient)
    # Meta tensors (plan's measurement) run no kernel, eagerly or in a graph: nothing to initialise.
    on_meta = any(isinstance(v, Tensor) and v.is_meta for v in values)
    if policy.lazy_init and not on_meta:
        signature = (name, *_signature(values))
        if signature not in policy.initialised:
            raise CaptureConstraintError(
                LAZY_INIT_DURING_CAPTURE.format(graph=graph, op=name, signature=_describe(signature[1:]))
            )


def on_update(policy: ContractPolicy, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A task update re-issues ``func``: check its contract (the graph's workspace exists)."""
    name = _op_name(func)
    if name is not None:
        check_op(name, _arguments(func, args, kwargs), in_graph=True, lenient=policy.lenient)


def check_kernel_call(policy: ContractPolicy, kernel: str, arguments: Any) -> None:
    """The pre-check of one torch_npu-level call (the conformance section "kernel contracts")."""
    broken = [rule for rule in violations(kernel, arguments) if rule.name not in policy.lenient]
    if broken:
        raise KernelContractError(
            "\n".join(message(kernel, rule, arguments) for rule in broken),
            kernel=kernel,
            rules=tuple(rule.name for rule in broken),
        )


def _launch(name: str, args: tuple[Any, ...]) -> None:
    """An eager launch of checked kernel ``name``: check its contract, mark its shape initialised."""
    policy = current_policy()
    check_op(name, args, in_graph=False, lenient=policy.lenient)
    signature = (name, *_signature(args))
    # A test's override still initialises the devices' kernels.
    for marked in (policy, *list(_LIVE.values())):
        if marked.lazy_init:
            marked.initialised.add(signature)


def on_eager_launch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """What an eager launch of ``func`` does before its kernel computes (check the contract,
    mark the shape initialised), for a launch that computes nothing (`sim.warmup`). Returns
    whether ``func`` is a checked kernel."""
    name = _op_name(func)
    if name is None:
        return False
    _launch(name, _arguments(func, args, kwargs))
    return True


def _checked(name: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
    if name not in CHECKED_OPS:
        return kernel

    def run(*args: Any) -> Any:
        if not _REPLAYING.get():
            _launch(name, args)
        return kernel(*args)

    run.__name__ = f"checked_{name}"
    return run

def attention_workspace_ref(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    actual_seq_lengths: list[int],
    seq_lens: list[int],
    scale: float,
) -> Tensor:
    """A fresh buffer of the size the op's fake implementation declares (no kernel runs): the
    fused attention's need for the call (ascendgraph/workspace_sizes.py)."""
    size = paged_attention_op_workspace_bytes(query, key_cache, block_table)
    return torch.empty(size, dtype=torch.uint8, device=query.device)


# --------------------------------------------------------------------------- registration

_KERNELS: dict[str, Callable[..., Any]] = {
    "rms_norm": rms_norm_ref,
    "add_rms_norm": add_rms_norm_ref,
    "dynamic_quant": dynamic_quant_ref,
    "quantize": quantize_ref,
    "add_rms_norm_dynamic_quant": add_rms_norm_dynamic_quant_ref,
    "add_rms_norm_quant": add_rms_norm_quant_ref,
    "rotary_embedding": rotary_embedding_ref,
    "split_qkv_rmsnorm_rope": split_qkv_rmsnorm_rope_ref,
    "muls_add": muls_add_ref,
    "reshape_and_cache": reshape_and_cache_ref,
    "paged_attention": paged_attention_ref,
    "attention_workspace": attention_workspace_ref,
}


def register_cpu_kernels() -> None:
    """Register the reference kernels for the CPU dispatch key (idempotent)."""
    for name, kernel in _KERNELS.items():
        getattr(ops, name).register_kernel("cpu")(_checked(name, kernel))
        defer_kernel_dynamo_guard(getattr(ops, name))
