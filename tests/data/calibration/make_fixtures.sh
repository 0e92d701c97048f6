#!/usr/bin/env bash
# Record the metrics of real short CPU runs of the runner, for tests/test_calibrate.py.
#
# Usage (from anywhere, in the repo's Python environment; about 2 minutes on 2 cores):
#   bash tests/data/calibration/make_fixtures.sh
#
# Each run: nanoplan prepare-data on examples/tiny/text.txt, nanoplan estimate --out
# RUN_DIR/plan.json (validation every 10 steps), then nanoplan run (torchrun). Kept per run:
# metrics.jsonl, run_info.json, stop.json and plan.json; checkpoints are deleted. Nothing here
# is edited by hand.
#   tiny-1cpu     tiny preset (131,072 params), 1 process, 40 steps
#   tiny-2cpu     the same model, 2 processes (gloo DDP), 40 steps
#   d2-1cpu       nanochat depth 2 (458,752 params), 1 process, killed after step 30
#                 (NANOPLAN_FAULT=step:30) and resumed by torchrun from its last checkpoint, so
#                 metrics.jsonl holds two segments and re-logged steps
#   d3-1cpu       nanochat depth 3 (1,425,408 params), 1 process, 40 steps
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1 NANOPLAN_TENSORBOARD=0 PYTHONUNBUFFERED=1
unset NANOPLAN_FAULT NANOPLAN_TIME_SCALE NANOPLAN_CKPT_DELAY_S
cd "$REPO"

nanoplan prepare-data examples/tiny/text.txt --out "$WORK/data" --tokenizer byte --val-fraction 0.1 >/dev/null

# record NAME GPUS [env assignments --] estimate-model-args...
record() {
  local name=$1 gpus=$2; shift 2
  local envs=()
  if [[ ${1:-} == env:* ]]; then envs+=("${1#env:}"); shift; fi
  local run="$WORK/runs/$name"
  mkdir -p "$run"
  nanoplan estimate --gpu "${gpus}xCPU" "$@" --seq-len 64 --vocab-size 256 --data "$WORK/data" \
    --steps 40 --total-batch-tokens $((1024 * gpus)) --checkpoint-every-minutes 0.1 \
    --run-dir "$run" --out "$run/plan.json" >/dev/null
  # Validation every 10 steps (the estimate CLI has no flag for it): rebuild the plan from its request.
  python - "$run/plan.json" <<'EOF'
import sys
from planner.build import build_plan
from planner.plan import load_plan, save_plan
path = sys.argv[1]
plan = load_plan(path)
hyper = plan.request.hyper.model_copy(update={"val_every_steps": 10, "lr": 3e-3})
save_plan(build_plan(plan.request.model_copy(update={"hyper": hyper}), plan_path=path), path)
EOF
  echo "recording $name: nanoplan run $run/plan.json ${envs[*]}" >&2
  env "${envs[@]}" nanoplan run "$run/plan.json" --run-dir "$run" >"$WORK/$name.log" 2>&1 \
    || { cat "$WORK/$name.log" >&2; exit 1; }
  rm -rf "$HERE/$name"
  mkdir -p "$HERE/$name"
  cp "$run/metrics.jsonl" "$run/run_info.json" "$run/stop.json" "$run/plan.json" "$HERE/$name/"
}

record tiny-1cpu 1 --preset tiny
record tiny-2cpu 2 --preset tiny
record d2-1cpu 1 env:NANOPLAN_FAULT=step:30 --depth 2
record d3-1cpu 1 --depth 3
echo "wrote $(ls -d "$HERE"/*/ | wc -l) runs under $HERE" >&2
