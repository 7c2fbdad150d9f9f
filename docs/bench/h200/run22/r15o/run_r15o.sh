#!/bin/bash
# round 15o: the tree before (aa02d47's codec_slots.py, slot_codec.py, vllm_audio.py), second start on R15n's
# machine: 64 and 256 streams. Called right after R15n.
OUT=${OUT:?}
RUN_TAG=r15o SERVE_ARGS="" BUDGET_S=${BUDGET_S:-560} START_TIMEOUT=360 PHASE=gateway OUT=$OUT PRESETS=, \
  LEVELS=${LEVELS:-64,128} HTTP_LEVELS= SWEEP_DURATION=15 PROFILE_LEVELS= bash bench/gpu/run_h200.sh > $OUT/run_r15o.log 2>&1
echo "rc=$?"; grep -v "^\s*$" $OUT/run_r15o.log | grep -v "^|" | tail -22
grep -h "torch.compile took\|compiled the codec\|captured the codec\|ready in" /root/h200_work/results_r15o/server_*.log 2>/dev/null | cut -c1-220 | head -12 | tee $OUT/cold_start.txt
gzip -f $OUT/run_r15o.log; ls -la $OUT
