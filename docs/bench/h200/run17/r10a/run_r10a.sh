#!/bin/bash
# round 10a: the defaults (eager codec step), new tree: watcher, pinned index ring: presets latency/exact, 64/128/256, py-spy at 256
OUT=${OUT:?}
RUN_TAG=r10a SERVE_ARGS="" BUDGET_S=${BUDGET_S:-560} START_TIMEOUT=420 PHASE=gateway OUT=$OUT PRESETS=latency,exact LEVELS=${LEVELS:-64,128,256} HTTP_LEVELS= \
  SWEEP_DURATION=15 PROFILE_LEVELS=${PROFILE_LEVELS:-256} bash bench/gpu/run_h200.sh > $OUT/run_r10a.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r10a.log | grep -v "^|" | tail -22
grep -i "compil\|captured the codec" /root/h200_work/results_r10a/server_*.log 2>/dev/null | head -5
rm -f $OUT/*.png; gzip -f $OUT/run_r10a.log; ls -la $OUT
