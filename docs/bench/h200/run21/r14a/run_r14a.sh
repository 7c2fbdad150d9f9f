#!/bin/bash
# round 14a: the defaults with the codec's TF32 products and packed state writes (0fb5776), on empty caches:
# presets latency/exact at one stream, then 64/128/256 streams
# Called (right after the vLLM kit install) as: BUDGET_S=555 bash run_r14a.sh
OUT=${OUT:?}
RUN_TAG=r14a SERVE_ARGS="" BUDGET_S=${BUDGET_S:-555} START_TIMEOUT=420 PHASE=gateway OUT=$OUT PRESETS=latency,exact LEVELS=${LEVELS:-64,128,256} HTTP_LEVELS= \
  SWEEP_DURATION=15 PROFILE_LEVELS=${PROFILE_LEVELS:-} bash bench/gpu/run_h200.sh > $OUT/run_r14a.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r14a.log | grep -v "^|" | tail -22
grep -h "torch.compile took\|compiled the codec\|captured the codec\|ready in" /root/h200_work/results_r14a/server_*.log 2>/dev/null | cut -c1-220 | head -12 | tee $OUT/cold_start.txt
rm -f $OUT/*.png; gzip -f $OUT/run_r14a.log; ls -la $OUT
