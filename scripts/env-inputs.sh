# Sourced by scripts/vllm-ascend-env.sh and scripts/parity-env.sh: how they read the paths a
# caller gives them (environment variables) before anything is written.
#
# * A path with a control character (a newline, a tab, an escape) is refused in one line
#   naming the variable: the source folder is written as one line of a .pth file, where a
#   newline would start a second line, and a .pth line starting with `import` runs at every
#   start of that Python.
# * Paths are resolved with `realpath -e --`, never with `cd`: `cd -` goes to $OLDPWD, `cd -P`
#   is an option, and an exported CDPATH makes `cd name` go to another folder named `name`
#   (and print it, into the captured value).
#
# The sourcing script sets `log_prefix` (its name) first; this file defines the log lines
# (`log`, `die`: exit 1, `bad_input`: exit 2) and reads the one argument both take.

log() { printf '[%s] %s\n' "$log_prefix" "$*" >&2; }
die() { printf '[%s] error: %s\n' "$log_prefix" "$*" >&2; exit 1; }
bad_input() { printf '[%s] error: %s\n' "$log_prefix" "$*" >&2; exit 2; }

# read_arguments "$@" -> inputs_only=1 for --inputs-only, 0 without arguments
read_arguments() {
    inputs_only=0
    case "${1-}" in
        "") ;;
        --inputs-only) inputs_only=1 ;;
        *) bad_input "unknown argument ${1@Q}; the only one is --inputs-only" ;;
    esac
}

# refuse_control_characters NAME VALUE
refuse_control_characters() {
    if [[ "$2" == *[[:cntrl:]]* ]]; then
        bad_input "$1 contains a control character (a newline, tab or escape); set it to a plain path"
    fi
}

# resolved_folder NAME VALUE -> the folder's absolute path, symbolic links resolved
resolved_folder() {
    local resolved
    refuse_control_characters "$1" "$2"
    resolved="$(realpath -e -- "$2" 2>/dev/null)" && [[ -d "$resolved" ]] \
        || bad_input "$1=$2 is not a folder"
    refuse_control_characters "$1 (resolved to $resolved)" "$resolved"
    printf '%s\n' "$resolved"
}

# resolved_file NAME VALUE -> the regular file's absolute path, symbolic links resolved
resolved_file() {
    local resolved
    refuse_control_characters "$1" "$2"
    resolved="$(realpath -e -- "$2" 2>/dev/null)" && [[ -f "$resolved" ]] \
        || bad_input "$1=$2 is not a file"
    refuse_control_characters "$1 (resolved to $resolved)" "$resolved"
    printf '%s\n' "$resolved"
}

# cache_folder -> $ASCENDGRAPH_CACHE_DIR, else $XDG_CACHE_HOME/ascendgraph (an absolute
# XDG_CACHE_HOME only), else ~/.cache/ascendgraph: the folder the Python code uses
# (ascendgraph.readers.user_cache_root); created, as an absolute path
cache_folder() {
    local wanted="${ASCENDGRAPH_CACHE_DIR:-}"
    if [[ -z "$wanted" ]]; then
        if [[ "${XDG_CACHE_HOME:-}" == /* ]]; then
            wanted="$XDG_CACHE_HOME/ascendgraph"
        else
            wanted="$HOME/.cache/ascendgraph"
        fi
    fi
    refuse_control_characters ASCENDGRAPH_CACHE_DIR "$wanted"
    mkdir -p -- "$wanted" 2>/dev/null || bad_input "ASCENDGRAPH_CACHE_DIR=$wanted cannot be created as a folder"
    resolved_folder ASCENDGRAPH_CACHE_DIR "$wanted"
}

# sed_literal TEXT -> TEXT escaped for a sed `s|...|...|` pattern or replacement
sed_literal() {
    printf '%s' "$1" | sed -e 's/[][\.*^$|&/]/\\&/g'
}
