"""The flags commands share and their converters: vLLM's configuration flags
(`add_config_arguments` -> `config_from_args`), bounded counts (`LIMITS`, `bounded_int`) and
the environment of a pasted `vllm serve` line (`env_from_args`).

Configuration flags use vLLM's spelling so a ``vllm serve`` line translates one to one. Count
flags have upper bounds (`LIMITS`) so a mistyped number is refused instead of hanging a run.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
from typing import Any, Callable, Optional

from ascendgraph.cli.vllm_flags import VLLM_SPECULATIVE_CONFIG_KEYS
from ascendgraph.config import SOCS, GraphConfig, parse_json_argument
from ascendgraph.errors import ConfigError
from ascendgraph.models.backends import ATTENTION_BACKENDS
from ascendgraph.models.presets import PRESETS
from ascendgraph.readers import read_human_int, read_int

__all__ = ["LIMITS", "MAX_SEED", "MAX_SIMULATED_REQUESTS", "MODELLED_SPECULATIVE_KEYS", "positive_int", "non_negative_int", "bounded_int",
           "seed_int", "limit_error", "non_empty_text", "json_object_text", "add_config_arguments",
           "config_from_args", "hccl_mode_from_args", "env_from_args"]

log = logging.getLogger("ascendgraph")


# Upper bounds of the count flags, by argparse destination: generous for real deployments,
# small enough that a mistyped number is refused (exit 2) instead of hanging a run. Checked by
# the flags' own converters (`bounded_int`) and, for flags other modules define with plain
# converters (plan --seed, doctor --num-layers, ...), after parsing (`check_limits`).
MAX_SEED = 2**63 - 1  # torch generators and random.Random take any int below this
# The most requests a run serves (the engine's runtime.options.MAX_SIMULATED_REQUESTS, kept equal by
# a test; a larger workload is `ascendgraph plan --workload`'s). LIMITS["requests"] is the type bound.
MAX_SIMULATED_REQUESTS = 1_000
LIMITS: dict[str, tuple[int, int]] = {
    "seed": (0, MAX_SEED),
    "requests": (1, 1_000_000),
    "num_layers": (1, 1024),
    "tensor_parallel_size": (1, 65536),
    "data_parallel_size": (1, 65536),
    "pipeline_parallel_size": (1, 65536),
    "prefill_context_parallel_size": (1, 65536),
    "decode_context_parallel_size": (1, 65536),
    "block_size": (1, 65536),
    "max_loras": (0, 65536),
    "stream_limit": (1, 1_000_000),
}
# Keys of --speculative-config ascendgraph uses (the draft only adds tokens and layers).
MODELLED_SPECULATIVE_KEYS = ("num_speculative_tokens", "draft_num_hidden_layers", "num_hidden_layers")


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _int_at_least(text: str, low: int, expected: str, *, forms: str = "",
                  read: Callable[..., int] = read_int) -> int:
    """An argparse integer >= ``low``: ASCII digits only ("²" and "١٢" are not numbers here);
    ``forms`` names the other spellings ``read`` takes, in the message for unreadable text."""
    try:
        value = read(text, "")
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected {expected}{forms}, got {_shown(text)}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def positive_count(text: str) -> int:
    """argparse type: an integer >= 1, also with vLLM's suffixes (8k = 8000, 8K = 8192)."""
    return _int_at_least(text, 1, "a positive integer", forms=" (or vLLM's 8k / 8K forms)", read=read_human_int)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def limit_error(dest: str, value: int) -> Optional[str]:
    low, high = LIMITS[dest]
    if low <= value <= high:
        return None
    if dest == "seed":
        return f"expected a seed 0 <= N < 2**63, got {value}"
    if value > high:
        return f"expected at most {high}, got {value}"
    return "expected a positive integer, got %d" % value if low == 1 else f"expected an integer >= {low}, got {value}"


