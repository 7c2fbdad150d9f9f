#!/bin/bash
# round 10d: the compiled codec step at one stream, `latency` preset: presets, then the served engine core traced for 1 s at c=1
OUT=${OUT:?}
RUN_TAG=r10d SERVE_ARGS="--codec-kernels compiled" BUDGET_S=420 PHASE=gateway OUT=$OUT PRESETS=latency,exact LEVELS=1 SWEEP_WARMUP=3 SWEEP_DURATION=5 AUDIO_SECONDS=2 \
  SWEEP_SESSION='{"output": {"frame_ms": 20}, "latency_preset": "latency", "max_audio_seconds": 2}' \
  HTTP_LEVELS= PROFILE_LEVELS= SERVED_TRACE=1 TRACE_S=1 bash bench/gpu/run_h200.sh > $OUT/run_r10d.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r10d.log | grep -v "^|" | tail -22
rm -f $OUT/*.png; gzip -f $OUT/run_r10d.log; ls -la $OUT; du -sh /root/h200_work/results_r10d/served_trace 2>/dev/null; ls -la /root/h200_work/results_r10d/served_trace 2>/dev/null
