#!/usr/bin/env bash
# Build (or reuse) the environment that runs vLLM Ascend's own graph-mode code on the
# simulator's torch_npu facade (tests/vllm_ascend, -m vllm_ascend; docs/vllm-ascend.md).
#
# Two cached parts, both under ${ASCENDGRAPH_CACHE_DIR:-~/.cache/ascendgraph}:
#
# * vllm-ascend-env-<hash>: a virtual environment with CPU torch 2.13.0, the minimal set of
#   vLLM's dependencies its config / compilation / attention modules import on CPU (the
#   parity environment's list, plus scipy and numba that vLLM Ascend's model-runner module
#   imports), and
#   vllm==0.27.1 (vLLM Ascend's own target) without its dependencies (a plain install pulls
#   CUDA builds of torchvision / torchaudio that fail beside CPU torch), compressed-tensors
#   and torchvision 0.28.0 without theirs (vLLM Ascend's worker patches import vLLM modules
#   that import them: adapt_patch, NPUWorker.__init__), plus the harness files below. <hash> is the sha256 of the recipe: nothing changed -> nothing rebuilt. It
#   is built in a temporary directory and renamed into place, so an interrupted build leaves
#   nothing behind. This project is then installed into it (editable, [test]).
# * vllm-ascend-src-<hash>: the snapshot tarball unpacked (when VLLM_ASCEND_SRC is unset),
#   <hash> being the tarball's sha256. Nothing of vLLM Ascend is ever written into this
#   repository.
#
# What the harness supplies (what vLLM Ascend's setup.py would have produced):
# * vllm_ascend/_build_info.py with __device_type__ = 'A2' (setup.py gen_build_info; the
#   file is in vLLM Ascend's .gitignore). Written into the source only when it is missing,
#   so a contributor's own build keeps theirs.
# * a dist-info directory `vllm_ascend_sim_harness-0.dist-info` in the environment carrying
#   setup.py's `vllm.platform_plugins` / `vllm.general_plugins` entry points, so
#   vllm.platforms.current_platform is NPUPlatform.
# * a .pth file putting the vLLM Ascend source on sys.path (a contributor's checkout is used
#   in place; it is NOT installed).
# * torchvision's two unguarded operator schemas, defined just before torchvision is first
#   imported (PyPI's torchvision is a CUDA build whose C extension cannot load beside CPU
#   torch; scripts/vllm_ascend_env/torchvision_without_ops.py, loaded by a .pth file).
#
# Version check: the target vLLM of the source is read (.github/vllm-release-tag.commit, the
# Dockerfile's VLLM_TAG, README's "CI commitment ... vLLM vX tag" line, else the most frequent
# vllm_version_is("X") in the code) and said in one line; a mismatch with the environment's
# vLLM is a warning naming both.
#
# Usage: scripts/vllm-ascend-env.sh [--inputs-only]
#   -> last line of stdout: the environment's python.
# Logs go to stderr.  PYTHON selects the interpreter (default python3). VLLM_ASCEND_SRC points
# at a vLLM Ascend checkout (the directory holding vllm_ascend/); default: the snapshot
# VLLM_ASCEND_TARBALL (default: vllm-ascend-182b75ea.tar.gz in shared/third_party/vllm-ascend/
# beside the checkout, where the project's CI lays it).
# --inputs-only: check the inputs and prepare the source (unpack the snapshot), print the
# source folder and the environment folder that would be used, one a line, and stop before
# anything is installed (tests/unit/test_env_scripts.py runs the script this way).
#
# Bad input (a path that is not there, a control character in a path; scripts/env-inputs.sh)
# is one line on stderr and exit 2; a failed step exits non-zero with its own message.
set -euo pipefail

log_prefix=vllm-ascend-env
script_dir="$(dirname -- "$(realpath -e -- "${BASH_SOURCE[0]}")")"
# shellcheck source=scripts/env-inputs.sh
source "$script_dir/env-inputs.sh"
read_arguments "$@"
repo_root="$(dirname -- "$script_dir")"
python_bin="${PYTHON:-python3}"
refuse_control_characters VLLM_ASCEND_SRC "${VLLM_ASCEND_SRC:-}"  # before anything is written
refuse_control_characters VLLM_ASCEND_TARBALL "${VLLM_ASCEND_TARBALL:-}"
cache_dir="$(cache_folder)"

