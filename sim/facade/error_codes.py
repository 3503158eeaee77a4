"""torch_npu's error-code suffix, for the errors the facade raises in torch_npu's own words.

torch-npu 2.13.0 gives its Python errors a second part naming a submodule and an error code
(``torch_npu/utils/_error_code.py``: ``pta_error(ErrCode.PARAM)`` and its siblings), either as
the exception's second argument (``RuntimeError(text, pta_error(...))``, ``npu/graphs.py``)
or appended to the text (``AssertionError("Invalid device id" + pta_error(...))``,
``npu/__init__.py``). The part is a line ``[ERROR] <time> (PID:<pid>, Device:<device>,
RankID:<rank>) ERR<submodule:2><code:3> <SUBMODULE> <meaning>``, empty when
``TORCH_NPU_COMPACT_ERROR_OUTPUT`` is set to a non-zero number or in an interactive
interpreter. `pta_error` builds the same part, so code matching torch_npu's messages (or its
``ERR\\d{5}`` pattern) sees the same thing on the facade.
"""

from __future__ import annotations

import enum
import os
import sys
import time

__all__ = ["ErrCode", "pta_error"]

PTA_SUBMODULE = (0, "PTA")  # _SubModuleID.PTA in the wheel


class ErrCode(enum.Enum):
    """The codes the facade raises (the wheel's numbers and meanings)."""

    PARAM = (1, "invalid parameter")
    TYPE = (2, "invalid type")
    VALUE = (3, "invalid value")
    NOT_SUPPORT = (7, "feature not supported")


def _compact() -> bool:
    try:
        return int(os.getenv("TORCH_NPU_COMPACT_ERROR_OUTPUT", "0")) != 0
    except ValueError:
        return False


def _interactive() -> bool:
    """An interactive interpreter, IPython or a notebook (torch_npu/utils/utils.py:46-68)."""
    import builtins

    return (hasattr(sys, "ps1") or hasattr(builtins, "__IPYTHON__") or bool(sys.flags.interactive)
            or "ipykernel" in sys.modules)


def _device_index() -> int:
    try:
        from sim.facade.runtime import runtime

        return runtime().current_index
    except Exception:  # pragma: no cover - the suffix must never fail the error it decorates
        return -1


def _rank() -> int:
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else -1
    except Exception:  # pragma: no cover
        return -1


def pta_error(code: ErrCode) -> str:
    """torch_npu's suffix for an error of the PTA submodule (see the module docstring)."""
    if _compact() or _interactive():
        return ""
    submodule, name = PTA_SUBMODULE
    number, meaning = code.value
    stamp = time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime())
    return (f"\n[ERROR] {stamp} (PID:{os.getpid()}, Device:{_device_index()}, RankID:{_rank()}) "
            f"ERR{submodule:02d}{number:03d} {name} {meaning}")
