#!/bin/bash
# round 4: served defaults (contexts read in step, codec streams at normal priority):
# presets at c=1, 64/128/256 streams
OUT=${OUT:?}
RUN_TAG=r4 BUDGET_S=400 PHASE=gateway OUT=$OUT LEVELS=64,128,256 HTTP_LEVELS= SWEEP_DURATION=15 \
  PROFILE_LEVELS= bash bench/gpu/run_h200.sh > $OUT/run_r4.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r4.log | grep -v "^|" | tail -22
rm -f $OUT/*.png; gzip -f $OUT/run_r4.log; ls -la $OUT
