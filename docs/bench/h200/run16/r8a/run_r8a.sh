#!/bin/bash
# round 8a: the defaults (codec kernels auto = compiled on CUDA): presets latency/exact, 64/128/256, py-spy at 256
OUT=${OUT:?}
RUN_TAG=r8a BUDGET_S=565 START_TIMEOUT=420 PHASE=gateway OUT=$OUT PRESETS=latency,exact LEVELS=64,128,256 HTTP_LEVELS= \
  SWEEP_DURATION=15 PROFILE_LEVELS=256 bash bench/gpu/run_h200.sh > $OUT/run_r8a.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r8a.log | grep -v "^|" | tail -22
grep -i "compil\|captured the codec" /root/h200_work/results_r8a/server_*.log 2>/dev/null | head -5
rm -f $OUT/*.png; gzip -f $OUT/run_r8a.log; ls -la $OUT
