#!/bin/bash
# call 10: served defaults. presets at c=1 (edge graphs), 64/128/256 streams, at 256 a device trace of
# the served engine core and py-spy of both processes, then 256 streams again without the cut
OUT=${OUT:?}
RUN_TAG=r1 BUDGET_S=580 PHASE=gateway OUT=$OUT LEVELS=64,128,256 HTTP_LEVELS= SWEEP_DURATION=15 \
  PROFILE_LEVELS=256 SERVED_TRACE=256 SWEEP_B_LEVELS=256 bash bench/gpu/run_h200.sh > $OUT/run_r1.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r1.log | grep -v "^|" | tail -30
rm -f $OUT/*.png; gzip -f $OUT/run_r1.log; ls -la $OUT
