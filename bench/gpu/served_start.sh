#!/bin/bash
# One served start on the GPU machine (after the vLLM kit and PHASE=prep, README.md calls 1-10):
# the presets at one stream, then LEVELS (64,128,256) closed-loop streams, WebSocket Opus, 10 s a
# stream. TAG names the start; SERVE_ARGS and TALKER_OPTIONS are the variant's flags (empty: the
# defaults). Prints the summary's stages and the engine's start-up lines (compile, codec
# warm-up, the float16 check); leaves the summary, the archive and the gzipped logs in $OUT.
OUT=${OUT:?}
TAG=${TAG:?}
RUN_TAG=$TAG SERVE_ARGS="${SERVE_ARGS:-}" TALKER_OPTIONS="${TALKER_OPTIONS:-}" \
  BUDGET_S=${BUDGET_S:-450} START_TIMEOUT=${START_TIMEOUT:-300} PHASE=gateway \
  PRESETS=${PRESETS:-latency,exact} LEVELS=${LEVELS:-64,128,256} HTTP_LEVELS= SWEEP_DURATION=15 \
  PROFILE_LEVELS= bash bench/gpu/run_h200.sh > "$OUT/run_$TAG.log" 2>&1
echo "rc=$?"; grep -v "^\s*$" "$OUT/run_$TAG.log" | grep -v "^|" | tail -22
grep -h "torch.compile took\|the codec\|the code sampler\|ready in\|float16 is" \
  "/root/h200_work/results_$TAG/server_"*.log 2>/dev/null | cut -c1-200 | head
# Keep what comes back small (the machine goes back 30 s after a call): every level's
# figures without the per-stream lists, and the archive without the sweeps' raw JSON.
RES=/root/h200_work/results_$TAG
# The server log first: it says where a start went (compiles, captures, warm-ups).
cat "$RES"/server_*.log 2>/dev/null | gzip > "$OUT/server_$TAG.log.gz"
python3 -m bench.gpu.report levels "$RES" > "$OUT/levels_$TAG.json" 2>> "$OUT/run_$TAG.log"
tar -czf "$OUT/h200_$TAG.tar.gz" --exclude='sweep_c*.json' --exclude='*.png' \
  -C "$(dirname "$RES")" "$(basename "$RES")" 2>/dev/null
rm -f "$OUT"/*.png; gzip -f "$OUT/run_$TAG.log"; ls -la "$OUT"
