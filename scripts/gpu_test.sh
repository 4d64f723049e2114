#!/usr/bin/env bash
# The GPU test command: every test that exercises the real kernels and their launch paths, on a
# machine with a CUDA GPU, in two passes (each with its own log):
#   1. every GPU-relevant test, launch plans off, every fast launch's specialization key checked
#      (OPFORGE_CHECK_LAUNCH_KEYS=1)
#   2. the tests that launch kernels (tests/ops, tests/runtime, tests/hardening, tests/models) as
#      users get them: the default launch paths (plans on unless OPFORGE_PLANS=0), no key check
# then `opforge verify` (every op, every backend here, vs float64).
# Emulator-only tests (marker `emulator`: tests/metal, tests/fusion/test_metal_emulated.py) are
# left out: they run the MSL emulator on the CPU, which a GPU does not change; CI runs them.
# Uses the python3 that has torch with CUDA (no venv: the GPU machine's own torch and triton).
#   bash scripts/gpu_test.sh            # logs to $OUT (or ./gpu-test-logs)
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT:-$PWD/gpu-test-logs}"
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" -c "import torch, triton, sys; assert torch.cuda.is_available(), 'no CUDA GPU here';
print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" || exit 2
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rfE -m "not emulator")
status=0
start=$SECONDS
OPFORGE_PLANS=0 OPFORGE_CHECK_LAUNCH_KEYS=1 timeout -k 5 240 "${PYTEST[@]}" tests > "$LOGS/pytest_keys.log" 2>&1
rc=$?; [ $rc -ne 0 ] && status=1
echo "pass 1 (plans off, launch keys checked): exit $rc  $(tail -n 1 "$LOGS/pytest_keys.log")"
timeout -k 5 150 "${PYTEST[@]}" tests/ops tests/runtime tests/hardening tests/models > "$LOGS/pytest_default.log" 2>&1
rc=$?; [ $rc -ne 0 ] && status=1
echo "pass 2 (default launch paths):           exit $rc  $(tail -n 1 "$LOGS/pytest_default.log")"
timeout -k 5 90 "$PY" -m opforge verify > "$LOGS/verify.log" 2>&1
rc=$?; [ $rc -ne 0 ] && status=1
echo "opforge verify:                          exit $rc  $(tail -n 1 "$LOGS/verify.log")"
echo "gpu_test.sh: $((SECONDS - start)) s, $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
