#!/bin/bash
# round 3: served defaults (read-ahead from the engine, codec streams at high priority):
# presets at c=1, 64/128/256 streams with py-spy at 256
OUT=${OUT:?}
RUN_TAG=r3 BUDGET_S=565 PHASE=gateway OUT=$OUT LEVELS=64,128,256 HTTP_LEVELS= SWEEP_DURATION=15 \
  PROFILE_LEVELS=256 bash bench/gpu/run_h200.sh > $OUT/run_r3.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r3.log | grep -v "^|" | tail -22
rm -f $OUT/*.png; gzip -f $OUT/run_r3.log; ls -la $OUT
