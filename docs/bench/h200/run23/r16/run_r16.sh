#!/bin/bash
# round 16: this tree (statuses and chunks through reused pinned buffers, the chunk cut in fewer kernels), first start
# on empty caches: presets latency/exact at one stream, then 64/128/256 streams. Called right after the vLLM kit.
OUT=${OUT:?}
RUN_TAG=r16 SERVE_ARGS="" BUDGET_S=${BUDGET_S:-560} START_TIMEOUT=420 PHASE=gateway OUT=$OUT PRESETS=latency,exact \
  LEVELS=${LEVELS:-64,128,256} HTTP_LEVELS= SWEEP_DURATION=15 PROFILE_LEVELS= bash bench/gpu/run_h200.sh > $OUT/run_r16.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r16.log | grep -v "^|" | tail -22
grep -h "torch.compile took\|compiled the codec\|captured the codec\|ready in" /root/h200_work/results_r16/server_*.log 2>/dev/null | cut -c1-220 | head -12 | tee $OUT/cold_start.txt
gzip -f $OUT/run_r16.log; ls -la $OUT
