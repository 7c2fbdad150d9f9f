#!/bin/bash
# round 14n: 0fb5776 again, third start on R14a's machine (every cache warm): presets at one stream,
# then 64 and 256 streams. Called right after R14o.
RUN_TAG=r14n SERVE_ARGS="" BUDGET_S=380 START_TIMEOUT=300 PHASE=gateway PRESETS= LEVELS=64,256 HTTP_LEVELS= \
  SWEEP_DURATION=15 PROFILE_LEVELS= bash bench/gpu/run_h200.sh > $OUT/run_r14n.log 2>&1
