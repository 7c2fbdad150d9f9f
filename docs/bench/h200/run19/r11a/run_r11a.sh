#!/bin/bash
# round 11a: the defaults (compiled step and compiled tails): presets latency/exact, 64/128/256, py-spy at 256, the served engine traced at 256
# Called (after the vLLM kit install, right after R11b on the same machine) as: BUDGET_S=565 bash run_r11a.sh
OUT=${OUT:?}
RUN_TAG=r11a SERVE_ARGS="" BUDGET_S=${BUDGET_S:-560} START_TIMEOUT=420 PHASE=gateway OUT=$OUT PRESETS=latency,exact LEVELS=${LEVELS:-64,128,256} HTTP_LEVELS= \
  SWEEP_DURATION=15 PROFILE_LEVELS=256 SERVED_TRACE=256 TRACE_S=1 bash bench/gpu/run_h200.sh > $OUT/run_r11a.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r11a.log | grep -v "^|" | tail -22
grep -i "compil\|captured the codec" /root/h200_work/results_r11a/server_*.log 2>/dev/null | head -5
rm -f $OUT/*.png; gzip -f $OUT/run_r11a.log; ls -la $OUT
