#!/bin/bash
# round 11b: the defaults at one stream, `latency` preset: presets, then the served engine core traced for 1 s at c=1
# Called (after the vLLM kit install) as: export TORCHINDUCTOR_COMPILE_THREADS=16 (vLLM sets it back to 1 on import); BUDGET_S=570 bash run_r11b.sh
# (its first try, on empty caches, ran with the default START_TIMEOUT of 300 s: cold_start.txt)
OUT=${OUT:?}
RUN_TAG=r11b START_TIMEOUT=480 SERVE_ARGS="" BUDGET_S=${BUDGET_S:-420} PHASE=gateway OUT=$OUT PRESETS=latency,exact LEVELS=1 SWEEP_WARMUP=3 SWEEP_DURATION=5 AUDIO_SECONDS=2 \
  SWEEP_SESSION='{"output": {"frame_ms": 20}, "latency_preset": "latency", "max_audio_seconds": 2}' \
  HTTP_LEVELS= PROFILE_LEVELS= SERVED_TRACE=1 TRACE_S=1 bash bench/gpu/run_h200.sh > $OUT/run_r11b.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r11b.log | grep -v "^|" | tail -22
rm -f $OUT/*.png; gzip -f $OUT/run_r11b.log; ls -la $OUT
