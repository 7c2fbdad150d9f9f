#!/usr/bin/env bash
# stack_dumps.sh -- py-spy stack dumps of the serving processes (the gateway and its vLLM engine
# cores), every INTERVAL seconds, COUNT times, appended to FILE: what each thread is doing when a run
# stalls. Run it in the background beside bench/gpu/run_h200.sh.
#
#   PY_SPY=/path/to/py-spy FILE=$OUT/stacks.txt INTERVAL=15 COUNT=20 bash bench/gpu/stack_dumps.sh &
#   NATIVE=1: native frames too (which CUDA call a thread waits in: a hung kernel shows as
#   cudaEventSynchronize / cudaStreamSynchronize under the Python frame that waits for it)
set -u
PY_SPY=${PY_SPY:-py-spy}
FILE=${FILE:-/tmp/stacks.txt}
INTERVAL=${INTERVAL:-15}
COUNT=${COUNT:-20}
NATIVE=${NATIVE:-0}
FLAGS=()
[ "$NATIVE" = 1 ] && FLAGS+=(--native)
mkdir -p "$(dirname "$FILE")"
for i in $(seq 1 "$COUNT"); do
  sleep "$INTERVAL"
  for pid in $(pgrep -f "gateway.cli serve"); do
    for p in "$pid" $(pgrep -P "$pid"); do
      { echo "### $(date -u +%T) pid $p: $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-120)"
        timeout 20 "$PY_SPY" dump "${FLAGS[@]}" --pid "$p" 2>&1; } >> "$FILE"
    done
  done
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader >> "$FILE" 2>&1
done
