#!/bin/bash
# round 2: served defaults (the engine cores' step counters in /metrics), presets at c=1, 64/128/256
# streams with py-spy at 256, then a level of its own at 256 traced with vLLM's profiler
OUT=${OUT:?}
RUN_TAG=r2 BUDGET_S=565 PHASE=gateway OUT=$OUT LEVELS=64,128,256 HTTP_LEVELS= SWEEP_DURATION=15 \
  PROFILE_LEVELS=256 SERVED_TRACE=256 bash bench/gpu/run_h200.sh > $OUT/run_r2.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r2.log | grep -v "^|" | tail -22
rm -f $OUT/*.png; gzip -f $OUT/run_r2.log; ls -la $OUT
