#!/usr/bin/env bash
# Issue 4's GPU checks in one go, for a GPU machine with torch + triton only (no Hydra, no
# install): the device, bench_moe.py's target case with every backend checked against the
# float64 reference first, the per-kernel profile of that case, a WT-B training step dense
# vs sigma-MoE, and the kernel tests (the `gpu` ones included). Each step has its own time
# limit, so one that hangs or fails leaves the others' results; logs and JSON go to OUT.
#
#   bash scripts/gpu_check.sh [OUT]          # OUT: default $OUT, else runs/gpu_check
#   STEPS="moe profile" bash scripts/gpu_check.sh   # a subset: env moe profile train tests
# Each step's limit in seconds: MOE_LIMIT, PROFILE_LIMIT, TRAIN_LIMIT, TESTS_LIMIT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-runs/gpu_check}}
steps=${STEPS:-env moe profile train tests}
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$out"

run() {  # run NAME SECONDS CMD...: CMD's output to the terminal and to OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  [[ " $steps " == *" $name "* ]] || return 0
  echo "=== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
  echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0))s"
}

run env 30 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,\
clocks.max.sm,temperature.gpu,power.draw --format=csv; $py -c 'import torch, triton, numpy; \
print(torch.__version__, triton.__version__, numpy.__version__, torch.cuda.get_device_name())'"
run moe "${MOE_LIMIT:-200}" "$py" scripts/bench_moe.py --check --sweeps \
  --backends triton triton_unfused grouped_mm torch --out "$out/moe_target.json"
run profile "${PROFILE_LIMIT:-60}" "$py" scripts/profile_moe.py --out "$out/profile.json"
run train "${TRAIN_LIMIT:-120}" "$py" scripts/bench_train.py --shapes wt_big --reps 5 \
  --profile 12 --out "$out/train.json"
# the ahead-of-time compile tests need no GPU (CI runs them); TESTS_MARK=gpu: the gpu ones only
run tests "${TESTS_LIMIT:-150}" "$py" -m pytest -q -p no:cacheprovider tests/test_kernels_triton.py \
  -m "${TESTS_MARK:-not slow}" -k "not hopper and not smem_estimate and not spills"