# --- the vLLM Ascend source -------------------------------------------------------------
snapshot_rel="shared/third_party/vllm-ascend/vllm-ascend-182b75ea.tar.gz"
default_tarball="$repo_root/../$snapshot_rel"
if [[ ! -f "$default_tarball" ]]; then
    # A git worktree: the snapshot sits beside the main checkout.
    common_dir="$(git -C "$repo_root" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
    if [[ -n "$common_dir" && -f "$(dirname -- "$common_dir")/../$snapshot_rel" ]]; then
        default_tarball="$(dirname -- "$common_dir")/../$snapshot_rel"
    fi
fi
if [[ -n "${VLLM_ASCEND_SRC:-}" ]]; then
    src_dir="$(resolved_folder VLLM_ASCEND_SRC "$VLLM_ASCEND_SRC")"
    [[ -f "$src_dir/vllm_ascend/__init__.py" ]] \
        || bad_input "VLLM_ASCEND_SRC=$src_dir has no vllm_ascend/__init__.py (point it at the checkout's root)"
    log "vLLM Ascend source: $src_dir (VLLM_ASCEND_SRC)"
else
    [[ -n "${VLLM_ASCEND_TARBALL:-}" || -f "$default_tarball" ]] \
        || bad_input "no vLLM Ascend source: set VLLM_ASCEND_SRC to a checkout, or VLLM_ASCEND_TARBALL to the snapshot (not found: $default_tarball)"
    tarball="$(resolved_file VLLM_ASCEND_TARBALL "${VLLM_ASCEND_TARBALL:-$default_tarball}")"
    tar_hash="$(sha256sum < "$tarball" | cut -c1-16)"
    src_dir="$cache_dir/vllm-ascend-src-$tar_hash"
    if [[ ! -f "$src_dir/.unpacked" ]]; then
        tmp_src="$(mktemp -d "$cache_dir/.vllm-ascend-src-$tar_hash.tmp.XXXXXX")"
        trap 'rm -rf -- "$tmp_src"' EXIT  # a tarball that does not unpack leaves nothing behind
        tar -xzf "$tarball" -C "$tmp_src" 2>/dev/null \
            || bad_input "VLLM_ASCEND_TARBALL=$tarball is not a gzipped tar archive (the snapshot vllm-ascend-<commit>.tar.gz)"
        [[ -f "$tmp_src/vllm_ascend/__init__.py" ]] \
            || bad_input "VLLM_ASCEND_TARBALL=$tarball has no vllm_ascend/__init__.py at its top (not a vLLM Ascend snapshot)"
        touch "$tmp_src/.unpacked"
        mv -T "$tmp_src" "$src_dir" 2>/dev/null || true  # another process may have unpacked it first
        trap - EXIT
        rm -rf -- "$tmp_src"
        log "unpacked $(basename -- "$tarball") into $src_dir"
    fi
    log "vLLM Ascend source: $src_dir (snapshot $(basename -- "$tarball"))"
fi
if (( ! inputs_only )) && [[ ! -f "$src_dir/vllm_ascend/_build_info.py" ]]; then
    printf '# Written by ascendgraph scripts/vllm-ascend-env.sh in place of setup.py gen_build_info\n__device_type__ = %s\n' \
        "'A2'" > "$src_dir/vllm_ascend/_build_info.py"
    log "wrote $src_dir/vllm_ascend/_build_info.py (__device_type__ = 'A2')"
fi

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
scipy
numba==0.65.0
loguru
PKGS
read -r -d '' RECIPE_NODEPS <<'PKGS' || true
vllm==0.27.1
xgrammar==0.2.8
compressed-tensors==0.20.1
torchvision==0.28.0
PKGS
VLLM_VERSION_IN_ENV=0.27.1
RECIPE_VERSION=1   # bump to force a rebuild when the build steps below change

# The entry points of vLLM Ascend's setup.py (setup(entry_points=...)) that vLLM reads.
read -r -d '' ENTRY_POINTS <<'EP' || true
[vllm.platform_plugins]
ascend = vllm_ascend:register

[vllm.general_plugins]
ascend_kv_connector = vllm_ascend:register_connector
ascend_model_loader = vllm_ascend:register_model_loader
ascend_service_profiling = vllm_ascend:register_service_profiling
ascend_model = vllm_ascend:register_model
EP


# torchvision's Python code beside CPU torch (scripts/vllm_ascend_env/torchvision_without_ops.py says why).
TORCHVISION_HOOK="$repo_root/scripts/vllm_ascend_env/torchvision_without_ops.py"

py_version="$("$python_bin" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
recipe_hash="$(printf 'v%s\npython %s\n--- deps\n%s\n--- no-deps\n%s\n--- ep\n%s\n--- hook\n%s\n' \
    "$RECIPE_VERSION" "$py_version" "$RECIPE_BASE" "$RECIPE_NODEPS" "$ENTRY_POINTS" "$(cat "$TORCHVISION_HOOK")" \
    | sha256sum | cut -c1-16)"
