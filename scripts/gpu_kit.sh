#!/usr/bin/env bash
# The GPU day kit (docs/gpu.md): one prepared command for a short GPU loan.
#
#   scripts/gpu_kit.sh prepare        here, with the network: the wheels the GPU image lacks, into .whl/
#   scripts/gpu_kit.sh run [ARGS]     there (or here: --cpu, automatic without CUDA): install them, run the kit
#   scripts/gpu_kit.sh check          here, offline: the import check and the wheels in .whl/, no download
#
# prepare downloads benchmarks/gpu_kit_wheels.txt (NAME==VERSION) as CPython 3.12 manylinux x86-64 wheels with
# the device tool's pip flags, removes any other wheel from .whl/ (two versions of one package stop the install
# there), checks that every import on the kit's path is in the GPU image (benchmarks/gpu_kit_image.txt) or among
# the wheels, and that the working tree plus .whl/ fits the 64 MiB that a device call carries.
# run installs .whl/*.whl into a temporary --target (no index, no dependencies), puts it on PYTHONPATH after
# the repository, and runs benchmarks/gpu_kit.py run ARGS; results go to $OUT (default runs/gpu_kit/out).
# PYTHON picks the interpreter (default python3), GPU_KIT_WHEELS the wheel folder (default .whl).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
WHEELS=${GPU_KIT_WHEELS:-.whl}
LIST=benchmarks/gpu_kit_wheels.txt
CARRY_LIMIT_MIB=64
PIP_FLAGS=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
           --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

pins() { grep -v '^[[:space:]]*#' "$LIST" | sed '/^[[:space:]]*$/d'; }

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

bytes_of() { xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'; }

check() {
    "$PY" benchmarks/gpu_kit_imports.py --wheels "$WHEELS" --check-wheels
}

prepare() {
    mkdir -p "$WHEELS"
    local pin
    # a wheel is kept only if it is a pinned NAME==VERSION (the check below names anything else)
    "$PY" benchmarks/gpu_kit_imports.py --wheels "$WHEELS" --prune
    while read -r pin; do
        if "$PY" benchmarks/gpu_kit_imports.py --wheels "$WHEELS" --has "$pin"; then
            echo "have  $pin"
        else
            echo "fetch $pin"
            "$PY" -m pip download --quiet --disable-pip-version-check "${PIP_FLAGS[@]}" -d "$WHEELS" "$pin"
        fi
    done < <(pins)
    check
    printf '%s %s\n' "$(git rev-parse HEAD 2>/dev/null || echo unknown)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        > "$WHEELS/PREPARED"
    local tree whl total
    tree=$({ git ls-files -z; git ls-files -z -o --exclude-standard; } | bytes_of)
    whl=$(find "$WHEELS" -maxdepth 1 -type f -print0 | bytes_of)
    total=$((tree + whl))
    echo "size: working tree $(mib "$tree") MiB + $WHEELS $(mib "$whl") MiB = $(mib "$total") MiB" \
         "of the $CARRY_LIMIT_MIB a call carries"
    if ((total > CARRY_LIMIT_MIB * 1048576)); then
        echo "error: the working tree and $WHEELS are over $CARRY_LIMIT_MIB MiB" >&2
        echo "hint: remove untracked files, or carry fewer wheels" >&2
        exit 2
    fi
    echo "ready: carry [\"$WHEELS\"] in the device call (docs/gpu.md)"
}

SITE=""
cleanup() { if [[ -n $SITE && -d $SITE && ! -L $SITE ]]; then rm -rf -- "$SITE"; fi; }

run() {
    local rc=0
    if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
        echo "note: no wheels in $WHEELS; using $PY's own packages"
    elif ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
        echo "note: the wheels in $WHEELS are for CPython 3.12 (the GPU image's); $PY is not: using its own packages"
    else
        SITE=$(mktemp -d "${TMPDIR:-/tmp}/gpu_kit_site.XXXXXX")
        trap cleanup EXIT
        "$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$SITE" "$WHEELS"/*.whl
        export GPU_KIT_SITE=$SITE
        export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
        echo "installed $(find "$WHEELS" -maxdepth 1 -type f -name '*.whl' | wc -l) wheels from $WHEELS into $SITE"
    fi
    if ! "$PY" -c "import pydantic" 2>/dev/null; then
        echo "error: pydantic cannot be imported by $PY, and $WHEELS holds no wheels" >&2
        echo "hint: run scripts/gpu_kit.sh prepare on a machine with the network, and carry $WHEELS" >&2
        exit 2
    fi
    export PYTHONUNBUFFERED=1
    "$PY" benchmarks/gpu_kit.py run "$@" || rc=$?
    return "$rc"
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    check) shift; check "$@" ;;
    run) shift; run "$@" ;;
    *) echo "usage: scripts/gpu_kit.sh prepare | check | run [--cpu] [--out DIR] [--parts ...] (docs/gpu.md)" >&2
       exit 2 ;;
esac
