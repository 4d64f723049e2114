#!/usr/bin/env bash
# Checks for a lent GPU (the bench is benchmarks/run_h100.sh); logs go to $OUT:
#   1. the shift/plans probe (benchmarks/shift_and_plans_probe.py)          ~4 min
#   2. the test suite with launch plans on, as users with OPFORGE_PLANS=1 get it   ~5 min
#   3. the test suite with every fast launch's key checked, then `opforge verify`  ~6 min
# Each step is time-boxed; a device-tool call has 10 minutes, so use two calls:
#   run(command="STEPS=1,2 bash benchmarks/gpu_checks.sh", timeout_s=600)
#   run(command="STEPS=3 bash benchmarks/gpu_checks.sh", timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/checks-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
STEPS=",${STEPS:-1,2},"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -x tests)

if [[ $STEPS == *,1,* ]]; then
  timeout -k 5 240 "$PY" benchmarks/shift_and_plans_probe.py --quick --out "$OUT" > "$OUT/probe.log" 2>&1
  echo "probe exit $?"; tail -n 45 "$OUT/probe.log"
fi
if [[ $STEPS == *,2,* ]]; then
  OPFORGE_PLANS=1 timeout -k 5 330 "${PYTEST[@]}" > "$OUT/pytest_plans.log" 2>&1
  echo "tests with plans exit $?"; tail -n 3 "$OUT/pytest_plans.log"
fi
if [[ $STEPS == *,3,* ]]; then
  OPFORGE_CHECK_LAUNCH_KEYS=1 timeout -k 5 400 "${PYTEST[@]}" > "$OUT/pytest_keys.log" 2>&1
  echo "tests with key checks exit $?"; tail -n 3 "$OUT/pytest_keys.log"
  OPFORGE_CHECK_LAUNCH_KEYS=1 timeout -k 5 120 "$PY" -m opforge verify > "$OUT/verify.log" 2>&1
  echo "verify exit $?"; tail -n 1 "$OUT/verify.log"
fi
