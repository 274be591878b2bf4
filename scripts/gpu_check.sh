#!/usr/bin/env bash
# Issue 4's GPU checks in one go, for a GPU machine with torch + triton only (no Hydra, no
# install). The steps run most telling first, so a lease that runs out still has those:
#   env      the device and the versions
#   moe      the target case (d_model 1024, N_E 32, G 128, K 4, 32768 tokens): the dense MLP,
#            the fused Triton layer, the unfused one and grouped_mm. Each is checked against
#            the float64 reference first, then timed eager and as CUDA-graph replays, and
#            the four targets are judged.
#   profile  GPU time per kernel of those layers, and of the fused layer with its scatters
#            in 2 and 4 token chunks (profile_moe.py --chunks)
#   products each of the layer's products beside cuBLAS's bmm of its FLOPs and beside itself
#            on rearranged rows: pre-gathered, token-interleaved (bench_products.py)
#   tests    the kernel tests, the `gpu` ones included
#   relshift the attention's relative shift + mask, torch.where vs the Triton kernels
#   train    WT-S and WT-B training steps, dense vs sigma-MoE (also in 4 token chunks), and
#            the steps' slowest kernels
#   ncu      hardware counters of the dense and the fused layer (Nsight Compute)
#   sweep    the dmodel_g128 sweep and its figure (Fig. benchmark_es128)
#   sweeps   not a default step: the paper's four other benchmark figures
# After the steps, always: the autotune table (scripts/autotune_table.py), every config each
# autotuner timed, per key (item 13 of benchmarks/gpu_h200.md reads it).
# Each step has its own time limit, so one that hangs or fails leaves the others' results.
# Output: OUT/gpu_check.log (every step's output) and each step's JSON (and figures).
#
#   bash scripts/gpu_check.sh [OUT]                 # OUT: default $OUT, else runs/gpu_check
#   STEPS="moe profile" bash scripts/gpu_check.sh   # a subset, in the order above
#   PACK=1 BUDGET=560 bash scripts/gpu_check.sh "$OUT"   # a 15-minute GPU lease (below)
# BUDGET=SECONDS: the whole run's limit. A step gets its own limit or what is left of the
#   budget (less GRACE, 10 s for a step that ignores SIGTERM to be killed), whichever is
#   less; a step with under MIN_STEP (20) seconds left is skipped.
# PACK=1: the results go into OUT/gpu_check.tar.gz, rewritten after every step, beside the
#   log; for a machine that returns only a few files.
# Each step's limit in seconds: MOE_LIMIT, PROFILE_LIMIT, PRODUCTS_LIMIT, TESTS_LIMIT,
# RELSHIFT_LIMIT, TRAIN_LIMIT, NCU_LIMIT, SWEEP_LIMIT, SWEEPS_LIMIT. TESTS_MARK=gpu runs the `gpu` tests
# only; TESTS_WORKERS=1 runs them in one process.
# Without a CUDA device (torch.cuda.is_available() False) it refuses at once, exit 1: every
# step would run on the CPU for minutes and tell nothing. GPU_CHECK_ALLOW_CPU=1 runs it
# there anyway (a dry run of the steps' commands).
set -uo pipefail
SECONDS=0  # bash would take an exported SECONDS as its start
case ${1:-} in
  -h|--help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  -*) echo "error: unknown option $1 (the only argument is the output folder; see --help)"
      exit 2 ;;
esac
if (($# > 1)); then
  echo "error: one argument, the output folder (got $#; options go in variables: see --help)"
  exit 2
fi
cd "$(dirname "$0")/.." || exit
out=${1:-${OUT:-runs/gpu_check}}
steps=${STEPS:-env moe profile products tests relshift train ncu sweep}
py=${PYTHON:-python3}
budget=${BUDGET:-}
min_step=${MIN_STEP:-20}
grace=${GRACE:-10}
for v in budget min_step grace; do
  if [[ -n ${!v} && ! ${!v} =~ ^[0-9]+$ ]]; then
    echo "error: ${v^^}=${!v}: a whole number of seconds"
    exit 2
  fi
done
if ((min_step < 1)); then
  echo "error: MIN_STEP must be at least 1 (timeout 0 never ends)"
  exit 2
fi
# torch only (the GPU machine has no Hydra); 3: torch without CUDA, any other failure is
# python's or torch's own (its traceback shown)
if [[ ${GPU_CHECK_ALLOW_CPU:-0} != 1 ]]; then
  "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)'
  rc=$?
  case $rc in
    0) ;;
    3) echo "error: scripts/gpu_check.sh needs a CUDA device (torch.cuda.is_available() is" \
         "False here)"
       exit 1 ;;
    *) echo "error: scripts/gpu_check.sh: $py could not tell whether a CUDA device is here" \
         "(exit $rc; it needs torch)"
       exit 1 ;;
  esac
fi
export PYTHONUNBUFFERED=1
mkdir -p "$out" || exit
out=$(cd "$out" && pwd)
log=$out/gpu_check.log
touch "$log"
res=$out  # where the steps write their results
if [[ ${PACK:-0} == 1 ]]; then
  res=$(mktemp -d) || exit
fi

pack() {  # the results so far as one archive, replaced atomically
  [[ $res == "$out" ]] && return 0
  cp "$log" "$res/" && tar czf "$out/.gpu_check.tar.gz" -C "$res" . &&
    mv "$out/.gpu_check.tar.gz" "$out/gpu_check.tar.gz"
}

