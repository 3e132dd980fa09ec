#!/usr/bin/env bash
# Every GPU figure of the README, on a lent GPU machine. Results go to benchmarks/results/ (commit them), logs to
# $OUT (or ./gpu_logs). Uses the checkout as is. On an H200 (2026-11-26) the steps took about 7 minutes in all: in two
# calls of the device tool's `run` (10 minutes a call), e.g.
#   bash scripts/gpu_round.sh gpu_check roofline capture guard
#   bash scripts/gpu_round.sh fit guard_host compiled calibrate roofline_calibrated
# (no argument: every step). Steps, each with its own time limit so that one slow step leaves the others' results:
#   1. scripts/gpu_check.py: capture cost, headline MFU, per-layer memory vs hooks, tensor cores, kernel times, NaN
#      guard syncs, compiled step after profiles, training unchanged by the callbacks;
#   2. roofline accuracy with the packaged kernel tables (what a user gets without calibrating);
#   3. capture cost per op; 4. the NaN guard in a GPU-bound fit (deferred, sync=True, detect_anomaly);
#   5. the callbacks' always-on cost in a fit and the automatic MFU; 6. the NaN guard's host time on a launch-bound
#      step; 7. the compiled step's profile (FLOPs eager vs compiled, attention calls listed);
#   8. tscope calibrate --gemm --quick (GEMMs as CUDA-graph replays, SDPA and memory-bound ops as kernel time),
#      then the roofline accuracy again with that calibration (log only: the committed table stays the packaged one's);
#   9. scripts/gpu_step_monitor.py: the step monitor's host and device parts, its verdicts and their witnesses (log only).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
LOG=${OUT:-./gpu_logs}
mkdir -p "$LOG"
export TSCOPE_CACHE_DIR=$(mktemp -d)
step() {  # step NAME SECONDS COMMAND...
    local name=$1 secs=$2; shift 2
    timeout "$secs" "$@" > "$LOG/$name.log" 2>&1
    echo "== $name rc=$?"; tail -n 20 "$LOG/$name.log"
    tar czf "$LOG/results.tgz" benchmarks/results
    [ -s "$TSCOPE_CACHE_DIR/gemm_tables.json" ] && cp "$TSCOPE_CACHE_DIR/gemm_tables.json" "$LOG/"
}
declare -A CMD=(
  [gpu_check]="260 python3 scripts/gpu_check.py"
  [roofline]="80 python3 benchmarks/roofline_accuracy.py --gpu --write"
  [capture]="100 python3 benchmarks/gpu_capture_overhead.py --runs 5 --write --cprofile $LOG/capture_cprofile.txt"
  [guard]="150 python3 benchmarks/gpu_nan_guard_overhead.py --runs 2 --write"
  [fit]="150 python3 benchmarks/gpu_fit_overhead.py --runs 3 --write"
  [guard_host]="120 python3 benchmarks/gpu_guard_host.py --runs 3 --write"
  [compiled]="150 python3 benchmarks/gpu_compiled_profile.py --runs 10 --write"
  [calibrate]="200 python3 -m tscope_callbacks.cli calibrate --gemm --quick"
  [roofline_calibrated]="80 python3 benchmarks/roofline_accuracy.py --gpu"
  [step_monitor]="120 python3 scripts/gpu_step_monitor.py"
)
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(gpu_check roofline capture guard fit guard_host compiled calibrate roofline_calibrated step_monitor)
for s in "${STEPS[@]}"; do
    if [ -z "${CMD[$s]:-}" ]; then echo "unknown step $s (one of: ${!CMD[*]})"; exit 2; fi
    [ "$s" = roofline_calibrated ] && [ ! -s "$TSCOPE_CACHE_DIR/gemm_tables.json" ] && echo "(roofline_calibrated: run calibrate first, in the same call)"
    step "$s" ${CMD[$s]}
done
