"""Lets the CPU build of torch import torchvision's Python code (the vLLM Ascend environment).

vLLM Ascend's worker patches import vLLM's Qwen3.5 model (patch/worker/patch_qwen3_5.py:24
at 182b75ea), which imports transformers' Qwen2-VL image processor, which imports
``torchvision.transforms.v2`` (transformers 5.19 models/qwen2_vl/image_processing_qwen2_vl.py:26).
PyPI's torchvision 0.28.0 for Linux is a CUDA build: its ``_C`` extension cannot load beside
CPU torch 2.13.0 (torchvision/extension.py:8-22 then reports no ops), and torchvision still
registers fake kernels for two of those ops unguarded at import
(torchvision/_meta_registrations.py:163, 177: ``register_fake("torchvision::nms")``,
``"torchvision::qnms"``), which fails when the op was never defined.

This module (put on the path by ``vllm_ascend_torchvision.pth``, scripts/vllm-ascend-env.sh)
defines those two operator *schemas* (as torchvision's C++ would) just before torchvision is
first imported, so the import completes; the ops have no kernel and are never called on the
paths the tests run (nothing calls torchvision.ops). Nothing is imported at start-up: a
meta-path finder waits for ``import torchvision``.
"""

from __future__ import annotations

import importlib.abc
import sys

_SCHEMAS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


def define_schemas() -> None:
    import torch

    for name, schema in _SCHEMAS.items():
        if not _defined(f"torchvision::{name}"):
            torch.library.define(f"torchvision::{name}", schema)


def _defined(qualified: str) -> bool:
    import torch

    namespace, name = qualified.split("::")
    try:
        getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return False
    return True


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            define_schemas()
        return None


def install() -> None:
    if not any(isinstance(finder, _BeforeTorchvision) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())
