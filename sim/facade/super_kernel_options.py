"""``NPUGraph.super_kernel_optimize``'s option checks (torch-npu 2.13.0
``torch_npu/npu/graphs.py:740-842``, ``_validate_options``): a table of the known keys with
the type each value must have, and the check that raises in torch_npu's words."""

from __future__ import annotations

from typing import Any, Optional

from sim.facade.error_codes import ErrCode, pta_error

__all__ = ["SUPER_KERNEL_OPTIONS", "SUPER_KERNEL_OPTIMIZE_KEYS", "SUPER_KERNEL_DEBUG_KEYS", "check_super_kernel_options"]

# torch_npu 2.13 NPUGraph.super_kernel_optimize's options (torch_npu/npu/graphs.py:740-842): each key
# with the type its value must have, the type of a list's elements, the keys of a nested dict.
OptionSpec = tuple[type, Optional[type], Optional[dict[str, type]]]  # value type, list element type, nested keys
SUPER_KERNEL_OPTIONS: dict[str, dict[str, OptionSpec]] = {
    "optimize_options": {
        "preload_code": (int, None, None), "split_mode": (int, None, None), "stream_fusion": (int, None, None),
        "constant_codegen": (int, None, None), "auto_op_parallel": (int, None, None), "opt_extend": (str, None, None),
        "dcci_before_kernel_start": (list, str, None), "dcci_after_kernel_end": (list, str, None),
        "dcci_disable_on_kernel": (list, str, None), "ubuf_lock_ignore_kernel": (list, str, None),
        "aggressive_opt_strategies": (dict, None, {"event_breaker_bypass": int, "value_breaker_bypass": int,
                                                   "task_breaker_bypass": int}),
        "early_start": (int, None, None),
    },
    "debug_options": {
        "debug_sync_all": (int, None, None), "debug_op_exec_trace": (int, None, None),
        "debug_cross_core_sync_check": (int, None, None), "debug_extend": (str, None, None),
        "debug_per_op_max_core_num": (int, None, None),
    },
}
SUPER_KERNEL_OPTIMIZE_KEYS = frozenset(SUPER_KERNEL_OPTIONS["optimize_options"])
SUPER_KERNEL_DEBUG_KEYS = frozenset(SUPER_KERNEL_OPTIONS["debug_options"])


def check_super_kernel_options(value: Any, option_name: str) -> None:
    """NPUGraph.super_kernel_optimize's validation (torch_npu/npu/graphs.py:740-842): a dict of
    known keys whose values, list elements and nested keys have the types of
    `SUPER_KERNEL_OPTIONS`, in torch_npu's words."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise RuntimeError(f"{option_name} param must be dict or None.", pta_error(ErrCode.PARAM))
    specs = SUPER_KERNEL_OPTIONS[option_name]
    for key, option in value.items():
        if key not in specs:
            raise RuntimeError(f"Invalid {option_name} param key: '{key}'.", pta_error(ErrCode.PARAM))
        expected, element, sub_options = specs[key]
        if not isinstance(option, expected):
            raise RuntimeError(f"{option_name} param['{key}'] must be {expected.__name__}, "
                               f"got {type(option).__name__}", pta_error(ErrCode.PARAM))
        if sub_options is not None and isinstance(option, dict):
            for sub_key, sub_value in option.items():
                if sub_key not in sub_options:
                    raise RuntimeError(f"Invalid sub_key '{sub_key}' in {option_name}['{key}'].", pta_error(ErrCode.PARAM))
                if not isinstance(sub_value, sub_options[sub_key]):
                    raise RuntimeError(f"{option_name}['{key}']['{sub_key}'] must be {sub_options[sub_key].__name__}, "
                                       f"got {type(sub_value).__name__}", pta_error(ErrCode.PARAM))
        if element is not None and isinstance(option, (list, tuple)):
            for index, item in enumerate(option):
                if not isinstance(item, element):
                    raise RuntimeError(f"{option_name}['{key}'][{index}] must be {element.__name__}, "
                                       f"got {type(item).__name__}", pta_error(ErrCode.PARAM))
