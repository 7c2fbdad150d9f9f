#!/bin/bash
# round 14m: 0fb5776, fourth start on R14a's machine (every cache warm): 128 streams only. Called right after R14n.
RUN_TAG=r14m SERVE_ARGS="" BUDGET_S=170 START_TIMEOUT=150 PHASE=gateway PRESETS=, LEVELS=128 HTTP_LEVELS= \
  SWEEP_DURATION=15 PROFILE_LEVELS= bash bench/gpu/run_h200.sh > $OUT/run_r14m.log 2>&1
