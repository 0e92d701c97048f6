#!/usr/bin/env bash
# Does the README's install resolve on the public package index? Run it before you change a pin
# (constraints.txt, pyproject.toml). It needs the network, so it is not part of the test suite.
#
#   scripts/check_install.sh            both paths: the default (PyPI, CUDA torch) and CPU-only
#   scripts/check_install.sh cuda       only the default path
#   scripts/check_install.sh cpu        only the CPU-only path (PyTorch's CPU wheel index)
#
# `pip --isolated` ignores this machine's pip settings (local wheels, extra indexes, caps), so pip asks
# the public index as a new machine would; `--dry-run --ignore-installed` resolves without installing.
# Where the PyTorch CPU index cannot be reached, NANOPLAN_TORCH_WHEELS=DIR (a folder holding the same
# torch-2.13.0+cpu wheel) stands in for it, and the script says so.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH="torch==2.13.0"
CPU_INDEX="https://download.pytorch.org/whl/cpu"
EXTRAS=".[dev,trainers]"
PIP=(python -m pip --isolated --disable-pip-version-check install --dry-run --ignore-installed --quiet
     --report -)

resolve() {   # resolve NAME ARGS...: print how many packages it would install and its torch, or the error
    local name=$1; shift
    local out
    out=$(mktemp)
    if "${PIP[@]}" "$@" >"$out" 2>&1; then
        python - "$name" "$out" <<'EOF'
import json, sys
text = open(sys.argv[2]).read()
report = json.loads(text[text.index("{"):])
pkgs = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
print(f"ok    {sys.argv[1]}: {len(pkgs)} packages, torch {pkgs.get('torch', '(not resolved here)')}, "
      f"triton {pkgs.get('triton', '-')}")
EOF
    else
        echo "FAIL  $name:"
        grep -E "ERROR|conflict|depends on|requested" "$out" | sed 's/^/      /' | head -20
        rm -f "$out"
        return 1
    fi
    rm -f "$out"
}

want=${1:-both}
status=0
if [[ $want == both || $want == cuda ]]; then
    resolve "default (PyPI, CUDA torch)" -c constraints.txt "$TORCH" -e "$EXTRAS" || status=1
fi
if [[ $want == both || $want == cpu ]]; then
    if python -m pip --isolated download --no-deps --dry-run --quiet --index-url "$CPU_INDEX" "$TORCH" \
            -d /tmp/nanoplan-check-install >/dev/null 2>&1 ||
       curl -sf --max-time 20 -o /dev/null "$CPU_INDEX/torch/"; then
        # step 1 of the README's CPU path: torch from PyTorch's CPU index; step 2: the project from PyPI
        resolve "CPU-only, torch" --index-url "$CPU_INDEX" "$TORCH" || status=1
        resolve "CPU-only, project" --extra-index-url "$CPU_INDEX" -c constraints.txt "${TORCH}+cpu" -e "$EXTRAS" \
            || status=1
    elif [[ -n ${NANOPLAN_TORCH_WHEELS:-} ]]; then
        echo "note  $CPU_INDEX is unreachable here; the torch wheel in $NANOPLAN_TORCH_WHEELS stands in for it"
        resolve "CPU-only (local torch wheel)" --find-links "$NANOPLAN_TORCH_WHEELS" -c constraints.txt \
            "${TORCH}+cpu" -e "$EXTRAS" || status=1
    else
        echo "skip  CPU-only: $CPU_INDEX is unreachable; set NANOPLAN_TORCH_WHEELS=DIR to a folder with its torch wheel"
    fi
fi
exit $status
