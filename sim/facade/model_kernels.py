"""The torch_npu kernels a served model's own layers call on vLLM Ascend (``npu_facade`` ops).

`sim.facade.kernels` holds the graph paths' kernels (attention, KV writes, norms); this module
holds what vLLM Ascend's custom ops issue inside a model's forward on a runner:

* ``npu_swiglu`` — the MLP's SiLU-and-multiply (vllm_ascend/ops/activation.py@182b75ea:35-38,
  AscendSiluAndMul.forward_oot): ``x`` split into halves ``A, B`` along ``dim``, out
  ``silu(A) * B`` (torch-npu 2.13.0 ``_op_plugin_docs.py``:4393-4408);
* ``npu_mrope`` in rope mode — the attention's rotary embedding when Triton is absent
  (ops/rotary_embedding.py:155-193 rope_forward_oot: 1-D positions, ``mrope_section=[0, 0, 0]``,
  ``rotary_mode="half"`` for NeoX style): query and key ``[T, heads*head_size]`` rotated on the
  first ``rotary_dim`` (the cache's width) of each head, new tensors returned
  (``_op_plugin_docs.py``:3611-3645).

Schemas as registered (csrc/aten/npu_native_functions_by_codegen.yaml:740, 821). Every call is
checked against the contract table first (`sim.facade.contracts.check`: the rules
``swiglu_*`` and ``mrope_*`` in `ascendgraph.kernel_contracts`).

What is approximated (docs/facade.md): the arithmetic. ``npu_swiglu`` computes in float32 and
rounds once to the input dtype; ``npu_mrope`` rotates in float32 (`ascendgraph.reference.rope`)
and rounds once. A card's vector units may round differently; graph and eager runs on the
simulator use the same formulas, so they agree with each other bitwise. mrope mode (2-D
positions, a non-zero ``mrope_section``: multimodal models) is not modelled.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ascendgraph import reference
from sim.facade.kernels import NAMESPACE, kernel_entry

__all__ = ["SCHEMAS", "register", "exported_ops"]

SWIGLU = "npu_swiglu"
MROPE = "npu_mrope"

SCHEMAS: dict[str, str] = {
    SWIGLU: "(Tensor self, int dim=-1) -> Tensor",
    MROPE: (
        "(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, int head_size, *, "
        "int[]? mrope_section=None, str? rotary_mode='half', str? cache_mode='default') -> (Tensor, Tensor)"
    ),
}

# rotary_mode: the op doc names 'half' and 'interleave' (_op_plugin_docs.py:3622); vLLM Ascend
# passes "interleaved" for GPT-J style (rotary_embedding.py:181). Both spellings are taken.
_ROTARY_MODES = {"half": True, "interleave": False, "interleaved": False}


def swiglu(a: dict[str, Any], fake: bool) -> Tensor:
    x, dim = a["self"], int(a["dim"])
    first, second = x.chunk(2, dim=dim)
    if fake:
        return torch.empty_like(first)
    wide = first.float()
    return (torch.nn.functional.silu(wide) * second.float()).to(x.dtype)


def mrope(a: dict[str, Any], fake: bool) -> tuple[Tensor, Tensor]:
    section = [int(v) for v in a["mrope_section"] or [0, 0, 0]]
    mode = a["rotary_mode"] or "half"
    if a["positions"].dim() != 1 or any(section) or mode not in _ROTARY_MODES or (a["cache_mode"] or "default") != "default":
        raise NotImplementedError(
            f"sim.facade models {MROPE} in rope mode only (1-D positions, mrope_section [0, 0, 0], rotary_mode "
            f"'half'/'interleave', cache_mode 'default'), got positions {tuple(a['positions'].shape)}, "
            f"mrope_section {section}, rotary_mode {mode!r}, cache_mode {a['cache_mode']!r}")
    query, key = a["query"], a["key"]
    if fake:
        return torch.empty_like(query), torch.empty_like(key)
    q, k = reference.rotary_embedding(a["positions"], query, key, a["cos_sin_cache"], int(a["head_size"]),
                                      _ROTARY_MODES[mode])
    return q.contiguous(), k.contiguous()


IMPLEMENTATIONS: dict[str, Callable[[dict[str, Any], bool], Any]] = {SWIGLU: swiglu, MROPE: mrope}

_LIBRARY: Optional[torch.library.Library] = None


def _make(name: str, fake: bool) -> Callable[..., Any]:
    return kernel_entry(name, IMPLEMENTATIONS[name], name, fake)


def register() -> None:
    """Define the ops in the ``npu_facade`` namespace once per process."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    from sim.facade import kernels

    kernels.register()  # the namespace's own library first
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    for name, schema in SCHEMAS.items():
        library.define(f"{name}{schema}")
        library.impl(name, _make(name, fake=False), "CPU")
        torch.library.register_fake(f"{NAMESPACE}::{name}", _make(name, fake=True), lib=library)
    _LIBRARY = library


def exported_ops() -> dict[str, Any]:
    """``torch_npu.<name>`` for each kernel here (OpOverloadPackets, as torch_npu exports)."""
    register()
    return {name: getattr(getattr(torch.ops, NAMESPACE), name) for name in SCHEMAS}
