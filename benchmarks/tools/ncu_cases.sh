#!/usr/bin/env bash
# Nsight Compute reports of the kernels in ncu_cases.py, one text report per case under $1.
# Usage: bash benchmarks/tools/ncu_cases.sh OUT_DIR [case ...]   (GPU; ncu on the PATH)
set -u
out=${1:?output folder}; shift
mkdir -p "$out"
export PYTHONPATH=src
declare -A KERNEL=(
  [planes16_gate_up]=_planes_kernel [planes16_down]=_planes_kernel [planes16_1b_down]=_planes_kernel
  [planes64_gate_up]=_planes_kernel [gemv1_gate_up]=_gemv_kernel [int8_16_gate_up]=_qmm_kernel
  [prefill_d128_1k]=_prefill_kernel [layer_norm_65536]=_looped_kernel [softmax_65536]=_looped_kernel
  [planes1_8b_qkv]='_planes_kernel|_combine_kernel' [planes1_8b_o]='_planes_kernel|_combine_kernel'
  [rms_norm_65536]=_looped_kernel
)
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=($(python3 benchmarks/tools/ncu_cases.py --list))
stalls='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
for c in "${cases[@]}"; do
  python3 benchmarks/tools/ncu_cases.py "$c" > /dev/null 2>&1   # compile outside the profiler
  extra=()
  count=1
  case $c in planes16_gate_up|prefill_d128_1k) extra=(--section SourceCounters);; esac
  case $c in planes1_*) count=2;; esac   # the planes kernel and the combine kernel of its K split
  timeout 240 ncu --clock-control none -k "regex:${KERNEL[$c]}" --launch-skip 2 --launch-count $count \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section SchedulerStats --section WarpStateStats "${extra[@]}" --metrics "$stalls" \
    python3 benchmarks/tools/ncu_cases.py "$c" > "$out/ncu_$c.txt" 2>&1
  echo "$c: rc $? $(grep -m1 'rel err' "$out/ncu_$c.txt")"
done
