#!/usr/bin/env bash
# Every GPU check in one run, one table at the end (issues 29 and 30). Meant for the device machine (one H200):
#     scripts/gpu-check.sh            # logs under $OUT (the device tool's folder) or artifacts/gpu-check
# Without a GPU every check reports "skipped" and the script exits 0, so it can be tried on a CPU machine first.
# Each check has its own time limit, so one hung check costs its limit, not the run.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
LOGS=${OUT:-artifacts/gpu-check}
mkdir -p "$LOGS"
ROWS=()

has_gpu() { "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }

# check NAME LIMIT_S COMMAND...: runs it, logs to $LOGS/NAME.log, adds a row (result, last figure line)
check() {
  local name=$1 limit=$2; shift 2
  local started=$SECONDS
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$? took=$((SECONDS - started)) result
  case $rc in
    0) result=ok ;;
    124) result="timed out (${limit} s)" ;;
    *) result="failed (rc $rc)" ;;
  esac
  local summary
  summary=$(grep -E "passed|failed|skipped|error" "$LOGS/$name.log" | tail -1 | cut -c1-90)
  ROWS+=("$name|$result|${took} s|${summary:-see $LOGS/$name.log}")
}

if has_gpu; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$LOGS/gpu.txt" 2>&1
  check engine-tests 300 "$PY" -m pytest -q -m gpu tests/unit/engine/test_gpu.py -rs
  check xtensor-tests 300 "$PY" -m pytest -q -m gpu tests/unit/xtensor -rs
  check engine-bench 300 "$PY" bench/engine.py --device cuda --shape qwen2-0.5b
  check xtensor-bench 300 "$PY" bench/xtensor.py --device cuda:0 --num-iters 2000
  check lifecycle-bench 300 "$PY" bench/lifecycle.py --device cuda --sections warm,fork --warm-mib 1024
else
  echo "no CUDA GPU here: every check is skipped" >"$LOGS/gpu.txt"
  for name in engine-tests xtensor-tests engine-bench xtensor-bench lifecycle-bench; do
    ROWS+=("$name|skipped|0 s|no CUDA GPU")
  done
fi

printf '\nGPU check on %s\n\n' "$(head -1 "$LOGS/gpu.txt")"
printf '| %-16s | %-22s | %-6s | %-90s |\n' check result time "summary (last line of the log)"
printf '|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..18})" "$(printf -- '-%.0s' {1..24})" "$(printf -- '-%.0s' {1..8})" \
  "$(printf -- '-%.0s' {1..92})"
failed=0
for row in "${ROWS[@]}"; do
  IFS='|' read -r name result took summary <<<"$row"
  printf '| %-16s | %-22s | %-6s | %-90s |\n' "$name" "$result" "$took" "$summary"
  case $result in ok|skipped) ;; *) failed=1 ;; esac
done
echo
echo "logs: $LOGS"
exit $failed