def bounded_int(dest: str) -> Callable[[str], int]:
    """argparse type: an integer within ``LIMITS[dest]``."""
    low, high = LIMITS[dest]
    lenient = positive_int if low >= 1 else non_negative_int

    def convert(text: str) -> int:
        value = lenient(text)
        problem = limit_error(dest, value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    convert.__name__ = f"{dest} ({low}..{high})"
    return convert


seed_int = bounded_int("seed")


def non_empty_text(what: str) -> Callable[[str], str]:
    """argparse type: a non-empty string (an empty path would mean the current directory)."""

    def convert(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"empty; pass {what}")
        return text

    return convert


def json_object_text(text: str) -> str:
    """argparse type of the JSON flags: refuses an empty value (checked as JSON later)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty; pass a JSON object such as '{}'")
    return text


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The vLLM-style flags every command that resolves a configuration accepts."""
    model = parser.add_argument_group("model")
    model.add_argument("--model", default="tiny", metavar="PRESET|CONFIG.JSON",
                       help=f"a preset ({', '.join(PRESETS)}) or a Hugging Face config.json (file or folder); default tiny")
    model.add_argument("--num-layers", type=bounded_int("num_layers"), default=None, metavar="N",
                       help="override the model's num_hidden_layers (e.g. run qwen3-0.6b with 2 layers; "
                            f"at most {LIMITS['num_layers'][1]})")
    model.add_argument("--attention-backend", choices=sorted(ATTENTION_BACKENDS), default=None,
                       help="attention backend (default: the model's own: mla for MLA models, else ascend)")
    vllm = parser.add_argument_group(
        "vLLM configuration (every `vllm serve` spelling: --flag V, --flag=V, --flag_name, -cc.key=V, "
        "--no-switch)")
    vllm.add_argument("--compilation-config", "-cc", type=json_object_text, default=None, metavar="JSON",
                      help='CompilationConfig as JSON, e.g. \'{"cudagraph_mode": "FULL_DECODE_ONLY"}\'')
    vllm.add_argument("--additional-config", type=json_object_text, default=None, metavar="JSON",
                      help='vLLM Ascend additional_config as JSON, e.g. \'{"ascend_compilation_config": {"enable_static_kernel": true}}\'')
    vllm.add_argument("-O", "--optimization-level", dest="optimization_level", default=None, metavar="LEVEL",
                      help="optimisation level 0-3 as in vLLM (-O0 eager ... -O3; also -O 3, -O=3); default 2")
    vllm.add_argument("--max-num-seqs", type=positive_int, default=None, metavar="N", help="default 256")
    vllm.add_argument("--max-num-batched-tokens", type=positive_count, default=None, metavar="N",
                      help="default 8192; vLLM's suffixes work: 8k = 8000, 8K = 8192")
    vllm.add_argument("--num-speculative-tokens", type=non_negative_int, default=None, metavar="K",
                      help="speculative decoding: K draft tokens per step (q = 1 + K tokens per decoding request)")
    vllm.add_argument("--speculative-config", "-sc", type=json_object_text, default=None, metavar="JSON",
                      help='vLLM SpeculativeConfig as JSON, e.g. \'{"method": "mtp", "num_speculative_tokens": 1}\'; '
                           "only num_speculative_tokens (and draft_num_hidden_layers) matter to graph mode")
    parallel = LIMITS["tensor_parallel_size"][1]
    vllm.add_argument("--tensor-parallel-size", "-tp", type=bounded_int("tensor_parallel_size"), default=None,
                      metavar="N", help=f"tensor parallel ranks (default 1, at most {parallel}): more "
                                        "communication streams per graph")
    vllm.add_argument("--data-parallel-size", "-dp", type=bounded_int("data_parallel_size"), default=None,
                      metavar="N", help=f"data parallel ranks (default 1, at most {parallel})")
    vllm.add_argument("--pipeline-parallel-size", "-pp", type=bounded_int("pipeline_parallel_size"), default=None,
                      metavar="N", help=f"pipeline parallel stages (default 1, at most {parallel})")
    vllm.add_argument("--prefill-context-parallel-size", "-pcp", type=bounded_int("prefill_context_parallel_size"),
                      default=None, metavar="N", help=f"prefill context parallel ranks (default 1, at most {parallel})")
    vllm.add_argument("--decode-context-parallel-size", "-dcp", type=bounded_int("decode_context_parallel_size"),
                      default=None, metavar="N", help=f"decode context parallel ranks (default 1, at most {parallel})")
    vllm.add_argument("--enable-expert-parallel", "-ep", action=argparse.BooleanOptionalAction, default=None,
                      help="expert parallelism for MoE models (vLLM's -ep; adds communication streams)")
    vllm.add_argument("--enable-sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                      help="sequence parallelism (Ascend then keeps only capture sizes divisible by tp)")
    vllm.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                      help="no compilation, no graphs")
    vllm.add_argument("--block-size", type=bounded_int("block_size"), default=None, metavar="N",
                      help=f"KV cache block size (default 128, at most {LIMITS['block_size'][1]})")
    vllm.add_argument("--max-loras", type=bounded_int("max_loras"), default=None, metavar="N",
                      help="LoRA adapters per batch (default 0: LoRA off; --enable-lora in a pasted line means 1); "
                           "more than 0 adds LoRA dispatcher keys")
    vllm.add_argument("--performance-mode", choices=("balanced", "interactivity", "throughput"), default=None)
    stack = parser.add_argument_group("Ascend stack")
    stack.add_argument("--soc", choices=SOCS, default=None, type=str.upper, help="SoC generation (default A2)")
    stack.add_argument("--stream-limit", type=bounded_int("stream_limit"), default=None, metavar="N",
                       help="streams available to graph capture (the planner's MAX; default 1800, at most "
                            f"{LIMITS['stream_limit'][1]})")
    stack.add_argument("--hccl-op-expansion-mode", default=None, metavar="MODE",
                       help="HCCL_OP_EXPANSION_MODE (AIV, or FFTS+/AICPU); default: read from the environment")


_ENGINE_FLAGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "num_speculative_tokens",
    "tensor_parallel_size",
    "data_parallel_size",
    "pipeline_parallel_size",
    "prefill_context_parallel_size",
    "decode_context_parallel_size",
    "enable_expert_parallel",
    "enable_sequence_parallel",
    "enforce_eager",
    "block_size",
    "max_loras",
    "performance_mode",
    "soc",
    "attention_backend",
    "optimization_level",
)


