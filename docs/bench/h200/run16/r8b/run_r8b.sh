#!/bin/bash
# round 8b: the same with the eager codec step (the previous default), same machine
OUT=${OUT:?}
RUN_TAG=r8b SERVE_ARGS="--codec-kernels eager" BUDGET_S=500 PHASE=gateway OUT=$OUT PRESETS=latency,exact LEVELS=64,128,256 \
  HTTP_LEVELS= SWEEP_DURATION=15 PROFILE_LEVELS= bash bench/gpu/run_h200.sh > $OUT/run_r8b.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r8b.log | grep -v "^|" | tail -22
rm -f $OUT/*.png; gzip -f $OUT/run_r8b.log; ls -la $OUT