run() {  # run NAME SECONDS CMD...: CMD's output to the terminal and to the log
  local name=$1 limit=$2
  shift 2
  [[ " $steps " == *" $name "* ]] || return 0
  if [[ -n $budget ]]; then
    local left=$((budget - SECONDS - grace))
    if ((left < min_step)); then
      echo "=== $name: skipped, $((budget - SECONDS))s of the ${budget}s budget left" |
        tee -a "$log"
      return 0
    fi
    ((limit > left)) && limit=$left
  fi
  echo "=== $name (limit ${limit}s): $*" | tee -a "$log"
  local t0=$SECONDS
  # SIGKILL `grace` seconds after a SIGTERM that did not end it; tee in a process
  # substitution, which bash does not wait for (a pipe's tee would wait for any process
  # that still holds the output, e.g. one that left the process group)
  timeout -k "$grace" "$limit" "$@" > >(tee -a "$log") 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0))s" | tee -a "$log"
  pack
}

run env 30 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,\
clocks.max.sm,temperature.gpu,power.draw --format=csv; $py -c 'import torch, triton, numpy; \
print(torch.__version__, triton.__version__, numpy.__version__, torch.cuda.get_device_name() \
if torch.cuda.is_available() else \"no CUDA device\")'"
# the torch path and the per-expert loop are left out: host-synced, seconds per case here
run moe "${MOE_LIMIT:-150}" "$py" scripts/bench_moe.py --check --sweeps \
  --backends triton triton_unfused grouped_mm --out "$res/moe.json"
run profile "${PROFILE_LIMIT:-60}" "$py" scripts/profile_moe.py \
  --backends triton triton_unfused grouped_mm --chunks 2 4 --out "$res/profile.json"
# the layer's launches take the configs the steps before tuned (Triton's disk cache)
run products "${PRODUCTS_LIMIT:-90}" "$py" scripts/bench_products.py --out "$res/products.json"
# the ahead-of-time compile tests need no GPU (CI runs them)
# in TESTS_WORKERS (4) processes where pytest-xdist is installed: most of the step is
# compiling kernel variants, on one core each (run 3: 111 s in one process)
workers=()
if ((${TESTS_WORKERS:-4} > 1)) && "$py" -c "import xdist" 2>/dev/null; then
  workers=(-n "${TESTS_WORKERS:-4}")
fi
run tests "${TESTS_LIMIT:-200}" "$py" -m pytest -q -p no:cacheprovider "${workers[@]}" \
  tests/test_kernels_triton.py tests/test_kernels_triton_configs.py \
  tests/test_kernels_precompile.py tests/test_kernels_topk.py tests/test_bench_products.py \
  tests/test_kernels_relshift.py tests/test_kernels_selector.py tests/test_kernels_key_value.py \
  tests/test_kernels_wgrad.py \
  -m "${TESTS_MARK:-not slow}" -k "not hopper and not smem_estimate and not spills"
run relshift "${RELSHIFT_LIMIT:-30}" "$py" scripts/bench_relshift.py --out "$res/relshift.json"
run train "${TRAIN_LIMIT:-120}" "$py" scripts/bench_train.py --reps 5 --profile 12 \
  --chunks 4 --out "$res/train.json"
# one forward+backward of the dense and the fused layer (also in 4 token chunks: does the
# scatter's DRAM traffic fall?) under ncu (the profile step filled
# Triton's autotune cache: no tuning runs under it), then the counters as a table
run ncu "${NCU_LIMIT:-120}" bash -c "command -v ncu >/dev/null || { echo 'no ncu here: skipped'; \
exit 0; }; ncu --profile-from-start off --clock-control none --section SpeedOfLight \
--section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
--metrics dram__bytes.sum,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed --print-units base --csv --page raw \
--log-file '$res/ncu.csv' \
$py scripts/profile_moe.py --backends triton --chunks 4 --ncu \
&& $py scripts/ncu_table.py '$res/ncu.csv' --out '$res/ncu.json'"
run sweep "${SWEEP_LIMIT:-200}" "$py" scripts/bench_moe.py --no-target --sweeps dmodel_g128 \
  --backends triton grouped_mm --out "$res/moe_dmodel_g128.json"
# not a default step (a few minutes more): the sweeps of Figs. benchmark_32exp, benchmark,
# benchmark_es and benchmark_dmodel, fused Triton and grouped_mm against the dense MLP
run sweeps "${SWEEPS_LIMIT:-300}" "$py" scripts/bench_moe.py --no-target --reps 10 \
  --sweeps dmodel_ne32 n_experts expert_size dmodel_f4096 --backends triton grouped_mm \
  --out "$res/moe_sweeps.json"
# after the steps, whatever the budget left (no GPU work, a second or two): every config
# each autotuner timed, per key, from the records Triton keeps in its cache folder
echo "=== autotune table (scripts/autotune_table.py)" | tee -a "$log"
timeout -k 2 20 "$py" scripts/autotune_table.py --out "$res/autotune.json" \
  > >(tee -a "$log") 2>&1
echo "=== autotune table: exit $?" | tee -a "$log"
# a step's output reaches the log through a tee that bash does not wait for: give the last
# one a moment, then pack the complete log
sleep 1
pack
