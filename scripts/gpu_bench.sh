#!/usr/bin/env bash
# Op-table suites on a GPU, measured in one process, results written to $OUT, a compact summary
# printed last. Every suite and the command that reproduces each published number:
# docs/performance.md, "Reproducing the numbers".
#
#   OUT=/tmp/bench [OPFORGE_COMMIT=<sha>] bash scripts/gpu_bench.sh   (OPFORGE_COMMIT: where the tree has no .git)
#   OUT=/tmp/bench BENCH_SUITES=attention,quant,decode_gemv bash scripts/gpu_bench.sh
#
# Files written to $OUT, each well under 16 MiB:
#   results.json  every number + device, driver, torch/triton versions, date
#   results.md    the tables (commit as benchmarks/results/<device>/<date>-<commit>/results.md)
#   bandwidth-<suite>.png  one plot per suite
#   bench.log     full tables and one progress line per case
#
# Budget: measuring stops starting new cases after BENCH_MAX_SECONDS (default 400 s; the
# rest is reported as "skipped", never dropped) and the whole run is killed at 540 s, so it
# ends inside 9 minutes whatever happens. seed,llm,latency (the default) take about 4-5 minutes
# on an H100. BENCH_SUITES picks op-table suites (`opforge bench --list`; the end-to-end suites
# model, serve, io and torch_path_decode run on their own, see docs/performance.md); BENCH_ARGS
# adds options (a smoke test without a GPU: BENCH_ARGS="--device cpu --quick --shapes 2x64").
# Liger-Kernel is optional: if .whl/ holds its wheel (pure Python), it is installed into
# /tmp/site first; without it Liger is reported absent.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/bench-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
LOG="$OUT/bench.log"
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" > /dev/null; then
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
       --target /tmp/site .whl/*.whl; then
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "warning: installing .whl/*.whl failed; Liger-Kernel will be reported absent"
  fi
fi
# The working tree's opforge, not any installed copy.
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

{
  echo "== $(date -u +%FT%TZ) opforge bench on $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv 2> /dev/null || echo "(nvidia-smi unavailable)"
} > "$LOG"

timeout -k 10 540 "$PY" -m opforge.bench \
  --suite "${BENCH_SUITES:-seed,llm,latency}" \
  --max-seconds "${BENCH_MAX_SECONDS:-400}" \
  --progress lines \
  --json "$OUT/results.json" \
  --markdown "$OUT/results.md" \
  --plot "$OUT/bandwidth.png" \
  ${BENCH_ARGS:-} \
  >> "$LOG" 2>&1
rc=$?

echo "bench exit code: $rc (0 ok; 1 an opforge result was wrong or failed; 2 bad arguments; 124 killed at 540 s)"
if [ -s "$OUT/results.json" ]; then
  "$PY" -m opforge.bench --from-json "$OUT/results.json" --compact
else
  echo "no results.json; end of $LOG:"
  tail -n 40 "$LOG"
fi
ls -l "$OUT"
exit $rc
