#!/bin/bash
# round 7: the defaults (the vLLM talker now gets two gateway workers): presets at c=1, 64/128/256, py-spy at 256
OUT=${OUT:?}
RUN_TAG=r7 BUDGET_S=370 PHASE=gateway OUT=$OUT LEVELS=64,128,256 HTTP_LEVELS= SWEEP_DURATION=15 \
  PROFILE_LEVELS=256 bash bench/gpu/run_h200.sh > $OUT/run_r7.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r7.log | grep -v "^|" | tail -22
rm -f $OUT/*.png; gzip -f $OUT/run_r7.log; ls -la $OUT
