#!/bin/bash
# round 3b: the same tree with the codec streams at normal priority: presets at c=1 and 256 streams
OUT=${OUT:?}
RUN_TAG=r3b BUDGET_S=565 PHASE=gateway OUT=$OUT LEVELS=256 HTTP_LEVELS= SWEEP_DURATION=15 PROFILE_LEVELS= \
  TALKER_OPTIONS='{"engine_args": {"additional_config": {"higgs_codec": {"stream_priority": "normal"}}}}' \
  bash bench/gpu/run_h200.sh > $OUT/run_r3b.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r3b.log | grep -v "^|" | tail -22
rm -f $OUT/*.png; gzip -f $OUT/run_r3b.log; ls -la $OUT
