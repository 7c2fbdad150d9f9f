#!/bin/bash
# round 10b: the same tree with the compiled codec step, same machine: presets latency/exact, 64/128/256, py-spy at 256
OUT=${OUT:?}
RUN_TAG=r10b SERVE_ARGS="--codec-kernels compiled" BUDGET_S=${BUDGET_S:-560} START_TIMEOUT=420 PHASE=gateway OUT=$OUT PRESETS=latency,exact LEVELS=${LEVELS:-64,128,256} HTTP_LEVELS= \
  SWEEP_DURATION=15 PROFILE_LEVELS=${PROFILE_LEVELS:-256} bash bench/gpu/run_h200.sh > $OUT/run_r10b.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r10b.log | grep -v "^|" | tail -22
grep -i "compil\|captured the codec" /root/h200_work/results_r10b/server_*.log 2>/dev/null | head -5
rm -f $OUT/*.png; gzip -f $OUT/run_r10b.log; ls -la $OUT
