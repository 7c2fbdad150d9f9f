#!/bin/bash
# round 6a: served defaults (one gateway process), presets at c=1, 64/128/256 streams, py-spy at 256
OUT=${OUT:?}
RUN_TAG=r6a BUDGET_S=560 PHASE=gateway OUT=$OUT LEVELS=64,128,256 HTTP_LEVELS= SWEEP_DURATION=15 \
  PROFILE_LEVELS=256 bash bench/gpu/run_h200.sh > $OUT/run_r6a.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r6a.log | grep -v "^|" | tail -22
rm -f $OUT/*.png; gzip -f $OUT/run_r6a.log; ls -la $OUT
