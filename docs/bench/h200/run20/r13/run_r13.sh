#!/bin/bash
# round 13: the defaults at one stream (first chunks ahead, earlier frames waiting for their own steps): presets latency/exact, then the served engine core traced for 1 s at c=1
# Called (after the vLLM kit install, on empty caches) as: BUDGET_S=560 bash run_r13.sh
OUT=${OUT:?}
RUN_TAG=r13 START_TIMEOUT=480 SERVE_ARGS="" BUDGET_S=${BUDGET_S:-560} PHASE=gateway OUT=$OUT PRESETS=latency,exact LEVELS=1 SWEEP_WARMUP=3 SWEEP_DURATION=5 AUDIO_SECONDS=2 \
  SWEEP_SESSION='{"output": {"frame_ms": 20}, "latency_preset": "latency", "max_audio_seconds": 2}' \
  HTTP_LEVELS= PROFILE_LEVELS= SERVED_TRACE=1 TRACE_S=1 bash bench/gpu/run_h200.sh > $OUT/run_r13.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r13.log | grep -v "^|" | tail -22
grep -h "torch.compile took\|compiled the codec\|captured the codec\|ready in" /root/h200_work/results_r13/server_*.log 2>/dev/null | cut -c1-220 | head -12 | tee $OUT/cold_start.txt
rm -f $OUT/*.png; gzip -f $OUT/run_r13.log; ls -la $OUT
