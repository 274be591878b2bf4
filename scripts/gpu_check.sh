#!/usr/bin/env bash
# Issue 4's GPU checks in one go, for a GPU machine with torch + triton only (no Hydra, no
# install): the device; bench_moe.py's dmodel_g128 sweep (the GPU target case among it, the
# Triton, grouped_mm and dense layers, eager and CUDA-graph times) with every backend checked
# against the float64 reference first; the kernel tests (the `gpu` ones included); the
# per-kernel profile of the target case; the hardware counters of its kernels (Nsight
# Compute); WT-S and WT-B training steps, dense vs sigma-MoE.
# Each step has its own time limit, so one that hangs or fails leaves the others' results.
# Output: OUT/gpu_check.log (every step's output) and the JSON (and figures) of each step.
#
#   bash scripts/gpu_check.sh [OUT]          # OUT: default $OUT, else runs/gpu_check
#   STEPS="moe profile" bash scripts/gpu_check.sh   # a subset: env moe tests profile wave ncu train
#   STEPS=sweeps bash scripts/gpu_check.sh         # the paper's four other benchmark figures
# Each step's limit in seconds: MOE_LIMIT, TESTS_LIMIT, PROFILE_LIMIT, WAVE_LIMIT, NCU_LIMIT,
# TRAIN_LIMIT, SWEEPS_LIMIT;
# TESTS_MARK=gpu runs the `gpu` tests only.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-runs/gpu_check}}
steps=${STEPS:-env moe tests profile wave ncu train}
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$out"
log=$out/gpu_check.log

run() {  # run NAME SECONDS CMD...: CMD's output to the terminal and to the log
  local name=$1 limit=$2
  shift 2
  [[ " $steps " == *" $name "* ]] || return 0
  echo "=== $name (limit ${limit}s): $*" | tee -a "$log"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0))s" | tee -a "$log"
}

run env 30 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,\
clocks.max.sm,temperature.gpu,power.draw --format=csv; $py -c 'import torch, triton, numpy; \
print(torch.__version__, triton.__version__, numpy.__version__, torch.cuda.get_device_name())'"
# the torch path and the per-expert loop are left out: host-synced, seconds per case here
run moe "${MOE_LIMIT:-200}" "$py" scripts/bench_moe.py --check --sweeps dmodel_g128 \
  --backends triton triton_unfused grouped_mm --out "$out/moe.json"
# the ahead-of-time compile tests need no GPU (CI runs them)
run tests "${TESTS_LIMIT:-200}" "$py" -m pytest -q -p no:cacheprovider tests/test_kernels_triton.py \
  tests/test_kernels_topk.py tests/test_kernels_wave.py \
  -m "${TESTS_MARK:-not slow}" -k "not hopper and not smem_estimate and not spills"
run profile "${PROFILE_LIMIT:-60}" "$py" scripts/profile_moe.py --out "$out/profile.json"
# the one-launch scatter (kernels/triton_wave.py; its GPU test ran in the tests step): the
# scatters alone against the per-slot launches for several token blocks, then the target
# case checked and judged with it, and its kernels profiled (against the profile above)
run wave "${WAVE_LIMIT:-150}" bash -c "$py scripts/bench_scatter.py --out '$out/scatter.json'; \
$py scripts/bench_moe.py --check --sweeps --backends triton --scatter wave \
--out '$out/moe_wave.json' && $py scripts/profile_moe.py --backends triton --scatter wave \
--out '$out/profile_wave.json'"
# one forward+backward of the dense and the fused layer under ncu (the profile step filled
# Triton's autotune cache: no tuning runs under it), then the counters as a table
run ncu "${NCU_LIMIT:-120}" bash -c "command -v ncu >/dev/null || { echo 'no ncu here: skipped'; \
exit 0; }; ncu --profile-from-start off --clock-control none --section SpeedOfLight \
--section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
--print-units base --csv --page raw --log-file '$out/ncu.csv' \
$py scripts/profile_moe.py --backends triton --ncu \
&& $py scripts/ncu_table.py '$out/ncu.csv' --out '$out/ncu.json'"
run train "${TRAIN_LIMIT:-120}" "$py" scripts/bench_train.py --reps 5 --profile 12 \
  --out "$out/train.json"
# not a default step (a few minutes more): the sweeps of Figs. benchmark_32exp, benchmark,
# benchmark_es and benchmark_dmodel, fused Triton and grouped_mm against the dense MLP
run sweeps "${SWEEPS_LIMIT:-300}" "$py" scripts/bench_moe.py --no-target --reps 10 \
  --sweeps dmodel_ne32 n_experts expert_size dmodel_f4096 --backends triton grouped_mm \
  --out "$out/moe_sweeps.json"
