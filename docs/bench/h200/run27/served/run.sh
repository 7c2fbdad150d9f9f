#!/bin/bash
# One served start (after the vLLM kit and PHASE=prep, bench/gpu/README.md calls 1-10): the
# presets at one stream, then 64, 128 and 256 streams, as section 30's. VARIANT picks the codec:
# "base" (the defaults), "fp16" (--codec-precision fp16, which now takes the products itself) or
# "fp16autotune" (that, compiled with Inductor's max-autotune-no-cudagraphs). Run base and a
# variant in turn, each start after the first on warm caches (RESULTS.md sections 28 and 30).
OUT=${OUT:?}
VARIANT=${VARIANT:-base}
AUTOTUNE='{"engine_args": {"additional_config": {"higgs_codec": {"compile_mode": "max-autotune-no-cudagraphs"}}}}'
case $VARIANT in
  base) serve_args=""; options="" ;;
  fp16) serve_args="--codec-precision fp16"; options="" ;;
  fp16autotune) serve_args="--codec-precision fp16"; options=$AUTOTUNE ;;
  *) echo "unknown VARIANT $VARIANT (base, fp16, fp16autotune)" >&2; exit 2 ;;
esac
tag=r18_${VARIANT}_${START:-1}
RUN_TAG=$tag SERVE_ARGS="$serve_args" TALKER_OPTIONS="$options" BUDGET_S=${BUDGET_S:-450} \
  START_TIMEOUT=${START_TIMEOUT:-300} PHASE=gateway PRESETS=latency,exact LEVELS=${LEVELS:-64,128,256} \
  HTTP_LEVELS= SWEEP_DURATION=15 PROFILE_LEVELS= bash bench/gpu/run_h200.sh > "$OUT/run_$tag.log" 2>&1
echo "rc=$?"; grep -v "^\s*$" "$OUT/run_$tag.log" | grep -v "^|" | tail -22
grep -h "torch.compile took\|compiled the codec\|ready in\|float16 is" "/root/h200_work/results_$tag/server_"*.log \
  2>/dev/null | cut -c1-200 | head
rm -f "$OUT"/*.png; gzip -f "$OUT/run_$tag.log"; ls -la "$OUT"
