"""Record vLLM 0.32's answers for generated cases into tests/data/vllm_answers.json.

Run in the parity environment (scripts/parity-env.sh builds it; vLLM is not needed anywhere
else):

    "$(scripts/parity-env.sh | tail -n 1)" scripts/record_vllm_answers.py

The cases are generated from a fixed seed (no hypothesis, so the same file comes out every
time): the GraphMode helpers, the capture-size rule, spec-decode rounding, attention
narrowing with the warnings vLLM logs, and the cudagraph dispatcher (keys, capture order and
dispatch answers). vLLM is driven exactly as the parity suite drives it
(tests/parity/parity_harness.py). The default suite (tests/unit/test_recorded_vllm_answers.py)
checks ascendgraph against the file without vLLM; the parity suite
(tests/parity/test_parity_recorded.py) regenerates it and fails when the committed file is
stale. ``--check`` does the same from the command line (exit 1 when stale).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "tests" / "data" / "vllm_answers.json"
SEED = 18
COUNTS = {"sizes": 1200, "spec_rounding": 500, "narrowing_random": 600, "dispatcher": 200}
QUERIES_PER_DISPATCHER = 8

MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
SUPPORTS = ["NEVER", "UNIFORM_SINGLE_TOKEN_DECODE", "UNIFORM_BATCH", "ALWAYS"]
COMPILATION_MODES = ["NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE"]
BACKENDS = ["FLASH_ATTN", "mla", "AscendAttentionBackend", "TRITON_MLA"]
RUNTIME = ["NONE", "PIECEWISE", "FULL"]
BOUNDARIES = [1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 127, 128, 129, 255, 256, 257, 271, 272, 511, 512, 513]
# (our GraphMode method, vLLM's CUDAGraphMode method)
MODE_HELPERS = [("decode_mode", "decode_mode"), ("mixed_mode", "mixed_mode"), ("max_mode", "max_cudagraph_mode"),
                ("without_piecewise", "without_piecewise")]
MODE_PREDICATES = [("separate_routine", "separate_routine"), ("has_full_graphs", "has_full_cudagraphs"),
                   ("has_piecewise_graphs", "has_piecewise_cudagraphs"),
                   ("requires_piecewise_compilation", "requires_piecewise_compilation")]


# --------------------------------------------------------------------------- generated inputs


def _size_cases(rng: random.Random) -> list[dict[str, Any]]:
    cases = []
    for _ in range(COUNTS["sizes"]):
        mns = rng.choice([rng.choice(BOUNDARIES), rng.randint(1, 64), rng.randint(1, 1100)])
        mnbt = rng.choice([rng.choice(BOUNDARIES + [1024, 2048, 8192]), rng.randint(1, 600), rng.randint(1, 20_000)])
        k = rng.choice([0, 0, rng.randint(0, 4), rng.randint(0, 16)])
        sizes: Optional[list[int]] = None
        if rng.random() < 0.4:
            sizes = [rng.choice([rng.choice([1, 2, 4, 8, 16, 24, 32, 64, 128, 256, 512]), rng.randint(1, 1200)])
                     for _ in range(rng.randint(1, 40))]
        max_size = None
        if rng.random() < 0.35:
            max_size = max(sizes) if sizes and rng.random() < 0.5 else rng.choice([rng.choice(BOUNDARIES),
                                                                                  rng.randint(1, 1100)])
        cases.append({"max_num_seqs": mns, "max_num_batched_tokens": mnbt, "num_speculative_tokens": k,
                      "capture_sizes": sizes, "max_capture_size": max_size,
                      "performance_mode": rng.choice(["balanced", "interactivity", "throughput"])})
    return cases


def _spec_cases(rng: random.Random) -> list[dict[str, Any]]:
    cases = []
    for _ in range(COUNTS["spec_rounding"]):
        sizes = sorted({rng.randint(1, rng.choice([16, 64, 600])) for _ in range(rng.randint(1, 20))})
        max_size = sizes[-1] if rng.random() < 0.6 else rng.randint(1, sizes[-1] + 20)
        cases.append({"sizes": sizes, "max_size": max_size, "query_len": rng.choice([1, 2, 3, 4, rng.randint(1, 20)])})
    return cases


def _narrowing_cases(rng: random.Random) -> list[dict[str, Any]]:
    cases = []
    for mode in MODES:
        for support in SUPPORTS:
            for split in (True, False):
                for q in (1, 2):
                    for pca in (True, False):
                        cases.append({"mode": mode, "support": support, "capture_sizes": [1, 2, 4, 8],
                                      "max_capture_size": 8, "uniform_decode_query_len": q,
                                      "compilation_mode": "VLLM_COMPILE", "attention_split": split,
                                      "inductor_partition": False, "use_v2_model_runner": False,
                                      "piecewise_capture_available": pca, "backend_name": "AscendAttentionBackend"})
    for _ in range(COUNTS["narrowing_random"]):
        sizes = sorted({rng.randint(1, rng.choice([8, 64, 600])) for _ in range(rng.randint(1, 30))})
        cases.append({"mode": rng.choice(MODES), "support": rng.choice(SUPPORTS), "capture_sizes": sizes,
                      "max_capture_size": sizes[-1],
                      "uniform_decode_query_len": rng.choice([1, 1, rng.randint(1, 4), rng.randint(1, 20)]),
                      "compilation_mode": rng.choice(COMPILATION_MODES), "attention_split": rng.random() < 0.5,
                      "inductor_partition": rng.random() < 0.5, "use_v2_model_runner": rng.random() < 0.5,
                      "piecewise_capture_available": rng.random() < 0.5, "backend_name": rng.choice(BACKENDS)})
    return cases


def _mode_set(rng: random.Random, *, invalid: bool) -> Optional[list[str]]:
    roll = rng.random()
    if roll < 0.6:
        return None
    if invalid and roll < 0.8:
        return ["FULL"]  # cascade attention's invalid_modes
    return sorted({rng.choice(RUNTIME) for _ in range(rng.randint(0 if not invalid else 1, 3))})


def _dispatcher_cases(rng: random.Random) -> list[dict[str, Any]]:
    cases = []
    for _ in range(COUNTS["dispatcher"]):
        mode = rng.choice(MODES)
        q = rng.choice([1, 1, rng.randint(1, 4), rng.randint(1, 9)])
        raw = [rng.randint(1, rng.choice([48, 520])) for _ in range(rng.randint(1, 20))]
        if mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
            raw = [-(-s // q) * q for s in raw]  # as spec-decode rounding leaves them
        sizes = sorted(set(raw))
        max_loras = rng.choice([0, 0, rng.randint(0, 6)])
        case = {"mode": mode, "capture_sizes": sizes, "max_num_seqs": rng.choice([rng.randint(1, 16), rng.randint(1, 300)]),
                "uniform_decode_query_len": q, "max_loras": max_loras,
                "specialize_active_lora": (rng.random() < 0.5) if max_loras else False,
                "specialize_lora": rng.random() < 0.5, "queries": []}
        top = sizes[-1] + 8
        for _ in range(QUERIES_PER_DISPATCHER):
            uniform = rng.random() < 0.5
            num_tokens = q * rng.randint(1, max(1, top // q)) if uniform else rng.randint(0, top)
            loras = rng.randint(0, max_loras)
            case["queries"].append({"num_tokens": num_tokens, "uniform_decode": uniform, "has_lora": loras > 0,
                                    "num_active_loras": loras, "valid_modes": _mode_set(rng, invalid=False),
                                    "invalid_modes": _mode_set(rng, invalid=True)})
        cases.append(case)
    return cases


def generate() -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(SEED)
    return {"modes": [{"mode": m} for m in MODES], "sizes": _size_cases(rng), "spec_rounding": _spec_cases(rng),
            "narrowing": _narrowing_cases(rng), "dispatcher": _dispatcher_cases(rng)}


# --------------------------------------------------------------------------- vLLM's answers


def _answer(outcome: Any) -> dict[str, Any]:
    if outcome.error is None:
        return {"kind": "ok", "value": outcome.value, "messages": list(outcome.messages)}
    # only the kind: an error's text may hold a set's repr, whose order changes between processes
    return {"kind": outcome.kind}


def record() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests" / "parity"))
    import parity_harness as h  # noqa: PLC0415 - needs vLLM, only in the parity environment
    from vllm.config.compilation import CUDAGraphMode  # noqa: PLC0415

    cases = generate()
    answers: dict[str, list[dict[str, Any]]] = {}
    modes = []
    for case in cases["modes"]:
        mode = CUDAGraphMode[case["mode"]]
        value = {ours: getattr(mode, theirs)().name for ours, theirs in MODE_HELPERS}
        value.update({ours: bool(getattr(mode, theirs)()) for ours, theirs in MODE_PREDICATES})
        value["bool"] = bool(mode)
        value["is_runtime_mode"] = bool(mode.is_valid_runtime_mode())
        modes.append({"inputs": case, "kind": "ok", "value": value, "messages": []})
    answers["modes"] = modes
    answers["sizes"] = [{"inputs": c, **_answer(h.vllm_capture_sizes(**c))} for c in cases["sizes"]]
    answers["spec_rounding"] = [
        {"inputs": c, **_answer(h.vllm_round_for_spec_decode(c["sizes"], c["max_size"], c["query_len"]))}
        for c in cases["spec_rounding"]
    ]
    narrowing = []
    for c in cases["narrowing"]:
        case = h.NarrowingCase(**{**c, "capture_sizes": tuple(c["capture_sizes"])})
        narrowing.append({"inputs": c, **_answer(h.vllm_narrow(case))})
    answers["narrowing"] = narrowing
    dispatcher = []
    for c in cases["dispatcher"]:
        case = h.DispatcherCase(**{k: (tuple(v) if k == "capture_sizes" else v) for k, v in c.items() if k != "queries"})
        built = h.run_vllm(lambda: h.VllmDispatcher(case))
        entry: dict[str, Any] = {"inputs": c, "kind": "ok" if built.error is None else built.kind}
        if built.error is None:
            theirs = built.value
            entry["keys"] = {mode: sorted(list(d) for d in descs) for mode, descs in sorted(theirs.keys().items())}
            entry["capture_order"] = [[mode, list(d)] for mode, d in theirs.capture_order()]
            entry["answers"] = []
            for q in c["queries"]:
                query = h.DispatchQuery(**{k: (frozenset(v) if k.endswith("modes") and v is not None else v)
                                           for k, v in q.items()})
                entry["answers"].append(_answer(theirs.dispatch(query)))
        dispatcher.append(entry)
    answers["dispatcher"] = dispatcher
    import vllm  # noqa: PLC0415

    document = {"vllm": vllm.__version__, "seed": SEED, "generator": "scripts/record_vllm_answers.py",
                "answers": answers}
    return json.loads(json.dumps(document))  # tuples -> lists, as the file holds them


def serialise(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=None, separators=(",", ":"), sort_keys=True) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    parser.add_argument("--output", default=str(OUTPUT))
    args = parser.parse_args(argv)
    text = serialise(record())
    path = Path(args.output)
    if args.check:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            print(f"{path} is stale: regenerate it with scripts/record_vllm_answers.py", file=sys.stderr)
            return 1
        print(f"{path} is up to date", file=sys.stderr)
        return 0
    path.write_text(text, encoding="utf-8")
    counts = {k: len(v) for k, v in json.loads(text)["answers"].items()}
    print(f"wrote {path}: {counts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
