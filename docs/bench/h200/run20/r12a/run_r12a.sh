#!/bin/bash
# round 12a: the defaults (first chunks ahead at small batches): presets latency/exact, 64/128/256, py-spy at 256
# Called (after the vLLM kit install, right after R12b on the same machine) as: BUDGET_S=560 bash run_r12a.sh
OUT=${OUT:?}
RUN_TAG=r12a SERVE_ARGS="" BUDGET_S=${BUDGET_S:-560} START_TIMEOUT=420 PHASE=gateway OUT=$OUT PRESETS=latency,exact LEVELS=${LEVELS:-64,128,256} HTTP_LEVELS= \
  SWEEP_DURATION=15 PROFILE_LEVELS=256 bash bench/gpu/run_h200.sh > $OUT/run_r12a.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r12a.log | grep -v "^|" | tail -22
rm -f $OUT/*.png; gzip -f $OUT/run_r12a.log; ls -la $OUT