env_dir="$cache_dir/vllm-ascend-env-$recipe_hash"
if (( inputs_only )); then
    printf '%s\n' "$src_dir" "$env_dir"
    exit 0
fi

if [[ -x "$env_dir/bin/python" && -f "$env_dir/.vllm-ascend-env-complete" ]]; then
    log "reusing $env_dir"
else
    tmp_dir="$(mktemp -d "$cache_dir/.vllm-ascend-env-$recipe_hash.tmp.XXXXXX")"
    cleanup() { rm -rf "$tmp_dir"; }
    trap cleanup EXIT
    log "building $env_dir (python $py_version) in $tmp_dir"
    start=$SECONDS
    "$python_bin" -m venv "$tmp_dir"
    mapfile -t base_pkgs < <(printf '%s\n' "$RECIPE_BASE" | sed '/^$/d')
    mapfile -t nodeps_pkgs < <(printf '%s\n' "$RECIPE_NODEPS" | sed '/^$/d')
    "$tmp_dir/bin/python" -m pip install --quiet "${base_pkgs[@]}" >&2
    "$tmp_dir/bin/python" -m pip install --quiet --no-deps "${nodeps_pkgs[@]}" >&2
    site="$("$tmp_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    dist="$site/vllm_ascend_sim_harness-0.dist-info"
    mkdir -p "$dist"
    printf 'Metadata-Version: 2.1\nName: vllm-ascend-sim-harness\nVersion: 0\nSummary: vLLM Ascend entry points for the ascendgraph simulator (scripts/vllm-ascend-env.sh)\n' > "$dist/METADATA"
    printf '%s\n' "$ENTRY_POINTS" > "$dist/entry_points.txt"
    printf 'vllm_ascend_sim_harness-0.dist-info/METADATA,,\nvllm_ascend_sim_harness-0.dist-info/entry_points.txt,,\nvllm_ascend_sim_harness-0.dist-info/RECORD,,\n' > "$dist/RECORD"
    cp "$TORCHVISION_HOOK" "$site/_ascendgraph_torchvision_without_ops.py"
    printf 'import _ascendgraph_torchvision_without_ops; _ascendgraph_torchvision_without_ops.install()\n' \
        > "$site/vllm_ascend_torchvision.pth"
    # Smoke test before the source is on the path (vLLM Ascend's platform imports torch_npu,
    # which only the facade provides): vLLM's config and compilation import on CPU.
    VLLM_PLUGINS="" "$tmp_dir/bin/python" -c 'import vllm.config, vllm.compilation' >&2
    { grep -rlI --null -F "$tmp_dir" "$tmp_dir/bin" || true; } \
        | xargs -0 -r sed -i "s|$(sed_literal "$tmp_dir")|$(sed_literal "$env_dir")|g"
    touch "$tmp_dir/.vllm-ascend-env-complete"
    if mv -T "$tmp_dir" "$env_dir" 2>/dev/null; then
        log "built in $((SECONDS - start)) s, $(du -sh "$env_dir" | cut -f1)"
    elif [[ -f "$env_dir/.vllm-ascend-env-complete" ]]; then
        log "another build finished first; using it"
    else
        rm -rf "$env_dir"
        mv -T "$tmp_dir" "$env_dir"
        log "replaced an incomplete $env_dir"
    fi
    trap - EXIT
    rm -rf "$tmp_dir"
fi

# --- the source on sys.path (re-pointed every run: VLLM_ASCEND_SRC may change) ----------
site="$("$env_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
printf '%s\n' "$src_dir" > "$site/vllm_ascend_source.pth"

# --- this project, editable, with its test extra -------------------------------------
stamp="$env_dir/.ascendgraph-install"
want="$repo_root $(sha256sum "$repo_root/pyproject.toml" | cut -c1-16)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    log "ascendgraph from $repo_root already installed"
else
    log "installing ascendgraph from $repo_root (editable, [test])"
    rm -f "$stamp"
    "$env_dir/bin/python" -m pip install --quiet -e "$repo_root[test]" >&2
    printf '%s\n' "$want" > "$stamp"
fi

# --- the version check (one line) ----------------------------------------------------
"$env_dir/bin/python" "$repo_root/tests/vllm_ascend/source_info.py" "$src_dir" "$VLLM_VERSION_IN_ENV" >&2 \
    || log "warning: could not read the source's target vLLM"

echo "$env_dir/bin/python"
