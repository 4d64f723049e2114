#!/usr/bin/env bash
# One device-tool call that runs several GPU check scripts, each time-boxed, and packs what they
# wrote into few files (the device tool returns at most 8):
#   $OUT/round.log        every script's output, in order
#   $OUT/results.tar.gz   every JSON/PNG/log the scripts wrote (one folder per script)
# Usage:  CHECKS="attn quant rope" SECONDS_EACH=100 bash benchmarks/gpu_round.sh
#   (runs benchmarks/gpu_check_<name>.py for each name; "gpu_test" runs scripts/gpu_test.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-round-out}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
EACH="${SECONDS_EACH:-100}"
for name in ${CHECKS:?name the checks}; do
  mkdir -p "$WORK/$name"
  echo "=== $name ($(date +%T))" | tee -a "$OUT/round.log"
  if [ "$name" = gpu_test ]; then
    OUT="$WORK/$name" timeout -k 5 "$EACH" bash scripts/gpu_test.sh >> "$OUT/round.log" 2>&1
  else
    OUT="$WORK/$name" timeout -k 5 "$EACH" "$PY" "benchmarks/gpu_check_$name.py" >> "$OUT/round.log" 2>&1
  fi
  echo "=== $name exit $?" | tee -a "$OUT/round.log"
done
tar -czf "$OUT/results.tar.gz" -C "$WORK" .
