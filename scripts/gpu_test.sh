#!/usr/bin/env bash
# The GPU test command: every test that exercises the real kernels and their launch paths, on a
# machine with a CUDA GPU, in two passes (each with its own logs):
#   1. every GPU-relevant test, launch plans off, every fast launch's specialization key checked
#      (OPFORGE_CHECK_LAUNCH_KEYS=1)
#   2. the tests that launch kernels (tests/ops, tests/runtime, tests/models) as
#      users get them: the default launch paths (plans on unless OPFORGE_PLANS=0), no key check
# and, beside pass 1, `opforge verify --quick` (every op, every backend here, vs float64).
# Left out: emulator-only tests (marker `emulator`: test_*_metal.py, tests/metal_emu, tests/fusion/test_metal_emulated.py;
# the MSL emulator on the CPU, which a GPU does not change) and CPU-only tests (marker `cpu_only`:
# torch.compile over the torch path on CPU tensors); CI runs both.
#
# On a cold Triton cache the time goes to compiling kernels (CPU work), so each pass runs its test
# files in GPU_TEST_SHARDS pytest processes at once (default 12) on the one GPU, dealt out by the
# estimated seconds in scripts/gpu_test_seconds.txt (heaviest first, each to the lightest shard).
# The out-of-memory test file runs alone after each pass (it fills the GPU). Memory-counting tests
# (soak, threads) count their own process only, so they share the GPU with the other shards.
# A pass that runs out of time is interrupted (SIGINT), so pytest still prints which tests failed.
# Uses the python3 that has torch with CUDA (no venv: the GPU machine's own torch and triton).
#   bash scripts/gpu_test.sh   # summary on stdout; every log in $OUT/gpu_test_logs.tar.gz
#                              # (or ./gpu-test-logs/ without $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${OUT:-}" ]; then LOGS="$(mktemp -d)"; else LOGS="$PWD/gpu-test-logs"; fi
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"
SHARDS="${GPU_TEST_SHARDS:-12}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" -c "import torch, triton, sys; assert torch.cuda.is_available(), 'no CUDA GPU here';
print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" || exit 2
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rfE --durations=0 --durations-min=0.5 -m "not emulator and not cpu_only")
ALONE=(tests/runtime/test_out_of_memory.py)  # fills the GPU: nothing else may run beside it

# shard_files DIR... : print SHARDS lines, each a space-separated list of test files (heaviest first
# by scripts/gpu_test_seconds.txt, else by size, each to the lightest shard), leaving out the
# emulator-only folders and the ALONE files.
shard_files() {
  "$PY" - "$SHARDS" "${ALONE[*]}" "$@" <<'EOF'
import os, sys
shards, alone, roots = int(sys.argv[1]), set(sys.argv[2].split()), sys.argv[3:]
files = []
for root in roots:
    for d, _, names in os.walk(root):
        if d.startswith("tests/metal_emu"):
            continue
        files += [os.path.join(d, n) for n in names if n.startswith("test_") and n.endswith(".py")
                  and not n.endswith("_metal.py")]
seconds = {}
with open("scripts/gpu_test_seconds.txt") as table:
    for line in table:
        if line.strip() and not line.startswith("#"):
            value, name = line.split()
            seconds[name] = float(value)
weight = lambda f: seconds.get(f, os.path.getsize(f) / 5000)  # a file not in the table: ~1 s per 5 KB
files = sorted((f for f in files if f not in alone and not f.endswith("test_metal_emulated.py")),
               key=weight, reverse=True)
load, out = [0.0] * shards, [[] for _ in range(shards)]
for f in files:
    i = load.index(min(load))
    load[i] += weight(f)
    out[i].append(f)
for files_of_shard in out:
    print(" ".join(files_of_shard))
EOF
}

# run_pass NAME SECONDS ALONE_SECONDS DIR... : the sharded run, then the ALONE files; exit status 0
# only if all passed.
run_pass() {
  local name=$1 seconds=$2 alone_seconds=$3; shift 3
  local i=0 pids=() rc=0
  while IFS= read -r files; do
    [ -z "$files" ] && continue
    # shellcheck disable=SC2086
    timeout -s INT -k 20 "$seconds" "${PYTEST[@]}" $files > "$LOGS/${name}_shard$i.log" 2>&1 &
    pids+=($!); i=$((i + 1))
  done < <(shard_files "$@")
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  if [ -n "${verify_pid:-}" ]; then  # verify ends before the tests that fill GPU memory start
    wait "$verify_pid"; verify_rc=$?; verify_pid=
  fi
  local alone=()
  for f in "${ALONE[@]}"; do for d in "$@"; do [[ $f == $d/* ]] && alone+=("$f"); done; done
  if [ ${#alone[@]} -gt 0 ]; then
    timeout -s INT -k 20 "$alone_seconds" "${PYTEST[@]}" "${alone[@]}" > "$LOGS/${name}_alone.log" 2>&1 || rc=1
  fi
  for log in "$LOGS/${name}"_*.log; do echo "  $(basename "$log"): $(tail -n 1 "$log")"; done
  return $rc
}

status=0
start=$SECONDS
# verify runs beside pass 1's shards (its own process) and ends before the out-of-memory test
OPFORGE_VERIFY_PROGRESS=1 timeout -s INT -k 10 240 "$PY" -m opforge verify --quick > "$LOGS/verify.log" 2>&1 &
verify_pid=$! verify_rc=
echo "pass 1 (plans off, launch keys checked):"
OPFORGE_PLANS=0 OPFORGE_CHECK_LAUNCH_KEYS=1 run_pass keys 330 60 tests || status=1
echo "pass 2 (default launch paths):"
# 200 s: test_bench_model.py's shard, CPU-bound beside eleven others, took 135-151 s
run_pass default 200 60 tests/ops tests/runtime tests/models || status=1
[ "$verify_rc" != 0 ] && status=1
echo "opforge verify --quick: exit $verify_rc  $(tail -n 1 "$LOGS/verify.log")"
grep -h "^FAILED\|^ERROR" "$LOGS"/*.log | sort -u | head -60
if [ -n "${OUT:-}" ]; then tar -czf "$OUT/gpu_test_logs.tar.gz" -C "$LOGS" .; fi
echo "gpu_test.sh: $((SECONDS - start)) s, $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
