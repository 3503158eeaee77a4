#!/usr/bin/env bash
# Build (or reuse) the environment of the Ray tests (`ascendgraph scenario run --ray`,
# tests/ranks/test_ray.py, -m ray; docs/ranks.md "Many machines").
#
# Why a separate environment: Ray is an optional extra (`pip install 'ascendgraph[ray]'`)
# that the default suite must not need, and it brings its own daemons and dependencies.
#
# The environment lives in <cache>/ray-env-<hash> (<cache>: cache_folder in env-inputs.sh),
# <hash> being the sha256 of the recipe below and the Python version: nothing changed ->
# nothing rebuilt. It is built in a temporary directory and renamed into place, so an
# interrupted build leaves nothing half-built. This project is then installed into it
# (editable, with its `test` and `ray` extras); that step is skipped when the same checkout
# with the same pyproject.toml is already installed.
#
# Usage: scripts/ray-env.sh    -> last line of stdout: the environment's python.
# Logs go to stderr.  PYTHON=/path/to/python3.11 selects the interpreter (default python3).
set -euo pipefail

log_prefix=ray-env
script_dir="$(dirname -- "$(realpath -e -- "${BASH_SOURCE[0]}")")"
# shellcheck source=scripts/env-inputs.sh
source "$script_dir/env-inputs.sh"  # log, bad_input, cache_folder, sed_literal
repo_root="$(dirname -- "$script_dir")"
python_bin="${PYTHON:-python3}"

# --- the recipe (everything that goes into the hash) --------------------------------
# The third-party part: CPU torch (pyproject's pin) and Ray (the `ray` extra's pin).
read -r -d '' RECIPE <<'PKGS' || true
torch==2.13.0
ray==2.58.0
PKGS
RECIPE_VERSION=1   # bump to force a rebuild when the build steps below change

py_version="$("$python_bin" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
recipe_hash="$(printf 'v%s\npython %s\n%s\n' "$RECIPE_VERSION" "$py_version" "$RECIPE" | sha256sum | cut -c1-16)"

cache_dir="$(cache_folder)"
env_dir="$cache_dir/ray-env-$recipe_hash"

# --- the third-party part, once per recipe --------------------------------------------
if [[ -x "$env_dir/bin/python" && -f "$env_dir/.ray-env-complete" ]]; then
    log "reusing $env_dir"
else
    tmp_dir="$(mktemp -d "$cache_dir/.ray-env-$recipe_hash.tmp.XXXXXX")"
    trap 'rm -rf "$tmp_dir"' EXIT
    log "building $env_dir (python $py_version) in $tmp_dir"
    start=$SECONDS
    "$python_bin" -m venv "$tmp_dir"
    mapfile -t pkgs < <(printf '%s\n' "$RECIPE" | sed '/^$/d')
    "$tmp_dir/bin/python" -m pip install --quiet "${pkgs[@]}" >&2
    "$tmp_dir/bin/python" -c 'import ray, torch' >&2
    # The venv was made under a temporary name: point its scripts at the final one.
    { grep -rlI --null -F "$tmp_dir" "$tmp_dir/bin" || true; } \
        | xargs -0 -r sed -i "s|$(sed_literal "$tmp_dir")|$(sed_literal "$env_dir")|g"
    touch "$tmp_dir/.ray-env-complete"
    if ! mv -T "$tmp_dir" "$env_dir" 2>/dev/null; then
        if [[ -f "$env_dir/.ray-env-complete" ]]; then
            log "another build finished first; using it"
        else
            rm -rf "$env_dir"
            mv -T "$tmp_dir" "$env_dir"
        fi
    fi
    trap - EXIT
    rm -rf "$tmp_dir"
    log "built in $((SECONDS - start)) s"
fi

# --- this project, editable, with its test and ray extras -------------------------------
stamp="$env_dir/.ascendgraph-install"
want="$repo_root $(sha256sum "$repo_root/pyproject.toml" | cut -c1-16)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    log "ascendgraph from $repo_root already installed"
else
    log "installing ascendgraph from $repo_root (editable, [test,ray])"
    rm -f "$stamp"
    "$env_dir/bin/python" -m pip install --quiet -e "$repo_root[test,ray]" >&2
    printf '%s\n' "$want" > "$stamp"
fi

echo "$env_dir/bin/python"