def _checked_speculative_config(args: argparse.Namespace, *, warn: bool) -> Any:
    """--speculative-config checked against vLLM's SpeculativeConfig keys and --num-speculative-tokens.

    Real vLLM keys ascendgraph does not model are warned about once; unknown keys and a
    --num-speculative-tokens that disagrees with the JSON's are errors.
    """
    raw = getattr(args, "speculative_config", None)
    if raw is None:
        return None
    if isinstance(raw, str) and not raw.strip():
        raise ConfigError("--speculative-config is empty; pass a JSON object such as '{}'", key="speculative_config")
    spec = parse_json_argument("--speculative-config", raw)
    valid = sorted(set(VLLM_SPECULATIVE_CONFIG_KEYS) | set(MODELLED_SPECULATIVE_KEYS))
    for key in spec:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
            hint = (f"did you mean {close[0]!r}?" if close else
                    f"ascendgraph uses {', '.join(MODELLED_SPECULATIVE_KEYS)}; the other vLLM SpeculativeConfig "
                    "fields (method, model, ...) are accepted and ignored")
            raise ConfigError(f"unknown --speculative-config key {key!r} (not a vLLM SpeculativeConfig field); {hint}",
                              key="speculative_config")
    ignored = [key for key in spec if key not in MODELLED_SPECULATIVE_KEYS]
    if ignored and warn:
        log.warning("--speculative-config keys ignored (real vLLM settings ascendgraph does not model): %s",
                    ", ".join(ignored))
    flag_value = getattr(args, "num_speculative_tokens", None)
    json_value = spec.get("num_speculative_tokens")
    if flag_value is not None and json_value is not None and flag_value != json_value:
        raise ConfigError(
            f"--num-speculative-tokens {flag_value} conflicts with --speculative-config num_speculative_tokens "
            f"{json_value!r}; give the number once", key="num_speculative_tokens",
        )
    return raw


def _checked_json_flag(args: argparse.Namespace, name: str) -> Any:
    value = getattr(args, name, None)
    if isinstance(value, str) and not value.strip():
        flag = "--" + name.replace("_", "-")
        raise ConfigError(f"{flag} is empty; pass a JSON object such as '{{}}'", key=name)
    return value


def config_from_args(args: argparse.Namespace, *, warn: bool = True) -> GraphConfig:
    """A GraphConfig from parsed config flags; bad values raise ConfigError. ``warn``: log
    the ignored --speculative-config keys (once per command)."""
    engine_args: dict[str, Any] = {}
    for name in _ENGINE_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            engine_args[name] = value
    speculative = _checked_speculative_config(args, warn=warn)
    if speculative:
        engine_args["speculative_config"] = speculative
    return GraphConfig.from_vllm_args(
        compilation_config=_checked_json_flag(args, "compilation_config"),
        additional_config=_checked_json_flag(args, "additional_config"),
        model=args.model,
        num_layers=args.num_layers,
        **engine_args,
    )


def hccl_mode_from_args(args: argparse.Namespace) -> Optional[str]:
    return getattr(args, "hccl_op_expansion_mode", None)


def env_from_args(args: argparse.Namespace) -> Optional[dict[str, str]]:
    """The environment a command resolves and runs with: the process environment plus the
    assignments prefixed to a pasted line (``ASCEND_LAUNCH_BLOCKING=1 vllm serve ...``), as
    a real launch would see it; None (the process environment) when there are none. The
    process environment itself is never changed."""
    pasted = getattr(args, "pasted_env", None)
    if not pasted:
        return None
    return {**os.environ, **pasted}
