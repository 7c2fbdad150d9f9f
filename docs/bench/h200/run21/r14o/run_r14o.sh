#!/bin/bash
# round 14o: the tree before the change (75d8fba's codec), second start on R14a's machine (vLLM's caches warm,
# the codec compiled afresh): presets at one stream, then 64 and 256 streams. Called right after R14a.
RUN_TAG=r14o SERVE_ARGS="" BUDGET_S=420 START_TIMEOUT=360 PHASE=gateway PRESETS= LEVELS=64,256 HTTP_LEVELS= \
  SWEEP_DURATION=15 PROFILE_LEVELS= bash bench/gpu/run_h200.sh > $OUT/run_r14o.log 2>&1
