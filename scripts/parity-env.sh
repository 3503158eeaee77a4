#!/usr/bin/env bash
# Build (or reuse) the virtual environment for the vLLM parity suite (tests/parity, -m vllm).
#
# Why a separate environment: `pip install vllm==0.32.0` pulls CUDA builds of
# torchvision / torchaudio / torchcodec that fail to import beside CPU torch. The parity
# tests only need vLLM's config and cudagraph dispatcher, so we install a minimal set of
# vLLM's dependencies, then vLLM itself without dependencies. `pip check` complaining
# about vLLM's other dependencies is expected.
#
# The environment lives in ${ASCENDGRAPH_CACHE_DIR:-~/.cache/ascendgraph}/parity-env-<hash>,
# where <hash> is the sha256 of the recipe below: nothing changed -> nothing rebuilt.
# It is built in a temporary directory and renamed into place, so a failed build leaves
# nothing half-built behind. This project is then installed into it (editable, with its
# `test` extra); that step is skipped when the same checkout with the same pyproject.toml
# is already installed.
#
# Usage: scripts/parity-env.sh [--inputs-only]    -> last line of stdout: the environment's python.
# Logs go to stderr.  PYTHON=/path/to/python3.11 selects the interpreter (default python3).
# --inputs-only: check the inputs, print the environment folder that would be used and stop
# before anything is installed. Bad input (ASCENDGRAPH_CACHE_DIR with a control character, or
# not a folder; scripts/env-inputs.sh) is one line on stderr and exit 2.
set -euo pipefail

log_prefix=parity-env
script_dir="$(dirname -- "$(realpath -e -- "${BASH_SOURCE[0]}")")"
# shellcheck source=scripts/env-inputs.sh
source "$script_dir/env-inputs.sh"
read_arguments "$@"
repo_root="$(dirname -- "$script_dir")"
python_bin="${PYTHON:-python3}"

# --- the recipe (everything that goes into the hash) --------------------------------
read -r -d '' RECIPE_BASE <<'PKGS' || true
torch==2.13.0
numpy
packaging
regex
pydantic
cbor2
psutil
pyzmq
requests
transformers>=5.16.1,<5.20
aiohttp
oss-harmony
openai
pillow
pybase64
cachetools
msgspec
cloudpickle
uvloop
py-cpuinfo
prometheus_client
fastapi>=0.133,<0.137
partial-json-parser
llguidance>=1.7,<1.8
einops
apache-tvm-ffi==0.1.11
PKGS
read -r -d '' RECIPE_NODEPS <<'PKGS' || true
vllm==0.32.0
xgrammar==0.2.8
PKGS
RECIPE_VERSION=1   # bump to force a rebuild when the build steps below change

py_version="$("$python_bin" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
recipe_hash="$(printf 'v%s\npython %s\n--- deps\n%s\n--- no-deps\n%s\n' \
    "$RECIPE_VERSION" "$py_version" "$RECIPE_BASE" "$RECIPE_NODEPS" \
    | sha256sum | cut -c1-16)"

cache_dir="$(cache_folder)"
env_dir="$cache_dir/parity-env-$recipe_hash"
if (( inputs_only )); then
    printf '%s\n' "$env_dir"
    exit 0
fi

# --- build the third-party part once per recipe --------------------------------------
if [[ -x "$env_dir/bin/python" && -f "$env_dir/.parity-env-complete" ]]; then
    log "reusing $env_dir"
else
    tmp_dir="$(mktemp -d "$cache_dir/.parity-env-$recipe_hash.tmp.XXXXXX")"
    cleanup() { rm -rf "$tmp_dir"; }
    trap cleanup EXIT
    log "building $env_dir (python $py_version) in $tmp_dir"
    start=$SECONDS
    "$python_bin" -m venv "$tmp_dir"
    mapfile -t base_pkgs < <(printf '%s\n' "$RECIPE_BASE" | sed '/^$/d')
    mapfile -t nodeps_pkgs < <(printf '%s\n' "$RECIPE_NODEPS" | sed '/^$/d')
    "$tmp_dir/bin/python" -m pip install --quiet "${base_pkgs[@]}" >&2
    "$tmp_dir/bin/python" -m pip install --quiet --no-deps "${nodeps_pkgs[@]}" >&2
    # Smoke test: the modules the parity tests import must load on CPU.
    "$tmp_dir/bin/python" -c '
import vllm.config, vllm.config.compilation, vllm.v1.cudagraph_dispatcher
import vllm.forward_context, vllm.v1.attention.backend
' >&2
    # The venv was made under a temporary name: point its scripts at the final one.
    { grep -rlI --null -F "$tmp_dir" "$tmp_dir/bin" || true; } \
        | xargs -0 -r sed -i "s|$(sed_literal "$tmp_dir")|$(sed_literal "$env_dir")|g"
    touch "$tmp_dir/.parity-env-complete"
    if mv -T "$tmp_dir" "$env_dir" 2>/dev/null; then
        log "built in $((SECONDS - start)) s, $(du -sh "$env_dir" | cut -f1)"
    else
        # Someone else finished the same recipe first (or a stale incomplete dir is there).
        if [[ -f "$env_dir/.parity-env-complete" ]]; then
            log "another build finished first; using it"
        else
            rm -rf "$env_dir"
            mv -T "$tmp_dir" "$env_dir"
            log "replaced an incomplete $env_dir"
        fi
    fi
    trap - EXIT
    rm -rf "$tmp_dir"
fi

# --- this project, editable, with its test extra -------------------------------------
stamp="$env_dir/.ascendgraph-install"
want="$repo_root $(sha256sum "$repo_root/pyproject.toml" 2>/dev/null | cut -c1-16)"
if [[ ! -f "$repo_root/pyproject.toml" ]]; then
    log "no $repo_root/pyproject.toml: not installing ascendgraph"
elif [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    log "ascendgraph from $repo_root already installed"
else
    log "installing ascendgraph from $repo_root (editable, [test])"
    rm -f "$stamp"
    "$env_dir/bin/python" -m pip install --quiet -e "$repo_root[test]" >&2
    printf '%s\n' "$want" > "$stamp"
fi

echo "$env_dir/bin/python"
